// NCCL-like collective cost model. For every (algorithm, protocol) that applies:
//
//   time = latency + S / algbw + min(φ · S / algbw, fill_max)
//
// latency: NCCL's base latency plus per-hop latencies by link class (src/graph/tuning.cc,
// REFERENCE.md §4); algbw: the ring's bus bandwidth from the topology (sim/topology.cpp)
// with NCCL's protocol factors and per-channel caps, converted to algorithm bandwidth as
// NCCL does; the last term is a pipeline warm-up: a message is cut into buffer steps per
// channel and per rank, and a ring needs a few of them in flight before every link is
// busy, which costs about φ of the transfer for mid-size messages and at most the time to
// push one buffer step through every ring step (fill_max). φ = 0.6 was fitted to the
// 8×A100 and 8×H200 measurements of REFERENCE.md §4; NCCL's own model (which it uses to
// choose, not to predict) has no such term and overestimates mid-size bandwidth by up to 60%.
// The minimum time over (algorithm, protocol) wins; measured curves in the cluster win over
// the model. docs/collectives.md lists the constants and what is not modelled.
#include "sim/collective_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

#include "sim/device.hpp"
#include "sim/topology.hpp"

namespace zp::sim {

namespace {

using zero::CollKind;

constexpr double kMicro = 1e-6;
constexpr double kGiga = 1e9;
constexpr int kLL = 0, kLL128 = 1, kSimple = 2;

// NCCL tuning constants (src/graph/tuning.cc), µs, {LL, LL128, Simple}.
constexpr double kBaseTree[3] = {6.8, 14.0, 8.4};
constexpr double kBaseRing[3] = {6.6, 14.0, 8.4};
struct HopLatency {
  double tree[3];
  double ring[3];
};
constexpr HopLatency kHopNvlink{{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
constexpr HopLatency kHopPcie{{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}};
constexpr HopLatency kHopNet{{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}};
constexpr double kNvlsLatency = 25.0;      // NVLink NVLS Simple, no base latency
constexpr double kNetOverhead = 1.0;       // per network post on x86 Intel (×3 for Simple)

// Bandwidth caps, GB/s: [architecture: Volta, Ampere, Hopper, Blackwell][nodes: 1, 2, >2].
// LL on one node depends on the GPU; across nodes on the CPU (x86 Intel assumed: row 0).
constexpr double kLlMaxBw[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}};
constexpr double kPerChRingLL128[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {40, 40, 40}};
constexpr double kPerChTreeLL128[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double kPerChTree[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};
// NVLS: NCCL's efficiency (Hopper 0.85, Blackwell 0.74) times the fraction of it the
// switch's multimem reductions reach, fitted to 8×H200 all-reduce at 480 GB/s busbw.
constexpr double kNvlsEfficiency[4] = {0.0, 0.0, 0.85, 0.74};
constexpr double kNvlsSwitchFraction = 0.76;
constexpr int kNvlsChannels = 16;
constexpr double kNvlsChunk = 128 * 1024;  // NCCL_NVLS_CHUNKSIZE default

// Payload bytes of one buffer step per channel (src/init.cc default buffer sizes / NCCL_STEPS):
// LL 512 KiB of 16-byte lines, half payload; LL128 4.9 MB, 120 of 128 bytes; Simple 4 MiB.
constexpr double kStepBytes[3] = {32768.0, 614400.0 * 120.0 / 128.0, 524288.0};
// φ (fitted, see the header comment) is CollectiveCoefficients::fill_fraction, 0.6 by default.
constexpr double kP2pPerPeer = 1.0;    // µs to post one peer's send/recv (assumption, uncalibrated)

int arch_index(const std::string& arch) {
  if (arch == "volta") return 0;
  if (arch == "ampere") return 1;
  if (arch == "hopper") return 2;
  if (arch == "blackwell") return 3;
  return -1;  // cpu
}

int log2i(int n) {
  int l = 0;
  while (n > 1) {
    n >>= 1;
    ++l;
  }
  return l;
}

struct Candidate {
  Algo algo = Algo::ring;
  Proto proto = Proto::simple;
  double latency_us = 0;
  double algbw = 0;        // B/s
  double fill_max_s = 0;   // cap of the warm-up term
  double plateau = 1;      // latency factor once the message fills every channel
  double plateau_bytes = std::numeric_limits<double>::infinity();
  // All-to-all across nodes: bytes leaving the node per byte of S, over the node's NICs.
  double time_per_byte = 0;  // when > 0, replaces 1 / algbw
};

double candidate_time(const Candidate& c, double bytes, double fill_fraction) {
  const double per_byte = c.time_per_byte > 0 ? c.time_per_byte : 1.0 / c.algbw;
  const double transfer = bytes * per_byte;
  const double lat = c.latency_us * kMicro * (bytes >= c.plateau_bytes ? c.plateau : 1.0);
  return lat + transfer + std::min(fill_fraction * transfer, c.fill_max_s);
}

}  // namespace

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::ring: return "ring";
    case Algo::tree: return "tree";
    case Algo::nvls: return "nvls";
    case Algo::collnet: return "collnet";
    case Algo::p2p: return "p2p";
  }
  return "?";
}

const char* proto_name(Proto p) {
  switch (p) {
    case Proto::ll: return "LL";
    case Proto::ll128: return "LL128";
    case Proto::simple: return "Simple";
  }
  return "?";
}

struct CollectiveModel::Derived {
  std::unique_ptr<Topology> topo;
  int arch = -1;
  mutable std::mutex mu;
  mutable std::map<std::vector<int>, GroupPlan> plans;

