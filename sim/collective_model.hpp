#pragma once
// Collective cost model after NCCL's (src/graph/tuning.cc, REFERENCE.md §4): for each
// (algorithm ∈ ring, tree, NVLS; protocol ∈ LL, LL128, Simple) a latency plus bytes over a
// bandwidth, with per-hop latencies and per-channel bandwidth caps; the minimum wins.
// Rank groups spanning nodes use the two-level structure NCCL builds.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/units.hpp"
#include "sim/cluster.hpp"
#include "zero/program.hpp"

namespace zp::sim {

enum class Algo { ring, tree, nvls, collnet, p2p };  // p2p: all-to-all as concurrent send/recv
enum class Proto { ll, ll128, simple };
const char* algo_name(Algo a);
const char* proto_name(Proto p);

struct CollectiveCost {
  Seconds time{};
  Algo algo = Algo::ring;
  Proto proto = Proto::simple;
  BytesPerSecond algbw{};            // S / t
  BytesPerSecond busbw{};            // nccl-tests normalisation
  bool measured = false;             // from the cluster's measured curve, not the model
};

class CollectiveModel {
 public:
  explicit CollectiveModel(const ClusterSpec& cluster);

  // Time of one collective over `ranks` (global rank ids) moving `total` bytes: the full
  // logical buffer as in zero::Event::elements × dtype size (nccl-tests' S).
  CollectiveCost cost(zero::CollKind kind, const std::vector<int>& ranks, Bytes total) const;
  // nccl-tests busbw factor: 2(n-1)/n all-reduce, (n-1)/n RS/AG/A2A, 1 broadcast/reduce.
  static double busbw_factor(zero::CollKind kind, int n);
  // The best protocol of one algorithm, ignoring measured curves; nullopt when the
  // algorithm does not apply (NVLS off Hopper NVSwitch, tree for all-gather, ...).
  std::optional<CollectiveCost> cost_for(zero::CollKind kind, const std::vector<int>& ranks, Bytes total,
                                         Algo algo) const;
  // Every (algorithm, protocol) the model considers, with its time; for explanations.
  std::vector<CollectiveCost> candidates(zero::CollKind kind, const std::vector<int>& ranks, Bytes total) const;

  const ClusterSpec& cluster() const { return cluster_; }
  // The same cluster under other coefficients (calibration), sharing this model's topology.
  CollectiveModel with_coefficients(const CollectiveCoefficients& k) const;

 private:
  ClusterSpec cluster_;
  // Derived from the Boost.Graph topology at construction: bottleneck bandwidths and
  // hop latencies for intra-node and inter-node rings/trees.
  struct Derived;
  std::shared_ptr<const Derived> d_;
};

}  // namespace zp::sim
