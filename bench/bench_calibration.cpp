// Speed target (docs/calibration.md): fitting 10,000 observations takes under 1 s.
//  - BM_Fit_10000_Kernels: GEMMs of 10,000 shapes and bandwidth-bound kernels (what
//    `calibrate --device cuda` measures), the compute model's coefficients;
//  - BM_Fit_10000_Collectives: all-reduce, all-gather and reduce-scatter over 8 to 128 ranks of
//    16 nodes at 1 KiB to 1 GiB, repeated (nccl-tests tables of several runs), the collective
//    model's factors.
// Measurements are generated through the simulator from known coefficients with 2% noise;
// the time covers the whole fit (screen, coarse-to-fine Levenberg-Marquardt, uncertainties,
// the predictions before and after), not the generation.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>

#include "calibration/fit.hpp"
#include "calibration/params.hpp"
#include "calibration/predictor.hpp"
#include "sim/cluster.hpp"
#include "sim/device.hpp"

using namespace zp;
using namespace zp::calibration;

namespace {

void measure(Dataset& data, const Predictor& pred, const ModelParams& truth) {
  const std::vector<double> t = pred.predict(truth);
  std::mt19937 rng(42);
  std::normal_distribution<double> n(0.0, 1.0);
  for (std::size_t i = 0; i < data.obs.size(); ++i) data.obs[i].measured = Seconds{t[i] * std::exp(0.02 * n(rng))};
}

void run_fit(benchmark::State& state, Dataset& data, const sim::ClusterSpec& cluster, const ModelParams& start,
             const std::vector<const ParamDef*>& params) {
  const Predictor pred(data, cluster);
  ModelParams truth = start;
  for (const ParamDef* d : params) d->set(truth, std::clamp(d->get(start) * 0.7, d->lo, d->hi));
  measure(data, pred, truth);
  FitOptions fo;
  fo.candidates = params;
  const PredictFn f = [&pred](const ModelParams& m, const std::vector<char>& want, std::vector<double>& out) {
    pred.predict(m, want, out);
  };
  std::size_t fitted = 0;
  int evaluations = 0;
  for (auto _ : state) {
    const FitResult r = fit(f, data.obs, start, fo);
    fitted = r.fitted.size();
    evaluations = r.evaluations;
    benchmark::DoNotOptimize(r.cost_after);
  }
  state.counters["observations"] = static_cast<double>(data.obs.size());
  state.counters["parameters"] = static_cast<double>(fitted);
  state.counters["evaluations"] = evaluations;
}

void BM_Fit_10000_Kernels(benchmark::State& state) {
  const sim::ClusterSpec cluster = sim::single_node("H200-141GB", 1);
  Dataset data;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> e(6, 14);
  while (data.obs.size() < 8000) {
    const std::int64_t m = std::int64_t{1} << e(rng), n = (std::int64_t{1} << e(rng)) + (rng() % 4 == 0 ? 1 : 0),
                       k = std::int64_t{1} << e(rng);
    Observation o;
    o.kind = ObsKind::kernel;
    o.kernel.cls = KernelClass::gemm;
    o.kernel.gemms = {models::Gemm{m, n, k, 1}};
    o.kernel.backward = rng() % 2 == 0;
    o.kernel.flops = Flops{(o.kernel.backward ? 4.0 : 2.0) * static_cast<double>(m * n) * static_cast<double>(k)};
    o.kernel.bytes = Bytes{(o.kernel.backward ? 4 : 2) * (m * k + k * n + m * n)};
    data.obs.push_back(o);
  }
  while (data.obs.size() < 10000) {
    Observation o;
    o.kind = ObsKind::kernel;
    o.kernel.cls = KernelClass::memory;
    o.kernel.bytes = Bytes{std::int64_t{1} << (10 + static_cast<int>(data.obs.size() % 20))};
    data.obs.push_back(o);
  }
  ModelParams start;
  start.device = sim::default_profile(sim::find_device("H200-141GB"));
  std::vector<const ParamDef*> params;
  for (const char* n : {"compute.gemm_max_efficiency", "compute.gemm_half_dim", "compute.gemm_unaligned_factor",
                        "compute.elementwise_efficiency", "compute.kernel_launch_us"})
    params.push_back(find_param(n));
  run_fit(state, data, cluster, start, params);
}
BENCHMARK(BM_Fit_10000_Kernels)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Fit_10000_Collectives(benchmark::State& state) {
  const sim::ClusterSpec cluster = sim::load_cluster("8xA100-80GB-NVSwitch", 16);
  Dataset data;
  for (int rep = 0; data.obs.size() < 10000; ++rep)
    for (auto kind : {zero::CollKind::all_reduce, zero::CollKind::all_gather, zero::CollKind::reduce_scatter})
      for (auto [ranks, nodes] : {std::pair{8, 1}, std::pair{16, 2}, std::pair{64, 8}, std::pair{128, 16}})
        for (std::int64_t b = 1024; b <= (std::int64_t{1} << 30) && data.obs.size() < 10000; b *= 2) {
          Observation o;
          o.kind = ObsKind::collective;
          o.coll.kind = kind;
          o.coll.ranks = ranks;
          o.coll.nodes = nodes;
          o.coll.ranks_per_node = ranks / nodes;
          o.coll.bytes = Bytes{b + rep * 4096};
          data.obs.push_back(o);
        }
  ModelParams start;
  start.device = sim::default_profile(sim::find_device(cluster.gpu));
  std::vector<const ParamDef*> params;
  for (const char* n : {"collective.intra.bandwidth", "collective.inter.bandwidth", "collective.intra.latency",
                        "collective.inter.latency", "collective.fill_fraction"})
    params.push_back(find_param(n));
  run_fit(state, data, cluster, start, params);
}
BENCHMARK(BM_Fit_10000_Collectives)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