  GroupPlan plan(const std::vector<int>& ranks) const {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = plans.find(ranks); it != plans.end()) return it->second;
    }
    GroupPlan p = topo->plan(ranks);
    std::lock_guard<std::mutex> lock(mu);
    if (plans.size() > 4096) plans.clear();
    plans.emplace(ranks, p);
    return p;
  }

  double hop(LinkClass cls, bool tree, int proto, const ClusterSpec& c) const {
    switch (cls) {
      case LinkClass::nvlink: return tree ? kHopNvlink.tree[proto] : kHopNvlink.ring[proto];
      case LinkClass::pcie: return tree ? kHopPcie.tree[proto] : kHopPcie.ring[proto];
      case LinkClass::net: return tree ? kHopNet.tree[proto] : kHopNet.ring[proto];
      case LinkClass::shm: return c.shm_latency.us();
    }
    return 0;
  }

  std::vector<Candidate> build(CollKind kind, const GroupPlan& p, const ClusterSpec& c) const;
};

std::vector<Candidate> CollectiveModel::Derived::build(CollKind kind, const GroupPlan& p, const ClusterSpec& c) const {
  std::vector<Candidate> out;
  const int n = p.ranks, nodes = p.nodes, ppn = p.ranks_per_node;
  const bool shm = p.intra_class == LinkClass::shm;
  const int a = std::max(arch, 0);
  const int i2 = nodes <= 2 ? nodes - 1 : 2;
  const int nch = std::max(1, p.channels);
  const double ll_max = kLlMaxBw[nodes == 1 ? a : 0][i2] * kGiga;
  // The calibrated factors (CollectiveCoefficients) of a level, algorithm and protocol.
  using CC = CollectiveCoefficients;
  const CC& k = c.collective;
  auto lat = [&](int level, Algo al, int pr) { return k.latency[CC::at(level, static_cast<int>(al), pr)]; };
  auto bwf = [&](int level, Algo al, int pr) { return k.bandwidth[CC::at(level, static_cast<int>(al), pr)]; };
  // The ring's bus bandwidth (the slower of the node's rings and its NICs) under the
  // factors of one algorithm and protocol.
  auto ring_bus = [&](Algo al, int pr) {
    double b = p.intra_bw.v * bwf(CC::intra, al, pr);
    if (nodes > 1) b = std::min(b, p.inter_bw.v * bwf(CC::inter, al, pr));
    return b;
  };
  const double base_scale = shm && nodes == 1 ? 0.0 : 1.0;  // host-memory rings have no kernel launch
  // Protocols NCCL enables: LL128 only over NVLink paths (and PCIe-switch-local NICs); host
  // memory uses plain copies.
  const bool ll128_ok = !shm && (p.intra_class == LinkClass::nvlink || ppn == 1) &&
                        (nodes == 1 || c.gpus_per_pcie_switch > 0 || a >= 2);
  auto proto_ok = [&](int pr) { return shm ? pr == kSimple : (pr != kLL128 || ll128_ok); };
  auto fill = [&](double steps, int pr, double bus) {
    return shm ? 0.0 : steps * kStepBytes[pr] / (bus / nch);
  };
  const double net_overhead = nodes > 1 ? kNetOverhead : 0.0;

  // Ring: all-reduce, reduce-scatter, all-gather, and the broadcast/reduce pipelines.
  if (kind != CollKind::all_to_all) {
    const bool ar = kind == CollKind::all_reduce;
    const bool chain = kind == CollKind::broadcast || kind == CollKind::reduce;
    const int nsteps = ar ? 2 * (n - 1) : n - 1;
    const int inter_steps = nodes == 1 ? 0 : ar ? 2 * (nodes - 1) : nodes - 1;
    const double ratio = chain ? 1.0 : static_cast<double>(n) / nsteps;
    for (int pr = 0; pr < 3; ++pr) {
      if (!proto_ok(pr)) continue;
      const double B = ring_bus(Algo::ring, pr);
      double bus = B;
      if (pr == kLL) bus = std::min(ll_max, 0.5 * B);
      if (pr == kLL128) bus = std::min(0.92 * B, nch * kPerChRingLL128[a][i2] * kGiga);
      double intra_lat = hop(p.intra_class, false, pr, c);
      if (nodes > 1) intra_lat = std::max(intra_lat, net_overhead * (pr == kSimple ? 3 : 1));
      const double inter_lat = hop(LinkClass::net, ppn == 1, pr, c);
      Candidate cd;
      cd.algo = Algo::ring;
      cd.proto = static_cast<Proto>(pr);
      cd.latency_us = (kBaseRing[pr] * base_scale + (nsteps - inter_steps) * intra_lat) * lat(CC::intra, Algo::ring, pr) +
                      inter_steps * inter_lat * lat(CC::inter, Algo::ring, pr);
      cd.algbw = bus * ratio;
      cd.fill_max_s = fill(nsteps, pr, bus);
      if (ar && pr == kSimple && nodes > 1) {  // NCCL's ring plateau once every channel has data
        cd.plateau = a < 1 ? 1.9 : 1.4;
        cd.plateau_bytes = 64.0 * nch * n;
      }
      out.push_back(cd);
    }
  }

  // Tree: all-reduce only; a chain inside each node and a binary tree across nodes.
  if (kind == CollKind::all_reduce && !shm) {
    for (int pr = 0; pr < 3; ++pr) {
      if (!proto_ok(pr)) continue;
      const double B = ring_bus(Algo::tree, pr);
      double bus = std::min(0.92 * B, nch * kPerChTree[a][i2] * kGiga);
      if (pr == kLL) bus = std::min(bus / 3.8, ll_max);
      if (pr == kLL128)
        bus = std::min(bus * (nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), nch * kPerChTreeLL128[a][i2] * kGiga);
      const double intra_lat = hop(p.intra_class, true, pr, c);
      const double inter_lat = hop(LinkClass::net, true, pr, c);
      const int depth = ppn - 1 + log2i(nodes);
      Candidate cd;
      cd.algo = Algo::tree;
      cd.proto = static_cast<Proto>(pr);
      cd.latency_us = (kBaseTree[pr] + 2 * (ppn - 1) * intra_lat) * lat(CC::intra, Algo::tree, pr) +
                      2 * log2i(nodes) * inter_lat * lat(CC::inter, Algo::tree, pr);
      cd.algbw = 0.5 * bus;
      cd.fill_max_s = fill(2.0 * depth, pr, bus);
      out.push_back(cd);
    }
  }

  // NVLS: NVSwitch multicast/reduction on Hopper and later, one node (multi-node NVLS needs
  // CollNet or NVLS-tree, not modelled).
  const bool nvls_kind = kind == CollKind::all_reduce || kind == CollKind::reduce_scatter || kind == CollKind::all_gather;
  if (nvls_kind && p.nvswitch && nodes == 1 && a >= 2 && arch >= 0 && n >= 2) {
    const double eff = kNvlsEfficiency[a] * kNvlsSwitchFraction;
    const bool ar = kind == CollKind::all_reduce;
    const int nsteps = ar ? 2 * (n - 1) : n - 1;
    double bus = p.intra_bw.v * eff * bwf(CC::intra, Algo::nvls, kSimple);
    Candidate cd;
    cd.algo = Algo::nvls;
    cd.proto = Proto::simple;
    cd.latency_us = kNvlsLatency * lat(CC::intra, Algo::nvls, kSimple);
    if (ar) {
      bus *= 2.0;  // reduce-scatter and all-gather halves pipelined through the switch
      cd.algbw = bus * n / nsteps;
    } else {
      bus *= static_cast<double>(ppn - 1) / ppn;
      cd.algbw = bus;
    }
    cd.fill_max_s = nsteps * kNvlsChunk / (bus / kNvlsChannels);
    out.push_back(cd);
  }

  // All-to-all: n-1 concurrent sends and receives per rank (NCCL's grouped p2p).
  if (kind == CollKind::all_to_all) {
    for (int pr : {kLL, kSimple}) {
      if (!proto_ok(pr)) continue;
      const double scale = pr == kLL ? 0.5 : 1.0;
      const double a2a = p.a2a_bw.v * scale * bwf(CC::intra, Algo::p2p, pr);
      Candidate cd;
      cd.algo = Algo::p2p;
      cd.proto = static_cast<Proto>(pr);
      const LinkClass far = nodes > 1 ? LinkClass::net : p.intra_class;
      cd.latency_us = (kBaseRing[pr] * base_scale + hop(far, false, pr, c) + (n - 1) * kP2pPerPeer) *
                      lat(nodes > 1 ? CC::inter : CC::intra, Algo::p2p, pr);
      // Per byte of S: the share sent inside the node over the all-pairs bandwidth, and the
      // node's share leaving it through the NICs, whichever takes longer.
      const double intra_share = static_cast<double>(std::max(ppn - 1, 0)) / n;
      double per_byte = std::isfinite(a2a) && a2a > 0 ? intra_share / a2a : 0.0;
      if (nodes > 1) {
        double inter = p.inter_bw.v * scale * bwf(CC::inter, Algo::p2p, pr);
        if (pr == kLL) inter = std::min(inter, ll_max);
        per_byte = std::max(per_byte, ppn * static_cast<double>(n - ppn) / n / inter);
      }
      cd.time_per_byte = per_byte;
      cd.algbw = 1.0 / per_byte;
      cd.fill_max_s = shm ? 0.0 : kStepBytes[pr] * nch * per_byte;
      out.push_back(cd);
    }
  }
  return out;
}

