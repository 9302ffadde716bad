// CPU kernel throughput: the GEMMs of a 4-layer, hidden-256 GPT-2 at micro-batch 8,
// sequence 128 (M = 1024 token rows), against a square GEMM as the reference peak.
// Target: linear forward and backward at >= 70% of BM_GemmPeak's GFLOP/s for the variant
// in use. BM_GemmPeak/<isa> runs each GEMM variant of this build that this CPU supports
// (kernels/cpu/isa.hpp); the linear benchmarks run the one the kernels pick
// (ZEROPLAN_CPU_ISA=baseline|avx2|avx512 to pick another).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/rng.hpp"

namespace kc = zp::kernels::cpu;

namespace {

constexpr std::int64_t kRows = 8 * 128;  // micro-batch × sequence

std::vector<float> random_buffer(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  kc::uniform_fill(v.data(), n, seed, 0);
  for (float& x : v) x = x - 0.5f;
  return v;
}

void set_gflops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP"] =
      benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: K (in features), N (out features).
void BM_LinearForward(benchmark::State& state) {
  const std::int64_t M = kRows, K = state.range(0), N = state.range(1);
  const auto x = random_buffer(M * K, 1), w = random_buffer(N * K, 2), b = random_buffer(N, 3);
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (auto _ : state) {
    kc::linear_forward(y.data(), x.data(), w.data(), b.data(), M, N, K);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * static_cast<double>(M * N * K));
}

// dx, dW and db (4·M·N·K FLOPs), accumulating into the gradients as the executor does.
void BM_LinearBackward(benchmark::State& state) {
  const std::int64_t M = kRows, K = state.range(0), N = state.range(1);
  const auto x = random_buffer(M * K, 1), w = random_buffer(N * K, 2), dy = random_buffer(M * N, 4);
  std::vector<float> dx(static_cast<std::size_t>(M * K)), dw(static_cast<std::size_t>(N * K)),
      db(static_cast<std::size_t>(N));
  for (auto _ : state) {
    kc::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), M, N, K, true);
    benchmark::DoNotOptimize(dw.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, 4.0 * static_cast<double>(M * N * K));
}

// GPT-2's Conv1D layout (weight (in, out)), for the per-layer shapes.
void BM_Conv1dForward(benchmark::State& state) {
  const std::int64_t M = kRows, K = state.range(0), N = state.range(1);
  const auto x = random_buffer(M * K, 1), w = random_buffer(K * N, 2), b = random_buffer(N, 3);
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (auto _ : state) {
    kc::conv1d_forward(y.data(), x.data(), w.data(), b.data(), M, N, K);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * static_cast<double>(M * N * K));
}

void BM_Conv1dBackward(benchmark::State& state) {
  const std::int64_t M = kRows, K = state.range(0), N = state.range(1);
  const auto x = random_buffer(M * K, 1), w = random_buffer(K * N, 2), dy = random_buffer(M * N, 4);
  std::vector<float> dx(static_cast<std::size_t>(M * K)), dw(static_cast<std::size_t>(K * N)),
      db(static_cast<std::size_t>(N));
  for (auto _ : state) {
    kc::conv1d_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), M, N, K, true);
    benchmark::DoNotOptimize(dw.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, 4.0 * static_cast<double>(M * N * K));
}

// Reference: a square row-major fp32 GEMM, 1024 x 1024 x 1024, through one variant.
void BM_GemmPeak(benchmark::State& state, kc::Isa isa) {
  const std::int64_t n = 1024;
  const auto a = random_buffer(n * n, 5), b = random_buffer(n * n, 6);
  std::vector<float> c(static_cast<std::size_t>(n * n));
  const kc::GemmFn gemm = kc::gemm_fn(isa);
  for (auto _ : state) {
    gemm(c.data(), a.data(), b.data(), n, n, n, false, false, false);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * static_cast<double>(n * n * n));
}

// {K, N}: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, lm_head (vocab 50257).
void gpt2_shapes(benchmark::internal::Benchmark* b) {
  b->Args({256, 768})->Args({256, 256})->Args({256, 1024})->Args({1024, 256})->Args({256, 50257});
}

void gpt2_layer_shapes(benchmark::internal::Benchmark* b) {
  b->Args({256, 768})->Args({256, 256})->Args({256, 1024})->Args({1024, 256});
}

}  // namespace

// Cross entropy over GPT-2's vocabulary, forward and backward, as the 4-layer hidden-256
// step runs it (micro-batch 8 x seq 128 rows).
void BM_CrossEntropy(benchmark::State& state) {
  const std::int64_t N = 1024, V = 50257;
  std::vector<float> logits(static_cast<std::size_t>(N * V)), lse(static_cast<std::size_t>(N)),
      d(static_cast<std::size_t>(N * V));
  std::vector<std::int64_t> t(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 1000) * 0.01f - 5.0f;
  for (std::int64_t i = 0; i < N; ++i) t[static_cast<std::size_t>(i)] = (i * 31) % V;
  for (auto _ : state) {
    const float loss = zp::kernels::cpu::cross_entropy_forward(lse.data(), logits.data(), t.data(), N, V);
    zp::kernels::cpu::cross_entropy_backward(d.data(), logits.data(), lse.data(), t.data(), N, V, 1.0f, false);
    benchmark::DoNotOptimize(loss);
    benchmark::DoNotOptimize(d.data());
  }
  state.counters["elements_per_s"] =
      benchmark::Counter(static_cast<double>(N * V), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_CrossEntropy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearForward)->Apply(gpt2_shapes)->ArgNames({"K", "N"})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearBackward)->Apply(gpt2_shapes)->ArgNames({"K", "N"})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv1dForward)->Apply(gpt2_layer_shapes)->ArgNames({"K", "N"})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv1dBackward)->Apply(gpt2_layer_shapes)->ArgNames({"K", "N"})->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  for (const kc::Isa isa : kc::built_isas())
    if (kc::cpu_supports(isa))
      benchmark::RegisterBenchmark((std::string("BM_GemmPeak/") + kc::isa_name(isa)).c_str(), BM_GemmPeak, isa)
          ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("gemm_variant_in_use", kc::isa_name(kc::gemm_isa()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
