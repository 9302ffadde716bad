// libFuzzer target: NCCL topology XML (the file NCCL_TOPO_DUMP_FILE writes) → the cluster
// reader (sim/cluster.cpp: parse_nccl_topo_xml, with and without a GPU type given) → the
// topology graph and the rank-group plan of every GPU (sim/topology.cpp) → the collective
// cost model (sim/collective_model.cpp). Bad input must surface as zp::InputError; any
// other exception, a sanitizer report, or a plan with a non-positive ring bandwidth for a
// node that has links is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "sim/cluster.hpp"
#include "sim/collective_model.hpp"
#include "sim/topology.hpp"

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_topology_xml: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  // The first byte picks the GPU type: from the XML's sm, or given as --gpu would.
  const char* const gpus[] = {"", "H200-141GB", "A100-40GB", "V100-16GB"};
  const std::string gpu = gpus[data[0] % 4];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  zp::sim::ClusterSpec c;
  try {
    c = zp::sim::parse_nccl_topo_xml("fuzz_topo.xml", text, gpu);
  } catch (const zp::InputError& e) {
    if (std::string(e.what()).rfind("fuzz_topo.xml", 0) != 0) bug("a refusal that does not name the file");
    return 0;
  }
  (void)zp::sim::describe_cluster(c);
  if (c.gpus_per_node > 64) return 0;  // keep one input fast: ring search is factorial up to 8 members
  try {
    const zp::sim::Topology t(c);
    std::vector<int> all(static_cast<std::size_t>(c.gpus_per_node));
    std::iota(all.begin(), all.end(), 0);
    const zp::sim::GroupPlan p = t.plan(all);
    if (c.gpus_per_node > 1 && !(p.ring_bw.v > 0)) bug("a node of several GPUs without ring bandwidth");
    if (static_cast<int>(p.ring.size()) != c.gpus_per_node) bug("the ring does not visit every GPU once");
    const zp::sim::CollectiveModel m(c);
    for (int k = 0; k < zp::zero::kNumCollKinds; ++k)
      (void)m.cost(static_cast<zp::zero::CollKind>(k), all, zp::Bytes{std::int64_t{1} << 20});
  } catch (const zp::InputError&) {
  }
  return 0;
}
