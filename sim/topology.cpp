// The cluster as a Boost.Graph and what a rank group's rings see of it.
//
// Usable bandwidths (what NCCL's search assumes a link moves, src/graph/topo.h):
//   NVLink: 20 GB/s per link per direction on Volta and Ampere, 20.6 on Hopper, 40.1 on
//           Blackwell, for links signalling 25 (NVLink2-4) or 50 GB/s (NVLink5); a link
//           of another rate is scaled by the same fraction.
//   PCIe:   width x per-lane rate / 80 GB/s with the per-lane rates (x100 Mb/s) NCCL
//           uses: Gen1 15, Gen2 30, Gen3 60, Gen4 120, Gen5 240, Gen6 480 (Gen3 x16 = 12).
//   NIC:    0.94 of the line rate: REFERENCE.md §4 measures 46-49 GB/s busbw per NDR
//           400 Gb/s NIC (50 GB/s line rate) and 85-96 GB/s for 4 x HDR 200 Gb/s.
#include "sim/topology.hpp"

#include <algorithm>
#include <numeric>
#include <queue>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "sim/device.hpp"

namespace zp::sim {

namespace {

constexpr double kGiga = 1e9;
constexpr double kMicro = 1e-6;
constexpr double kNicEfficiency = 0.94;
constexpr int kMaxRings = 32;
constexpr std::size_t kEnumerateUpTo = 8;  // members per node whose ring orders are all tried

}  // namespace

const char* vertex_kind_name(VertexKind k) {
  switch (k) {
    case VertexKind::gpu: return "gpu";
    case VertexKind::nvswitch: return "nvswitch";
    case VertexKind::pcie_switch: return "pcie_switch";
    case VertexKind::cpu: return "cpu";
    case VertexKind::nic: return "nic";
    case VertexKind::network: return "network";
  }
  return "?";
}

const char* link_class_name(LinkClass c) {
  switch (c) {
    case LinkClass::nvlink: return "nvlink";
    case LinkClass::pcie: return "pcie";
    case LinkClass::net: return "net";
    case LinkClass::shm: return "shm";
  }
  return "?";
}

BytesPerSecond nvlink_usable_per_link(const std::string& arch, BytesPerSecond raw_per_link) {
  // NCCL's per-link figure over the link's signalling rate (25 GB/s; 50 for NVLink5).
  double fraction = 20.0 / 25.0;                           // SM70, SM80
  if (arch == "hopper") fraction = 20.6 / 25.0;            // SM90
  if (arch == "blackwell") fraction = 40.1 / 50.0;         // SM100
  return BytesPerSecond{raw_per_link.v * fraction};
}

BytesPerSecond pcie_usable(int gen, int width) {
  static constexpr double kLane[] = {15, 30, 60, 120, 240, 480};  // x100 Mb/s per lane
  const int g = std::clamp(gen, 1, 6);
  return BytesPerSecond{width * kLane[g - 1] / 80.0 * kGiga};
}

BytesPerSecond pcie_raw(int gen, int width) {
  // GT/s per lane and line-code efficiency (8b/10b up to Gen2, 128b/130b after; Gen6 FLIT ~1).
  static constexpr double kGts[] = {2.5, 5, 8, 16, 32, 64};
  const int g = std::clamp(gen, 1, 6);
  const double code = g <= 2 ? 0.8 : g <= 5 ? 128.0 / 130.0 : 242.0 / 256.0;
  return BytesPerSecond{kGts[g - 1] * code * width / 8.0 * kGiga};
}

BytesPerSecond nic_raw(double gbps) { return BytesPerSecond{gbps / 8.0 * kGiga}; }
BytesPerSecond nic_usable(double gbps) { return BytesPerSecond{gbps / 8.0 * kGiga * kNicEfficiency}; }

Topology::Topology(const ClusterSpec& c) : c_(c) {
  const DeviceSpec& dev = find_device(c.gpu);
  if (c.nodes < 1 || c.gpus_per_node < 1) throw std::invalid_argument("cluster needs nodes >= 1 and gpus_per_node >= 1");
  auto vertex = [&](VertexKind k, int node, int index) { return boost::add_vertex(TopoVertex{k, node, index}, g_); };
  // Both directions of one physical connection; `hop` is split over the edges a hop crosses.
  auto connect = [&](TopoVertexId a, TopoVertexId b, LinkClass cls, int links, BytesPerSecond raw,
                     BytesPerSecond usable, Seconds hop) {
    boost::add_edge(a, b, TopoEdge{cls, links, raw, usable, hop, edges_++}, g_);
    boost::add_edge(b, a, TopoEdge{cls, links, raw, usable, hop, edges_++}, g_);
  };
  const BytesPerSecond gpu_pcie_raw = pcie_raw(c.pcie_gen, c.pcie_width);
  const BytesPerSecond gpu_pcie = pcie_usable(c.pcie_gen, c.pcie_width);
  const BytesPerSecond up_raw = pcie_raw(c.pcie_gen, 16);
  const BytesPerSecond up = pcie_usable(c.pcie_gen, 16);
  const BytesPerSecond link_raw = c.nvlink_bw_per_link;
  const BytesPerSecond link = nvlink_usable_per_link(dev.arch, c.nvlink_bw_per_link);
  const Seconds pcie_edge{0.25 * kMicro};  // GPU→switch→CPU→switch→GPU: 1 µs per hop
  const Seconds nvl_edge{0.3 * kMicro};    // GPU→NVSwitch→GPU: 0.6 µs per hop

  TopoVertexId network = boost::graph_traits<TopoGraph>::null_vertex();
  if (c.nics_per_node > 0) network = vertex(VertexKind::network, -1, 0);

  // Every node of a cluster is built alike, so the graph holds one of them (node 0) and the
  // fabric: the work and memory scale with the levels of the topology, not with the nodes.
  gpu_v_.reserve(static_cast<std::size_t>(c.gpus_per_node));
  {
    const int node = 0;
    const TopoVertexId cpu = vertex(VertexKind::cpu, node, 0);
    std::vector<TopoVertexId> gpus;
    for (int i = 0; i < c.gpus_per_node; ++i) {
      gpus.push_back(vertex(VertexKind::gpu, node, i));
      gpu_v_.push_back(gpus.back());
    }
    std::vector<TopoVertexId> switches;
    if (c.intra == IntraNode::shared_memory) {
      const Seconds half{c.shm_latency.v / 2};
      const BytesPerSecond shm = c.shm_bandwidth.v > 0 ? c.shm_bandwidth : BytesPerSecond{10 * kGiga};
      for (auto gv : gpus) connect(gv, cpu, LinkClass::shm, 1, shm, shm, half);
    } else {
      if (c.gpus_per_pcie_switch > 0) {
        const int n_sw = (c.gpus_per_node + c.gpus_per_pcie_switch - 1) / c.gpus_per_pcie_switch;
        for (int s = 0; s < n_sw; ++s) {
          switches.push_back(vertex(VertexKind::pcie_switch, node, s));
          connect(switches.back(), cpu, LinkClass::pcie, 1, up_raw, up, pcie_edge);
        }
        for (int i = 0; i < c.gpus_per_node; ++i)
          connect(gpus[static_cast<std::size_t>(i)], switches[static_cast<std::size_t>(i / c.gpus_per_pcie_switch)],
                  LinkClass::pcie, 1, gpu_pcie_raw, gpu_pcie, pcie_edge);
      } else {
        for (auto gv : gpus) connect(gv, cpu, LinkClass::pcie, 1, gpu_pcie_raw, gpu_pcie, Seconds{2 * pcie_edge.v});
      }
      // A spec without NVLink figures (links or rate 0) falls back to its PCIe links.
      const bool nvlink = link.v > 0;
      if (c.intra == IntraNode::nvswitch && nvlink && c.nvlinks_per_gpu > 0) {
        const TopoVertexId nvs = vertex(VertexKind::nvswitch, node, 0);
        const int l = c.nvlinks_per_gpu;
        for (auto gv : gpus)
          connect(gv, nvs, LinkClass::nvlink, l, BytesPerSecond{link_raw.v * l}, BytesPerSecond{link.v * l}, nvl_edge);
      } else if (c.intra == IntraNode::nvlink_mesh && nvlink) {
        for (int a = 0; a < c.gpus_per_node && a < static_cast<int>(c.nvlink_pairs.size()); ++a)
          for (const auto& [b, l] : c.nvlink_pairs[static_cast<std::size_t>(a)])
            if (a < b && b < c.gpus_per_node && l > 0)
              connect(gpus[static_cast<std::size_t>(a)], gpus[static_cast<std::size_t>(b)], LinkClass::nvlink, l,
                      BytesPerSecond{link_raw.v * l}, BytesPerSecond{link.v * l}, Seconds{2 * nvl_edge.v});
      }
    }
    for (int j = 0; j < c.nics_per_node; ++j) {
      const TopoVertexId nic = vertex(VertexKind::nic, node, j);
      const TopoVertexId parent =
          switches.empty() ? cpu : switches[static_cast<std::size_t>(j) * switches.size() / static_cast<std::size_t>(c.nics_per_node)];
      connect(nic, parent, LinkClass::pcie, 1, up_raw, up, pcie_edge);
      connect(nic, network, LinkClass::net, 1, nic_raw(c.nic_gbps), nic_usable(c.nic_gbps), Seconds{1.35 * kMicro});
    }
  }
  nic_bw_ = node_nic_bw();
}

TopoVertexId Topology::gpu_vertex(int rank) const {
  if (rank < 0 || rank >= c_.world_size())
    throw std::invalid_argument(fmt::format("rank {} outside [0, {})", rank, c_.world_size()));
  return gpu_v_[static_cast<std::size_t>(rank % c_.gpus_per_node)];
}

std::size_t Topology::count(VertexKind k) const {
  std::size_t per_node = 0, shared = 0;
  for (auto v : boost::make_iterator_range(boost::vertices(g_)))
    if (g_[v].kind == k) ++(g_[v].node < 0 ? shared : per_node);
  return per_node * static_cast<std::size_t>(c_.nodes) + shared;
}

// Dijkstra inside one node with link-class weights (NVLink and shared memory 1, PCIe 3);
// a path may pass through a GPU only along NVLinks (NCCL's NVB), never through a NIC.
std::vector<TopoEdgeId> Topology::route_local(int a, int b) const {
  constexpr int node = 0;  // the node the graph holds; every node routes alike
  const TopoVertexId src = gpu_vertex(a);
  const TopoVertexId dst = gpu_vertex(b);
  const std::size_t nv = boost::num_vertices(g_);
  // State: vertex x (arrived over NVLink?).
  const auto idx = [](TopoVertexId v, bool nvl) { return v * 2 + (nvl ? 1 : 0); };
  std::vector<double> dist(nv * 2, kUnbounded);
  std::vector<TopoEdgeId> via(nv * 2);
  std::vector<std::size_t> prev(nv * 2, static_cast<std::size_t>(-1));
  using Item = std::tuple<double, std::size_t, TopoVertexId, bool>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> q;
  std::size_t seq = 0;
  dist[idx(src, false)] = 0;
  q.emplace(0.0, seq++, src, false);
  std::size_t found = static_cast<std::size_t>(-1);
  while (!q.empty()) {
    const auto [d, s, v, nvl] = q.top();
    q.pop();
    if (d > dist[idx(v, nvl)]) continue;
    if (v == dst) {
      found = idx(v, nvl);
      break;
    }
    const TopoVertex& vv = g_[v];
    if (v != src && vv.kind == VertexKind::nic) continue;
    for (auto e : boost::make_iterator_range(boost::out_edges(v, g_))) {
      const TopoEdge& ed = g_[e];
      const TopoVertexId t = boost::target(e, g_);
      if (g_[t].node != node) continue;
      if (v != src && vv.kind == VertexKind::gpu && !(nvl && ed.cls == LinkClass::nvlink)) continue;
      const double w = ed.cls == LinkClass::pcie ? 3.0 : 1.0;
      const bool t_nvl = ed.cls == LinkClass::nvlink;
      if (d + w < dist[idx(t, t_nvl)]) {
        dist[idx(t, t_nvl)] = d + w;
        via[idx(t, t_nvl)] = e;
        prev[idx(t, t_nvl)] = idx(v, nvl);
        q.emplace(d + w, seq++, t, t_nvl);
      }
    }
  }
  if (found == static_cast<std::size_t>(-1))
    throw std::invalid_argument(fmt::format("no route between GPUs {} and {} of node {}", a, b, node));
  std::vector<TopoEdgeId> path;
  for (std::size_t s = found; s != idx(src, false); s = prev[s]) path.push_back(via[s]);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<TopoEdgeId> Topology::route(int rank_a, int rank_b) const {
  const int na = rank_a / c_.gpus_per_node, nb = rank_b / c_.gpus_per_node;
  (void)gpu_vertex(rank_a);
  (void)gpu_vertex(rank_b);
  if (na != nb) throw std::invalid_argument("route() is for GPUs of one node");
  if (rank_a == rank_b) return {};
  return route_local(rank_a % c_.gpus_per_node, rank_b % c_.gpus_per_node);
}

// Rings over a node's members, packed greedily: the ring order with the widest bottleneck
// (bandwidth / rings sharing each edge) over the residual capacity, then its bottleneck is
// taken out of every edge it uses, until no ring adds 1% of the first. Up to 8 members
// every order is tried; above, the members' natural order.
Topology::LocalRings Topology::local_rings(const std::vector<int>& local) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = ring_cache_.find(local); it != ring_cache_.end()) return it->second;
  }
  LocalRings out;
  const std::size_t k = local.size();
  out.order = local;
  if (k >= 2) {
    const std::size_t ne = static_cast<std::size_t>(edges_);
    std::vector<double> cap(ne, 0);
    std::vector<LinkClass> cls(ne, LinkClass::nvlink);
    for (auto e : boost::make_iterator_range(boost::edges(g_))) {
      cap[static_cast<std::size_t>(g_[e].id)] = g_[e].usable.v;
      cls[static_cast<std::size_t>(g_[e].id)] = g_[e].cls;
    }
    // Routes between members, as edge ids (node 0: every node is built alike).
    std::vector<std::vector<std::vector<int>>> path(k, std::vector<std::vector<int>>(k));
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t j = 0; j < k; ++j)
        if (i != j)
          for (auto e : route_local(local[i], local[j])) path[i][j].push_back(g_[e].id);

    // All-to-all: every ordered pair at once over the original capacities.
    {
      std::vector<double> flows(ne, 0);
      for (std::size_t i = 0; i < k; ++i)
        for (std::size_t j = 0; j < k; ++j)
          for (int e : path[i][j]) flows[static_cast<std::size_t>(e)] += 1;
      double worst = 0;
      for (std::size_t e = 0; e < ne; ++e)
        if (flows[e] > 0) worst = std::max(worst, flows[e] / cap[e]);
      out.a2a = BytesPerSecond{static_cast<double>(k - 1) / worst};
    }

    std::vector<std::vector<std::size_t>> orders;
    std::vector<std::size_t> perm(k);
    std::iota(perm.begin(), perm.end(), 0);
    if (k <= kEnumerateUpTo) {
      do {
        // One direction of each cycle is enough only for symmetric links; keep both.
        orders.push_back(perm);
      } while (std::next_permutation(perm.begin() + 1, perm.end()));
    } else {
      orders.push_back(perm);
    }

    std::vector<double> res = cap;
    std::vector<int> flows(ne, 0);
    std::vector<int> touched;
    double first = 0, total = 0;
    LinkClass worst_cls = LinkClass::nvlink;
    auto bottleneck = [&](const std::vector<std::size_t>& o) {
      touched.clear();
      for (std::size_t s = 0; s < k; ++s)
        for (int e : path[o[s]][o[(s + 1) % k]]) {
          if (flows[static_cast<std::size_t>(e)]++ == 0) touched.push_back(e);
        }
      double b = kUnbounded;
      for (int e : touched) b = std::min(b, res[static_cast<std::size_t>(e)] / flows[static_cast<std::size_t>(e)]);
      return b;
    };
    auto clear = [&] {
      for (int e : touched) flows[static_cast<std::size_t>(e)] = 0;
    };
    for (int r = 0; r < kMaxRings; ++r) {
      double best = 0;
      std::size_t best_i = 0;
      for (std::size_t i = 0; i < orders.size(); ++i) {
        const double b = bottleneck(orders[i]);
        clear();
        if (b > best * (1 + 1e-12)) {
          best = b;
          best_i = i;
        }
      }
      if (best <= 0 || (r > 0 && best < 0.01 * first)) break;
      (void)bottleneck(orders[best_i]);
      for (int e : touched) {
        res[static_cast<std::size_t>(e)] -= best * flows[static_cast<std::size_t>(e)];
        const LinkClass lc = cls[static_cast<std::size_t>(e)];
        if (lc == LinkClass::pcie || (lc == LinkClass::shm && worst_cls == LinkClass::nvlink)) worst_cls = lc;
      }
      clear();
      if (r == 0) {
        first = best;
        out.order.clear();
        for (std::size_t s : orders[best_i]) out.order.push_back(local[s]);
      }
      total += best;
      ++out.rings;
    }
    out.bw = BytesPerSecond{total};
    out.cls = worst_cls;
  }
  if (c_.intra == IntraNode::shared_memory) out.cls = LinkClass::shm;
  std::lock_guard<std::mutex> lock(mu_);
  ring_cache_.emplace(local, out);
  return out;
}