CollectiveModel::CollectiveModel(const ClusterSpec& cluster) : cluster_(cluster) {
  auto d = std::make_shared<Derived>();
  d->topo = std::make_unique<Topology>(cluster_);
  d->arch = arch_index(find_device(cluster_.gpu).arch);
  d_ = std::move(d);
}

CollectiveModel CollectiveModel::with_coefficients(const CollectiveCoefficients& k) const {
  CollectiveModel m = *this;  // shares the topology and its group plans
  m.cluster_.collective = k;
  return m;
}

double CollectiveModel::busbw_factor(zero::CollKind kind, int n) {
  if (n <= 1) return kind == CollKind::broadcast || kind == CollKind::reduce ? 1.0 : 0.0;
  switch (kind) {
    case CollKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollKind::reduce_scatter:
    case CollKind::all_gather:
    case CollKind::all_to_all: return static_cast<double>(n - 1) / n;
    case CollKind::broadcast:
    case CollKind::reduce: return 1.0;
  }
  return 1.0;
}

namespace {

CollectiveCost finish(const Candidate& cd, double t, zero::CollKind kind, int n, double bytes) {
  CollectiveCost out;
  out.time = Seconds{t};
  out.algo = cd.algo;
  out.proto = cd.proto;
  if (t > 0) {
    out.algbw = BytesPerSecond{bytes / t};
    out.busbw = BytesPerSecond{out.algbw.v * CollectiveModel::busbw_factor(kind, n)};
  }
  return out;
}

// Bus bandwidth of a measured curve at `bytes`, linear in log(size); below the first point
// the time of the first point (latency-bound), above the last its bandwidth.
std::optional<Seconds> measured_time(const MeasuredCurve& m, double bytes, double factor) {
  if (m.points.empty() || factor <= 0) return std::nullopt;
  auto time_at = [&](std::size_t i) {
    return static_cast<double>(m.points[i].first.v) * factor / m.points[i].second.v;
  };
  const auto& pts = m.points;
  if (bytes <= static_cast<double>(pts.front().first.v)) return Seconds{time_at(0)};
  if (bytes >= static_cast<double>(pts.back().first.v)) return Seconds{bytes * factor / pts.back().second.v};
  std::size_t hi = 1;
  while (static_cast<double>(pts[hi].first.v) < bytes) ++hi;
  const std::size_t lo = hi - 1;
  const double x0 = std::log(static_cast<double>(pts[lo].first.v)), x1 = std::log(static_cast<double>(pts[hi].first.v));
  const double w = (std::log(bytes) - x0) / (x1 - x0);
  const double bus = pts[lo].second.v + w * (pts[hi].second.v - pts[lo].second.v);
  const double t = bytes * factor / bus;
  return Seconds{std::clamp(t, time_at(lo), time_at(hi))};
}

}  // namespace

