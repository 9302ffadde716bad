#pragma once
// Clusters: nodes of GPUs, their intra-node links and NICs, built into a Boost.Graph
// topology from which the rings and trees a collective would use are derived.
// Sources: presets in sim/clusters/*.json, a user JSON file, or NCCL's topology XML
// (the file NCCL_TOPO_DUMP_FILE writes) for the node description.
#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/units.hpp"
#include "sim/device.hpp"
#include "zero/program.hpp"

namespace zp::sim {

enum class IntraNode {
  nvswitch,      // every GPU to an NVSwitch fabric (DGX A100/H100/H200); NVLS on Hopper
  nvlink_mesh,   // direct NVLinks between GPU pairs (DGX-1 hybrid cube mesh)
  pcie,          // PCIe only, through a tree of PCIe switches and the CPU root complex
  shared_memory, // CPU ranks: processes on one host
};

// The collective model's coefficients that calibration fits (docs/calibration.md): a factor on
// every latency term and on every bandwidth the model takes from the topology, per level
// (inside a node, across nodes), algorithm and protocol, and the pipeline fill fraction φ.
// The defaults (factors of 1, φ = 0.6) are the model of docs/collectives.md; a cluster
// profile (calibration/profiles/*.json, `--profile`) replaces them.
struct CollectiveCoefficients {
  enum Level { intra = 0, inter = 1 };
  static constexpr int kLevels = 2;
  static constexpr int kAlgos = 4;   // ring, tree, nvls, p2p (sim::Algo's order)
  static constexpr int kProtos = 3;  // LL, LL128, Simple (sim::Proto's order)
  using Table = std::array<double, kLevels * kAlgos * kProtos>;
  static constexpr std::size_t at(int level, int algo, int proto) {
    return static_cast<std::size_t>((level * kAlgos + algo) * kProtos + proto);
  }
  static constexpr Table ones() {
    Table t{};
    for (auto& x : t) x = 1.0;
    return t;
  }
  // Latency terms at that level: the base latency and intra-node hops (intra), network hops (inter).
  Table latency = ones();
  // Bandwidth from the topology at that level: the node's rings (intra), its NICs (inter).
  Table bandwidth = ones();
  double fill_fraction = 0.6;        // φ of the warm-up term (collective_model.cpp)
  bool operator==(const CollectiveCoefficients&) const = default;
};

// A measured bus-bandwidth curve that overrides the model for one collective kind.
struct MeasuredCurve {
  std::vector<std::pair<Bytes, BytesPerSecond>> points;  // (message bytes S, busbw), sorted by S
  int ranks = 0;                      // group size the curve was measured on; 0: any group
  std::string source;                 // where the measurement came from
};

struct ClusterSpec {
  std::string name;                   // preset name or file path
  std::string gpu = "A100-80GB";      // device database name
  int nodes = 1;
  int gpus_per_node = 8;
  IntraNode intra = IntraNode::nvswitch;
  // NVLink: links per GPU and per-link bandwidth per direction (GB/s); for a mesh, the
  // links between each connected pair, as an adjacency list over local GPU indices.
  int nvlinks_per_gpu = 0;
  BytesPerSecond nvlink_bw_per_link{};
  std::vector<std::vector<std::pair<int, int>>> nvlink_pairs;  // per GPU: (peer, links)
  // PCIe: generation and width of each GPU's link, GPUs under one PCIe switch.
  int pcie_gen = 4;
  int pcie_width = 16;
  int gpus_per_pcie_switch = 0;       // 0: all GPUs under the root complex
  // Network: NICs per node and their speed.
  int nics_per_node = 0;
  double nic_gbps = 0;                // Gb/s per NIC
  std::map<zero::CollKind, MeasuredCurve> measured;  // optional overrides
  CollectiveCoefficients collective;  // the model's fitted coefficients (defaults: docs/collectives.md)
  std::string source;                 // where the description came from
  // Added with the topology model:
  std::string description;            // one human sentence (preset JSON "description")
  int nvlink_gen = 0;                 // NVLink generation (2 Volta, 3 Ampere, 4 Hopper, 5 Blackwell)
  BytesPerSecond shm_bandwidth{};     // shared_memory: per-process copy bandwidth
  Seconds shm_latency{};              // shared_memory: per-hop latency
  // Host (CPU) memory per node, for offloaded optimizer states; 0: unknown, and
  // host_memory_per_node() assumes 64 GiB per GPU (a DGX-1's 512 GiB for 8).
  Bytes host_memory{};
  Bytes host_memory_per_node() const {
    return host_memory.v > 0 ? host_memory : Bytes{std::int64_t{64} * (std::int64_t{1} << 30) * gpus_per_node};
  }
  int world_size() const { return nodes * gpus_per_node; }
};

const char* intra_node_name(IntraNode k);

// `name_or_path`: a preset (sim/clusters/NAME.json, case-insensitive) or a JSON file or
// an NCCL topology XML (*.xml). `nodes` multiplies the node across an InfiniBand fabric
// (`nic_gbps` overrides the NIC speed). `gpu` (--gpu) names the GPU type of an NCCL
// topology XML (its `sm` cannot tell H100 from H200); a preset or JSON cluster names its
// own GPU, so `gpu` with one is refused. Bad input → zp::InputError naming file and key.
ClusterSpec load_cluster(const std::string& name_or_path, std::optional<int> nodes = std::nullopt,
                         std::optional<double> nic_gbps = std::nullopt, const std::string& gpu = "");
// `--gpus N --gpu TYPE`: one node of N GPUs of TYPE with the links that GPU usually has.
ClusterSpec single_node(const std::string& gpu, int gpus);
ClusterSpec parse_nccl_topo_xml(const std::string& file, const std::string& xml_text);
// The same with the GPU type given (the XML's `sm` cannot tell H100 from H200); empty: from `sm`.
ClusterSpec parse_nccl_topo_xml(const std::string& file, const std::string& xml_text,
                                const std::string& gpu_override);
// One line: "2 nodes x 8 A100-80GB, NVSwitch (12 x NVLink3 25 GB/s), 8 x 200 Gb/s NICs per node".
std::string describe_cluster(const ClusterSpec& c);
std::vector<std::string> cluster_preset_names();

}  // namespace zp::sim