BytesPerSecond Topology::node_nic_bw() const {
  double bw = 0;
  for (auto v : boost::make_iterator_range(boost::vertices(g_))) {
    if (g_[v].kind != VertexKind::nic) continue;
    for (auto e : boost::make_iterator_range(boost::out_edges(v, g_)))
      if (g_[e].cls == LinkClass::net) bw += g_[e].usable.v;
  }
  return BytesPerSecond{bw};
}

GroupPlan Topology::plan(const std::vector<int>& ranks) const {
  if (ranks.empty()) throw std::invalid_argument("empty rank group");
  const int gpn = c_.gpus_per_node;
  std::map<int, std::vector<int>> by_node;
  for (int r : ranks) {
    (void)gpu_vertex(r);
    by_node[r / gpn].push_back(r % gpn);
  }
  GroupPlan p;
  p.ranks = static_cast<int>(ranks.size());
  p.nodes = static_cast<int>(by_node.size());
  std::map<std::vector<int>, LocalRings> shapes;
  for (auto& [node, local] : by_node) {
    std::sort(local.begin(), local.end());
    if (std::adjacent_find(local.begin(), local.end()) != local.end())
      throw std::invalid_argument(fmt::format("rank {} appears twice in the group", node * gpn + local.front()));
    p.ranks_per_node = std::max(p.ranks_per_node, static_cast<int>(local.size()));
    if (!shapes.count(local)) shapes.emplace(local, local_rings(local));
  }
  const LocalRings* slowest = nullptr;
  for (const auto& [local, lr] : shapes) {
    if (slowest == nullptr || lr.bw.v < slowest->bw.v) slowest = &lr;
    p.a2a_bw.v = std::min(p.a2a_bw.v, lr.a2a.v);
  }
  p.intra_bw = slowest->bw;
  p.intra_rings = slowest->rings;
  p.intra_class = slowest->cls;
  for (const auto& [local, lr] : shapes)
    if (lr.cls == LinkClass::pcie) p.intra_class = LinkClass::pcie;
  p.nvswitch = c_.intra == IntraNode::nvswitch && p.intra_class == LinkClass::nvlink;
  p.channels = p.intra_class == LinkClass::nvlink ? std::max(1, c_.nvlinks_per_gpu)
               : p.intra_class == LinkClass::pcie ? 2
                                                  : 1;
  // One ring through all members, node after node, each node in its first ring's order.
  for (const auto& [node, local] : by_node) {
    const auto& order = shapes.at(local).order;
    for (int l : order) p.ring.push_back(node * gpn + l);
  }
  if (p.nodes > 1) {
    double inter = kUnbounded;
    const double gpu_pcie = pcie_usable(c_.pcie_gen, c_.pcie_width).v;
    for (const auto& [node, local] : by_node)
      inter = std::min(inter, std::min(nic_bw_.v, static_cast<double>(local.size()) * gpu_pcie));
    p.inter_bw = BytesPerSecond{inter};
    p.inter_hops = p.nodes;
    p.intra_hops = p.ranks - p.nodes;
    p.ring_bw = BytesPerSecond{std::min(p.intra_bw.v, inter)};
  } else {
    p.intra_hops = p.ranks > 1 ? p.ranks : 0;
    p.ring_bw = p.intra_bw;
  }
  return p;
}

}  // namespace zp::sim
