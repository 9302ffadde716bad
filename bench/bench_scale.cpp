// Scale edges (docs/failure.md, docs/performance.md):
//  - the topology and collective model of a cluster of K nodes (8 x H200 each, the preset
//    multiplied by --nodes K), then one all-reduce over every rank: K = 65,536 (the most
//    --nodes accepts) < 1 s, and about linear in K (the graph holds one node; the work left
//    is the rank list itself).
#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/collective_model.hpp"

using namespace zp;

namespace {

void BM_AllReduceOverEveryRank_Nodes(benchmark::State& state) {
  const auto cluster = sim::load_cluster("8xH200-141GB-NVSwitch", static_cast<int>(state.range(0)));
  std::vector<int> ranks(static_cast<std::size_t>(cluster.world_size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  for (auto _ : state) {
    const sim::CollectiveModel m(cluster);  // builds the topology
    auto cost = m.cost(zero::CollKind::all_reduce, ranks, Bytes{std::int64_t{1} << 30});
    benchmark::DoNotOptimize(cost);
  }
  state.counters["ranks"] = static_cast<double>(ranks.size());
}
BENCHMARK(BM_AllReduceOverEveryRank_Nodes)->Arg(1)->Arg(1024)->Arg(8192)->Arg(65536)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
