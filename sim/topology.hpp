#pragma once
// A cluster built into a Boost.Graph: GPUs, NVSwitches, PCIe switches, CPUs (root
// complexes or host memory), NICs and the network fabric, joined by directed edges that
// carry a bandwidth per direction and a link class. From it, for a group of ranks: the
// rings a collective would use inside a node (packed greedily over residual link
// capacity, the way NCCL searches channels), their bottleneck bandwidth and link class,
// the all-to-all bottleneck, and the inter-node bandwidth each node can push through its
// NICs. The collective model (collective_model.cpp) turns these into times.
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "core/units.hpp"
#include "sim/cluster.hpp"

namespace zp::sim {

enum class VertexKind : std::uint8_t { gpu, nvswitch, pcie_switch, cpu, nic, network };
// The per-hop latency classes of NCCL's tuning model, plus host shared memory.
enum class LinkClass : std::uint8_t { nvlink, pcie, net, shm };
const char* vertex_kind_name(VertexKind k);
const char* link_class_name(LinkClass c);

struct TopoVertex {
  VertexKind kind = VertexKind::gpu;
  int node = -1;   // -1: the network fabric, shared by all nodes
  int index = 0;   // local index within its kind and node (GPU i of the node, NIC j, ...)
};

struct TopoEdge {
  LinkClass cls = LinkClass::pcie;
  int links = 1;               // parallel physical links (NVLinks between a pair)
  BytesPerSecond raw{};        // signalling rate per direction
  BytesPerSecond usable{};     // what a collective can move per direction (see topology.cpp)
  Seconds latency{};           // one hop of a small message (NCCL's LL per-hop latency)
  int id = 0;                  // dense edge index for per-edge arrays
};

using TopoGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, TopoVertex, TopoEdge>;
using TopoVertexId = TopoGraph::vertex_descriptor;
using TopoEdgeId = TopoGraph::edge_descriptor;

// Usable per-direction bandwidths, after NCCL's figures (src/graph/topo.h, topo.cc).
BytesPerSecond nvlink_usable_per_link(const std::string& arch, BytesPerSecond raw_per_link);
BytesPerSecond pcie_usable(int gen, int width);
BytesPerSecond pcie_raw(int gen, int width);
BytesPerSecond nic_usable(double gbps);
BytesPerSecond nic_raw(double gbps);

constexpr double kUnbounded = std::numeric_limits<double>::infinity();

// What a collective over one rank group sees of the topology.
struct GroupPlan {
  int ranks = 0;
  int nodes = 0;                // nodes the group spans
  int ranks_per_node = 0;       // most members on one node
  bool spans_nodes() const { return nodes > 1; }
  // Inside a node (the node with the slowest member set):
  BytesPerSecond intra_bw{kUnbounded};   // sum of the packed rings' bottlenecks, per direction
  int intra_rings = 0;                   // rings packed
  LinkClass intra_class = LinkClass::nvlink;  // slowest link class the rings cross
  int channels = 1;                      // NCCL channels: one per NVLink, 2 over PCIe, 1 in host memory
  BytesPerSecond a2a_bw{kUnbounded};     // per rank, all pairs at once inside the node
  bool nvswitch = false;                 // members share an NVSwitch (NVLS candidate)
  // Between nodes (0 when the group stays in one node):
  BytesPerSecond inter_bw{};             // per node, out through its NICs (capped by the members' PCIe)
  // One ring over the whole group: `intra_hops` edges inside nodes, `inter_hops` between.
  int intra_hops = 0;
  int inter_hops = 0;
  BytesPerSecond ring_bw{};              // min(intra_bw, inter_bw): the ring's bus bandwidth
  std::vector<int> ring;                 // global ranks in the order of the first ring
};

// Every node of a cluster is built alike, so the graph holds one node (node 0: its GPUs,
// switches, CPU and NICs) and the fabric they share; the other nodes are that node again.
// Building and planning therefore cost the levels of the topology and the size of a rank
// group, not the number of nodes or their pairs (65,536 nodes: tens of milliseconds).
class Topology {
 public:
  explicit Topology(const ClusterSpec& cluster);

  // One node and the fabric (see above).
  const TopoGraph& graph() const { return g_; }
  const ClusterSpec& cluster() const { return c_; }
  // The vertex of a global rank's GPU: its local GPU in the graph's node.
  TopoVertexId gpu_vertex(int rank) const;
  // Vertices of kind `k` in the whole cluster (the graph's node times the nodes, plus the fabric).
  std::size_t count(VertexKind k) const;

  // Route of a transfer between two GPUs of one node: NVLink first (also through another
  // GPU's NVLinks), else PCIe through switches and the root complex.
  std::vector<TopoEdgeId> route(int rank_a, int rank_b) const;

  // Plan for a group of distinct global ranks (each in [0, world_size)); cached per group
  // shape. Throws std::invalid_argument for an empty group, a repeated or out-of-range rank.
  GroupPlan plan(const std::vector<int>& ranks) const;

 private:
  struct LocalRings {
    BytesPerSecond bw{kUnbounded};
    int rings = 0;
    LinkClass cls = LinkClass::nvlink;
    BytesPerSecond a2a{kUnbounded};
    std::vector<int> order;  // local indices, first ring
  };
  LocalRings local_rings(const std::vector<int>& local) const;
  std::vector<TopoEdgeId> route_local(int a, int b) const;
  BytesPerSecond node_nic_bw() const;

  ClusterSpec c_;
  TopoGraph g_;
  std::vector<TopoVertexId> gpu_v_;     // per local GPU of the graph's node
  BytesPerSecond nic_bw_{};             // what a node pushes through its NICs
  int edges_ = 0;
  mutable std::mutex mu_;
  mutable std::map<std::vector<int>, LocalRings> ring_cache_;  // key: sorted local member set
};

}  // namespace zp::sim