std::vector<CollectiveCost> CollectiveModel::candidates(zero::CollKind kind, const std::vector<int>& ranks,
                                                        Bytes total) const {
  std::vector<CollectiveCost> out;
  if (ranks.size() <= 1 || total.v <= 0) return out;
  const GroupPlan p = d_->plan(ranks);
  if (!(p.ring_bw.v > 0))
    throw std::invalid_argument("cluster '" + cluster_.name + "' gives this group no bandwidth (NICs of 0 Gb/s?)");
  const double bytes = static_cast<double>(total.v);
  for (const Candidate& cd : d_->build(kind, p, cluster_))
    out.push_back(finish(cd, candidate_time(cd, bytes, cluster_.collective.fill_fraction), kind, p.ranks, bytes));
  return out;
}

std::optional<CollectiveCost> CollectiveModel::cost_for(zero::CollKind kind, const std::vector<int>& ranks, Bytes total,
                                                        Algo algo) const {
  std::optional<CollectiveCost> best;
  for (const auto& c : candidates(kind, ranks, total))
    if (c.algo == algo && (!best || c.time < best->time)) best = c;
  return best;
}

CollectiveCost CollectiveModel::cost(zero::CollKind kind, const std::vector<int>& ranks, Bytes total) const {
  const int n = static_cast<int>(ranks.size());
  if (n <= 1 || total.v <= 0) {
    if (n > 1) (void)d_->plan(ranks);  // still validate the group
    return CollectiveCost{};
  }
  if (auto it = cluster_.measured.find(kind); it != cluster_.measured.end() && (it->second.ranks == 0 || it->second.ranks == n)) {
    (void)d_->plan(ranks);
    const double bytes = static_cast<double>(total.v);
    if (auto t = measured_time(it->second, bytes, busbw_factor(kind, n))) {
      CollectiveCost out = finish(Candidate{}, t->v, kind, n, bytes);
      out.measured = true;
      return out;
    }
  }
  std::optional<CollectiveCost> best;
  for (const auto& c : candidates(kind, ranks, total))
    if (!best || c.time < best->time) best = c;
  if (!best) throw std::logic_error("no collective algorithm applies");
  return *best;
}

}  // namespace zp::sim
