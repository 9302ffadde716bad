// Throughput of the main CUDA kernels against the device's ceilings: a device-to-device copy
// (bytes read + written) and a bf16 8192³ GEMM, both measured here in the same run, beside
// the figures PyTorch reaches on an H200 (copy ~4.3 TB/s,
// bf16 GEMM ~790 TFLOP/s). Shapes are GPT-2 124M / 350M at micro-batch 16, sequence 1024,
// bert-large at micro-batch 64, sequence 128, and Llama-like heads of 128. Every input is
// random (never zeros), every buffer larger than the L2 where the kernel is memory-bound.
// Each figure is the median of 20 timed calls (CUDA events) after 3 warm-up calls.
//
//   zeroplan_bench_cuda [--quick]     (--quick: 5 timed calls, smaller shapes)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/bmm.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/multi.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rng.cuh"
#include "kernels/cuda/sdpa.cuh"
#include "kernels/cuda/sdpa_cudnn.cuh"

namespace kg = zp::kernels::cuda;
using zp::DType;

namespace {

constexpr double kRefCopyGBs = 4300.0;      // H200, PyTorch device-to-device copy, read + write
constexpr double kRefGemmTflops = 790.0;    // H200, PyTorch bf16 8192³ on random data

struct Options {
  int reps = 20;
  bool quick = false;
};

class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) { ZP_CUDA_CHECK(cudaMalloc(&p_, bytes)); }
  ~Buffer() { cudaFree(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// Uniform in [lo, hi) in dt, from the shared generator.
void fill(const Buffer& b, std::int64_t n, DType dt, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  kg::uniform_fill(b.get(), n, seed, 0, dt, nullptr);
  kg::scale_inplace(b.get(), n, hi - lo, dt, nullptr);
  kg::add_scalar_forward(b.get(), b.get(), n, lo, dt, nullptr);
}

// Median milliseconds of opt.reps calls, each between two events, after 3 warm-up calls.
double time_ms(const Options& opt, const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  ZP_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  ZP_CUDA_CHECK(cudaEventCreate(&a));
  ZP_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < opt.reps; ++i) {
    ZP_CUDA_CHECK(cudaEventRecord(a, nullptr));
    f();
    ZP_CUDA_CHECK(cudaEventRecord(b, nullptr));
    ZP_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0.0f;
    ZP_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Prints one result line; returns the rate (TFLOP/s or GB/s).
double report(const std::string& name, const std::string& shape, double ms, double amount, bool flops,
              double ceiling) {
  const double rate = flops ? amount / (ms * 1e-3) / 1e12 : amount / (ms * 1e-3) / 1e9;
  std::printf("%-40s %-22s %9.3f ms %9.1f %s %5.1f%% of %.0f\n", name.c_str(), shape.c_str(), ms, rate,
              flops ? "TFLOP/s" : "GB/s   ", 100.0 * rate / ceiling, ceiling);
  std::fflush(stdout);
  return rate;
}

std::string dims(std::initializer_list<std::int64_t> d) {
  std::string s;
  for (std::int64_t v : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(v);
  }
  return s;
}

double bytes_of(DType dt) { return static_cast<double>(zp::dtype_size(dt)); }
std::size_t size_of(DType dt) { return static_cast<std::size_t>(zp::dtype_size(dt)); }
double f(std::int64_t v) { return static_cast<double>(v); }

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      opt.quick = true;
      opt.reps = 5;
    } else {
      std::fprintf(stderr, "zeroplan_bench_cuda: unknown argument %s (allowed: --quick)\n", argv[i]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    ZP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    std::printf("GPU %s, cc %d.%d, %d SMs, %.1f GiB, L2 %.0f MB; driver %d, runtime %d\n", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                static_cast<double>(prop.l2CacheSize) / 1e6, driver, runtime);
    kg::Context ctx;
    const std::int64_t scale = opt.quick ? 4 : 1;

    // ---------------------------------------------------------------- ceilings measured here
    double copy_gbs = 0.0, gemm_tflops = 0.0;
    {
      const std::size_t bytes = std::size_t{2} << 30;
      Buffer a(bytes), b(bytes);
      fill(a, static_cast<std::int64_t>(bytes / 4), DType::fp32, 1);
      const double ms = time_ms(opt, [&] {
        ZP_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, nullptr));
      });
      copy_gbs = report("ceiling: cudaMemcpy D2D", "2 GiB", ms, 2.0 * static_cast<double>(bytes), false, kRefCopyGBs);
    }
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32}) {
      const std::int64_t n = dt == DType::fp32 ? 4096 : 8192 / (opt.quick ? 2 : 1);
      Buffer a(static_cast<std::size_t>(n * n) * 4), b(static_cast<std::size_t>(n * n) * 4),
          c(static_cast<std::size_t>(n * n) * 4);
      fill(a, n * n, dt, 2);
      fill(b, n * n, dt, 3);
      const double ms =
          time_ms(opt, [&] { kg::gemm(ctx, c.get(), a.get(), b.get(), n, n, n, false, false, false, dt, nullptr); });
      const double rate =
          report(std::string("gemm ") + std::string(zp::dtype_name(dt)) + (dt == DType::fp32 ? " (no TF32)" : ""),
                 dims({n, n, n}), ms, 2.0 * f(n) * f(n) * f(n), true, kRefGemmTflops);
      if (dt == DType::bf16) gemm_tflops = rate;
    }
    const double copy_ceiling = copy_gbs > 0 ? copy_gbs : kRefCopyGBs;
    const double gemm_ceiling = gemm_tflops > 0 ? gemm_tflops : kRefGemmTflops;
    std::printf("ceilings for the fractions below: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s (measured above)\n\n",
                copy_ceiling, gemm_ceiling);

    // ---------------------------------------------------------------- GEMMs of the models
    {
      struct Lin {
        const char* name;
        std::int64_t M, N, K;
        bool bias = true;
      };
      const std::int64_t M = 16 * 1024 / scale;
      const Lin lins[] = {{"gpt2 c_attn fwd", M, 2304, 768},      {"gpt2 c_fc fwd", M, 3072, 768},
                          {"gpt2 c_proj(mlp) fwd", M, 768, 3072}, {"gpt2-medium c_fc fwd", M, 4096, 1024},
                          {"gpt2 lm_head fwd", M, 50257, 768, false},
                          // the same product with the vocabulary padded to a multiple of 64: rows of
                          // the logits 16-byte aligned, as cuBLASLt's fastest kernels need
                          {"gpt2 lm_head, vocab 50304", M, 50304, 768, false},
                          {"bert-large ffn fwd", 64 * 128 / scale, 4096, 1024}};
      // ld: the output's (and its gradient's) row pitch, 0 packed.
      auto run = [&](kg::Context& c, const Lin& l, const std::string& label, std::int64_t ld = 0) {
        const std::int64_t pitch = ld != 0 ? ld : l.N;
        Buffer x(static_cast<std::size_t>(l.M * l.K) * 2), w(static_cast<std::size_t>(l.N * l.K) * 2),
            y(static_cast<std::size_t>(l.M * pitch) * 2), bias(static_cast<std::size_t>(l.N) * 2);
        fill(x, l.M * l.K, DType::bf16, 4);
        fill(w, l.N * l.K, DType::bf16, 5);
        fill(bias, l.N, DType::bf16, 6);
        const double ms = time_ms(opt, [&] {
          kg::linear_forward(c, y.get(), x.get(), w.get(), l.bias ? bias.get() : nullptr, l.M, l.N, l.K, DType::bf16,
                             nullptr, ld);
        });
        report(std::string("linear bf16 ") + label, dims({l.M, l.N, l.K}), ms, 2.0 * f(l.M) * f(l.N) * f(l.K), true,
               gemm_ceiling);
        Buffer dy(static_cast<std::size_t>(l.M * pitch) * 2), dx(static_cast<std::size_t>(l.M * l.K) * 2),
            dw(static_cast<std::size_t>(l.N * l.K) * 2), db(static_cast<std::size_t>(l.N) * 2);
        fill(dy, l.M * pitch, DType::bf16, 7);
        const double bms = time_ms(opt, [&] {
          kg::linear_backward(c, dx.get(), dw.get(), l.bias ? db.get() : nullptr, dy.get(), x.get(), w.get(), l.M, l.N,
                              l.K, true, DType::bf16, nullptr, ld);
        });
        report(std::string("linear bf16 bwd ") + label, dims({l.M, l.N, l.K}), bms, 4.0 * f(l.M) * f(l.N) * f(l.K),
               true, gemm_ceiling);
      };
      for (const Lin& l : lins) run(ctx, l, l.name);
      // The whole backward of GPT-2 medium's Conv1Ds and BERT-large's FFN Linear (dX, dW and
      // the bias gradient, dW added into as under gradient accumulation), the bias gradient as
      // a column sum of its own over dY (the default) and by cuBLASLt's bias-gradient epilogue
      // on the dW product (ContextOptions::bias_grad_epilogue), which reads dY anyway.
      {
        kg::ContextOptions bgrad_options;
        bgrad_options.bias_grad_epilogue = true;
        kg::Context bgrad(bgrad_options);
        const Lin mediums[] = {{"gpt2-medium c_attn", M, 3072, 1024},
                               {"gpt2-medium attn.c_proj", M, 1024, 1024},
                               {"gpt2-medium c_fc", M, 4096, 1024},
                               {"gpt2-medium mlp.c_proj", M, 1024, 4096},
                               {"bert-large ffn (Linear)", 64 * 128 / scale, 4096, 1024}};
        for (const Lin& l : mediums) {
          const bool conv = l.name[0] == 'g';
          Buffer x(static_cast<std::size_t>(l.M * l.K) * 2), w(static_cast<std::size_t>(l.N * l.K) * 2),
              dy(static_cast<std::size_t>(l.M * l.N) * 2), dx(static_cast<std::size_t>(l.M * l.K) * 2),
              dw(static_cast<std::size_t>(l.N * l.K) * 2), db(static_cast<std::size_t>(l.N) * 2);
          fill(x, l.M * l.K, DType::bf16, 31);
          fill(w, l.N * l.K, DType::bf16, 32);
          fill(dy, l.M * l.N, DType::bf16, 33);
          for (kg::Context* c : {&ctx, &bgrad}) {
            const std::uint64_t before = c->bias_grad_epilogues();
            const double ms = time_ms(opt, [&] {
              if (conv)
                kg::conv1d_backward(*c, dx.get(), dw.get(), db.get(), dy.get(), x.get(), w.get(), l.M, l.N, l.K, true,
                                    DType::bf16, nullptr);
              else
                kg::linear_backward(*c, dx.get(), dw.get(), db.get(), dy.get(), x.get(), w.get(), l.M, l.N, l.K, true,
                                    DType::bf16, nullptr);
            });
            const std::string how = c == &ctx                            ? ", bias column sum"
                                    : c->bias_grad_epilogues() > before ? ", bias grad epilogue"
                                                                         : ", bias grad epilogue refused: column sum";
            report(std::string(conv ? "conv1d" : "linear") + " bf16 bwd " + l.name + how, dims({l.M, l.N, l.K}), ms,
                   4.0 * f(l.M) * f(l.N) * f(l.K), true, gemm_ceiling);
          }
        }
      }
      // --fused-mlp's products (GPT-2 and GPT-2 medium, bf16): c_fc and its GELU as the chain
      // (the product with the bias epilogue, then the GELU kernel) and as one product with the
      // GELU epilogue; c_proj's input gradient and the GELU's backward as the chain and as one
      // product with the derivative's epilogue. TFLOP/s count the products' FLOPs only.
      for (const Lin& l : {Lin{"gpt2 c_fc", M, 3072, 768}, Lin{"gpt2-medium c_fc", M, 4096, 1024}}) {
        const std::int64_t MN = l.M * l.N;
        Buffer x(static_cast<std::size_t>(l.M * l.K) * 2), w(static_cast<std::size_t>(l.N * l.K) * 2),
            bias(static_cast<std::size_t>(l.N) * 2), pre(static_cast<std::size_t>(MN) * 2),
            a(static_cast<std::size_t>(MN) * 2), dy(static_cast<std::size_t>(l.M * l.K) * 2),
            da(static_cast<std::size_t>(MN) * 2), dpre(static_cast<std::size_t>(MN) * 2);
        fill(x, l.M * l.K, DType::bf16, 41);
        fill(w, l.N * l.K, DType::bf16, 42, -0.05f, 0.05f);
        fill(bias, l.N, DType::bf16, 43);
        fill(dy, l.M * l.K, DType::bf16, 44);
        const double flops = 2.0 * f(l.M) * f(l.N) * f(l.K);
        double ms = time_ms(opt, [&] {
          kg::conv1d_forward(ctx, pre.get(), x.get(), w.get(), bias.get(), l.M, l.N, l.K, DType::bf16, nullptr);
          kg::gelu_tanh_forward(a.get(), pre.get(), MN, DType::bf16, nullptr);
        });
        report(std::string(l.name) + " + gelu fwd, chain", dims({l.M, l.N, l.K}), ms, flops, true, gemm_ceiling);
        ms = time_ms(opt, [&] {
          if (!kg::conv1d_gelu_forward(ctx, a.get(), pre.get(), x.get(), w.get(), bias.get(), l.M, l.N, l.K,
                                       DType::bf16, nullptr))
            throw std::runtime_error("the GELU epilogue refused an aligned product");
        });
        report(std::string(l.name) + " + gelu fwd, epilogue", dims({l.M, l.N, l.K}), ms, flops, true, gemm_ceiling);
        // c_proj's W (N, K) read transposed: d_pre (M, N) = dy (M, K) · Wᵀ, here w's (K, N) bytes as (N, K).
        ms = time_ms(opt, [&] {
          kg::conv1d_backward(ctx, da.get(), nullptr, nullptr, dy.get(), a.get(), w.get(), l.M, l.K, l.N, false,
                              DType::bf16, nullptr);
          kg::gelu_tanh_backward(dpre.get(), pre.get(), da.get(), MN, false, DType::bf16, nullptr);
        });
        report(std::string(l.name) + " input grad + gelu bwd, chain", dims({l.M, l.N, l.K}), ms, flops, true,
               gemm_ceiling);
        ms = time_ms(opt, [&] {
          if (!kg::conv1d_dgelu_backward(ctx, dpre.get(), dy.get(), w.get(), pre.get(), l.M, l.K, l.N, DType::bf16,
                                         nullptr))
            throw std::runtime_error("the DGELU epilogue refused an aligned product");
        });
        report(std::string(l.name) + " input grad + gelu bwd, epilogue", dims({l.M, l.N, l.K}), ms, flops, true,
               gemm_ceiling);
      }
      // GPT-2's odd vocabulary leaves the logits' rows misaligned: by default such products
      // run in pieces staged through the Context's scratch (kernels/cuda/bmm.cu); here also
      // as they are, and with a larger scratch (fewer, larger pieces).
      kg::ContextOptions direct_options, large_options;
      direct_options.staged_min_work = 1e300;
      large_options.scratch_bytes = std::size_t{256} << 20;
      kg::Context direct(direct_options), large(large_options);
      const Lin head{"gpt2 lm_head fwd", M, 50257, 768, false};
      run(direct, head, "gpt2 lm_head, not staged");
      run(large, head, "gpt2 lm_head, 256 MiB scratch");
      // --fused-loss's logits: rows padded to 50264 (models::Tensor::row_pitch), the vocabulary
      // cut in place into 50256 columns and a thin rest, no copies.
      run(ctx, head, "gpt2 lm_head, padded rows", 50264);
      // The head's two backward products apart, staged (default) and as they are, and with
      // the vocabulary padded: dx = dlogits·W (k = V) and dW = dlogitsᵀ·x (m = V).
      for (const std::int64_t V : {std::int64_t{50257}, std::int64_t{50304}}) {
        const std::int64_t H = 768;
        Buffer dlogits(static_cast<std::size_t>(M * V) * 2), w(static_cast<std::size_t>(V * H) * 2),
            x(static_cast<std::size_t>(M * H) * 2), dx(static_cast<std::size_t>(M * H) * 2),
            dw(static_cast<std::size_t>(V * H) * 2);
        fill(dlogits, M * V, DType::bf16, 21);
        fill(w, V * H, DType::bf16, 22);
        fill(x, M * H, DType::bf16, 23);
        for (kg::Context* c : {&ctx, &direct}) {
          const std::string how = c == &ctx ? "" : ", not staged";
          if (V % 8 == 0 && c != &ctx) continue;
          const std::string tag = "V " + std::to_string(V) + how;
          const double dx_ms = time_ms(opt, [&] {
            kg::gemm(*c, dx.get(), dlogits.get(), w.get(), M, H, V, false, false, false, DType::bf16, nullptr);
          });
          report("gemm bf16 lm_head dx, " + tag, dims({M, H, V}), dx_ms, 2.0 * f(M) * f(H) * f(V), true,
                 gemm_ceiling);
          const double dw_ms = time_ms(opt, [&] {
            kg::gemm(*c, dw.get(), dlogits.get(), x.get(), V, H, M, true, false, false, DType::bf16, nullptr);
          });
          report("gemm bf16 lm_head dW, " + tag, dims({V, H, M}), dw_ms, 2.0 * f(M) * f(H) * f(V), true,
                 gemm_ceiling);
        }
      }
    }

    // ---------------------------------------------------------------- memory-bound kernels
    for (DType dt : {DType::bf16, DType::fp32}) {
      const std::string tn = std::string(zp::dtype_name(dt));
      {  // LayerNorm, 65536 rows of 1024
        const std::int64_t R = 65536 / scale, C = 1024;
        Buffer x(static_cast<std::size_t>(R * C) * 4), y(static_cast<std::size_t>(R * C) * 4),
            w(static_cast<std::size_t>(C) * 4), b(static_cast<std::size_t>(C) * 4), mean(static_cast<std::size_t>(R) * 4),
            rstd(static_cast<std::size_t>(R) * 4), dy(static_cast<std::size_t>(R * C) * 4),
            dx(static_cast<std::size_t>(R * C) * 4), dw(static_cast<std::size_t>(C) * 4), db(static_cast<std::size_t>(C) * 4);
        fill(x, R * C, dt, 8);
        fill(w, C, dt, 9);
        fill(b, C, dt, 10);
        fill(dy, R * C, dt, 11);
        const double rc = static_cast<double>(R * C) * bytes_of(dt);
        double ms = time_ms(opt, [&] {
          kg::layernorm_forward(y.get(), mean.as<float>(), rstd.as<float>(), x.get(), w.get(), b.get(), R, C, 1e-5f, dt,
                                nullptr);
        });
        report("layernorm fwd " + tn, dims({R, C}), ms, 2.0 * rc, false, copy_ceiling);
        ms = time_ms(opt, [&] {
          kg::layernorm_backward(ctx, dx.get(), dw.get(), db.get(), dy.get(), x.get(), mean.as<float>(),
                                 rstd.as<float>(), w.get(), R, C, false, dt, nullptr);
        });
        // The fewest bytes: dy and x read once, dx written once (the one-pass kernel, rows of at
        // most 128 packs; the two-pass path reads both twice).
        report("layernorm bwd " + tn, dims({R, C}), ms, 3.0 * rc, false, copy_ceiling);
        ms = time_ms(opt, [&] {  // the two-pass path: dx, then the params' column reduction
          kg::layernorm_backward(ctx, dx.get(), nullptr, nullptr, dy.get(), x.get(), mean.as<float>(), rstd.as<float>(),
                                 w.get(), R, C, false, dt, nullptr);
          kg::layernorm_backward(ctx, nullptr, dw.get(), db.get(), dy.get(), x.get(), mean.as<float>(),
                                 rstd.as<float>(), w.get(), R, C, false, dt, nullptr);
        });
        report("layernorm bwd two passes " + tn, dims({R, C}), ms, 3.0 * rc, false, copy_ceiling);
        // GPT-2's and GPT-2 medium's rows (16 × 1024 tokens), dx added into the residual's
        // gradient as the executor runs it, with the one-pass kernel's warps capped at several
        // numbers (ContextOptions::layernorm_backward_warps; 0 one wave, the default; 2048 the
        // cap before it).
        if (dt == DType::bf16)
          for (const std::int64_t C2 : {std::int64_t{768}, std::int64_t{1024}})
            for (const std::int64_t cap : {std::int64_t{0}, std::int64_t{1536}, std::int64_t{2048}}) {
              kg::ContextOptions o;
              o.layernorm_backward_warps = cap;
              kg::Context c(o);
              const std::int64_t R2 = 16384 / scale;
              const double ms2 = time_ms(opt, [&] {
                kg::layernorm_backward(c, dx.get(), dw.get(), db.get(), dy.get(), x.get(), mean.as<float>(),
                                       rstd.as<float>(), w.get(), R2, C2, true, false, dt, nullptr);
              });
              report("layernorm bwd " + tn + " +dx, warps " + (cap == 0 ? std::string("built-in") : std::to_string(cap)),
                     dims({R2, C2}), ms2, 4.0 * static_cast<double>(R2 * C2) * bytes_of(dt), false, copy_ceiling);
            }
        ms = time_ms(opt, [&] { kg::rmsnorm_forward(y.get(), rstd.as<float>(), x.get(), w.get(), R, C, 1e-6f, dt, nullptr); });
        report("rmsnorm fwd " + tn, dims({R, C}), ms, 2.0 * rc, false, copy_ceiling);
        ms = time_ms(opt, [&] { kg::gelu_tanh_forward(y.get(), x.get(), R * C, dt, nullptr); });
        report("gelu_tanh fwd " + tn, dims({R, C}), ms, 2.0 * rc, false, copy_ceiling);
        ms = time_ms(opt, [&] { kg::gelu_tanh_backward(dx.get(), x.get(), dy.get(), R * C, false, dt, nullptr); });
        report("gelu_tanh bwd " + tn, dims({R, C}), ms, 3.0 * rc, false, copy_ceiling);
        ms = time_ms(opt, [&] { kg::add_forward(y.get(), x.get(), dy.get(), R * C, dt, nullptr); });
        report("add fwd " + tn, dims({R, C}), ms, 3.0 * rc, false, copy_ceiling);
        // Dropout p = 0.1 (GPT-2's residual and embedding dropouts): x read, y and the byte mask
        // written; the backward reads dy and the mask and writes dx.
        Buffer mask(static_cast<std::size_t>(R * C));
        const double mb = static_cast<double>(R * C);
        ms = time_ms(opt, [&] {
          kg::dropout_forward(y.get(), mask.as<std::uint8_t>(), x.get(), R * C, 0.1f, 1234, std::uint64_t{7} << 32, dt,
                              nullptr);
        });
        report("dropout fwd " + tn, dims({R, C}), ms, 2.0 * rc + mb, false, copy_ceiling);
        ms = time_ms(opt, [&] {
          kg::dropout_backward(dx.get(), mask.as<std::uint8_t>(), dy.get(), R * C, 0.1f, false, dt, nullptr);
        });
        report("dropout bwd " + tn, dims({R, C}), ms, 2.0 * rc + mb, false, copy_ceiling);
        // A post-LN residual (BERT's, GPT-2's ln_2): dropout(b) + x, then LayerNorm of the sum,
        // as the chain's three kernels and as the one op of --fused-residual-norm. The fused
        // forward reads b and x and writes the sum, the mask and y; its backward reads dy, the
        // sum and the mask and writes the residual's and the dropped operand's gradients.
        Buffer sum(static_cast<std::size_t>(R * C) * 4), gres(static_cast<std::size_t>(R * C) * 4),
            temp(static_cast<std::size_t>(R * C) * 4);
        const std::uint64_t off = std::uint64_t{9} << 32;
        ms = time_ms(opt, [&] {
          kg::dropout_forward(dx.get(), mask.as<std::uint8_t>(), dy.get(), R * C, 0.1f, 1234, off, dt, nullptr);
          kg::add_forward(sum.get(), dx.get(), x.get(), R * C, dt, nullptr);
          kg::layernorm_forward(y.get(), mean.as<float>(), rstd.as<float>(), sum.get(), w.get(), b.get(), R, C, 1e-5f,
                                dt, nullptr);
        });
        // The chain moves 7 tensors and the mask forward (the dropout's output written and read),
        // 5 and the mask backward; the fused op 4 and the mask each way where a warp holds a
        // row (16-bit rows here). fp32 rows of 1024 are too long for the backward's warps: the
        // chain's LayerNorm reads dy and the sum twice (7), the fused op also writes and reads
        // its temporary (8).
        report("residual layernorm fwd, chain " + tn, dims({R, C}), ms, 7.0 * rc + mb, false, copy_ceiling);
        ms = time_ms(opt, [&] {
          kg::dropout_add_layernorm_forward(y.get(), mean.as<float>(), rstd.as<float>(), sum.get(),
                                            mask.as<std::uint8_t>(), dy.get(), x.get(), w.get(), b.get(), R, C, 1e-5f,
                                            0.1f, 1234, off, dt, nullptr);
        });
        report("residual layernorm fwd, fused " + tn, dims({R, C}), ms, 4.0 * rc + mb, false, copy_ceiling);
        ms = time_ms(opt, [&] {
          kg::layernorm_backward(ctx, gres.get(), dw.get(), db.get(), dy.get(), sum.get(), mean.as<float>(),
                                 rstd.as<float>(), w.get(), R, C, false, true, dt, nullptr);
          kg::dropout_backward(dx.get(), mask.as<std::uint8_t>(), gres.get(), R * C, 0.1f, false, dt, nullptr);
        });
        report("residual layernorm bwd, chain " + tn, dims({R, C}), ms, (dt == DType::fp32 ? 7.0 : 5.0) * rc + mb, false,
               copy_ceiling);
        ms = time_ms(opt, [&] {
          kg::dropout_add_layernorm_backward(ctx, dx.get(), gres.get(), dw.get(), db.get(), dy.get(), nullptr, sum.get(),
                                             mask.as<std::uint8_t>(), mean.as<float>(), rstd.as<float>(), w.get(), R,
                                             C, 0.1f, false, false, temp.get(), dt, nullptr);
        });
        report("residual layernorm bwd, fused " + tn, dims({R, C}), ms, (dt == DType::fp32 ? 8.0 : 4.0) * rc + mb, false,
               copy_ceiling);
      }
      {  // eager softmax over GPT-2 attention scores (B·H·T rows of T)
        const std::int64_t R = 16 * 12 * 1024 / scale, n = 1024;
        Buffer x(static_cast<std::size_t>(R * n) * size_of(dt)), y(static_cast<std::size_t>(R * n) * size_of(dt));
        fill(x, R * n, dt, 12, -4.0f, 4.0f);
        const double ms = time_ms(opt, [&] { kg::softmax_forward(y.get(), x.get(), R, n, dt, nullptr); });
        report("softmax fwd " + tn, dims({R, n}), ms, 2.0 * static_cast<double>(R * n) * bytes_of(dt), false,
               copy_ceiling);
      }
      {  // cross entropy over the GPT-2 vocabulary
        const std::int64_t N = 16 * 1024 / scale, V = 50257;
        Buffer logits(static_cast<std::size_t>(N * V) * size_of(dt)), lse(static_cast<std::size_t>(N) * 4), loss(4);
        fill(logits, N * V, dt, 13, -4.0f, 4.0f);
        std::vector<std::int64_t> tg(static_cast<std::size_t>(N));
        for (std::size_t i = 0; i < tg.size(); ++i) tg[i] = static_cast<std::int64_t>((i * 7919) % 50257);
        Buffer dtg(tg.size() * 8);
        ZP_CUDA_CHECK(cudaMemcpy(dtg.get(), tg.data(), tg.size() * 8, cudaMemcpyHostToDevice));
        const double nv = static_cast<double>(N * V) * bytes_of(dt);
        double ms = time_ms(opt, [&] {
          kg::cross_entropy_forward(ctx, loss.as<float>(), lse.as<float>(), logits.get(), dtg.as<std::int64_t>(), N, V,
                                    kg::kIgnoreIndex, dt, nullptr);
        });
        report("cross_entropy fwd " + tn, dims({N, V}), ms, nv, false, copy_ceiling);
        ms = time_ms(opt, [&] {
          kg::cross_entropy_backward(ctx, logits.get(), logits.get(), lse.as<float>(), dtg.as<std::int64_t>(), N, V,
                                     1e-3f, false, kg::kIgnoreIndex, dt, nullptr);
        });
        report("cross_entropy bwd in place " + tn, dims({N, V}), ms, 2.0 * nv, false, copy_ceiling);
      }
    }
    {  // embedding gradient (GPT-2 wte), bf16
      const std::int64_t N = 16 * 1024 / scale, V = 50257, C = 768;
      Buffer dy(static_cast<std::size_t>(N * C) * 2), dw(static_cast<std::size_t>(V * C) * 2), ids(static_cast<std::size_t>(N) * 8);
      fill(dy, N * C, DType::bf16, 14);
      std::vector<std::int64_t> h(static_cast<std::size_t>(N));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::int64_t>((i * 104729) % 50257);
      ZP_CUDA_CHECK(cudaMemcpy(ids.get(), h.data(), h.size() * 8, cudaMemcpyHostToDevice));
      const double ms = time_ms(opt, [&] {
        kg::embedding_backward(ctx, dw.get(), ids.as<std::int64_t>(), dy.get(), N, V, C, -1, false, DType::bf16,
                               nullptr);
      });
      report("embedding bwd bf16 (zero + scatter)", dims({N, V, C}), ms,
             static_cast<double>(V * C + N * C) * 2.0, false, copy_ceiling);
    }
    {  // optimizer over a 350M-parameter flat partition (fp32 master, bf16 copy) and its norm
      const std::int64_t n = 350'000'000 / scale;
      Buffer p(static_cast<std::size_t>(n) * 4), g(static_cast<std::size_t>(n) * 4), m(static_cast<std::size_t>(n) * 4),
          v(static_cast<std::size_t>(n) * 4), p16(static_cast<std::size_t>(n) * 2), norm(8);
      fill(p, n, DType::fp32, 15);
      fill(g, n, DType::fp32, 16, -1e-3f, 1e-3f);
      fill(m, n, DType::fp32, 17, -1e-4f, 1e-4f);
      fill(v, n, DType::fp32, 18, 0.0f, 1e-6f);
      kg::AdamTensor t;
      t.p = p.as<float>();
      t.g = g.as<const float>();
      t.m = m.as<float>();
      t.v = v.as<float>();
      t.p16 = p16.get();
      t.n = n;
      kg::AdamConfig cfg;
      cfg.weight_decay = 0.01;
      cfg.decoupled = true;
      std::int64_t step = 0;
      double ms = time_ms(opt, [&] { kg::adam_step_multi(&t, 1, ++step, cfg, kg::StepOptions{}, nullptr); });
      report("adamw multi-tensor + bf16 copy", dims({n}), ms, static_cast<double>(n) * (16.0 + 12.0 + 2.0), false,
             copy_ceiling);
      ms = time_ms(opt, [&] { kg::sum_squares(ctx, norm.as<double>(), g.get(), n, false, DType::fp32, nullptr); });
      report("sum_squares fp32", dims({n}), ms, static_cast<double>(n) * 4.0, false, copy_ceiling);
      ms = time_ms(opt, [&] { kg::convert(p16.get(), DType::bf16, p.get(), DType::fp32, n, nullptr); });
      report("convert fp32->bf16", dims({n}), ms, static_cast<double>(n) * 6.0, false, copy_ceiling);
    }

    // ---------------------------------------------------------------- a step's per-tensor copies
    {  // GPT-2 124M's 148 parameter tensors, bf16 gradients into a flat fp32 buffer (BF16_Optimizer's
       // fp32 copies): one convert per tensor, as the CUDA device ran them, against multi_map.
      std::vector<std::int64_t> sizes = {50257 * 768, 1024 * 768};
      for (int l = 0; l < 12; ++l)
        for (std::int64_t s : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768})
          sizes.push_back(s);
      sizes.push_back(768);
      sizes.push_back(768);
      std::int64_t n = 0;
      for (std::int64_t s : sizes) n += s;
      Buffer g16(static_cast<std::size_t>(n) * 2), flat(static_cast<std::size_t>(n) * 4), norm(8);
      fill(g16, n, DType::bf16, 31);
      std::vector<kg::MultiRun> runs;
      std::int64_t at = 0;
      for (std::int64_t s : sizes) {
        runs.push_back({flat.as<float>() + at, static_cast<const char*>(g16.get()) + at * 2, s});
        at += s;
      }
      double ms = time_ms(opt, [&] {
        for (const auto& r : runs) kg::convert(r.y, DType::fp32, r.x, DType::bf16, r.n, nullptr);
      });
      const std::string shape = std::to_string(sizes.size()) + " tensors";
      report("148 converts bf16->fp32", shape, ms, static_cast<double>(n) * 6.0, false, copy_ceiling);
      ms = time_ms(opt, [&] {
        kg::multi_map(runs.data(), static_cast<std::int64_t>(runs.size()), kg::MultiMode::copy, DType::fp32, DType::bf16,
                      nullptr);
      });
      report("multi_map bf16->fp32", shape, ms, static_cast<double>(n) * 6.0, false, copy_ceiling);
      ms = time_ms(opt, [&] {
        ZP_CUDA_CHECK(cudaMemsetAsync(norm.get(), 0, 8, nullptr));
        for (const auto& r : runs) kg::sum_squares(ctx, norm.as<double>(), r.x, r.n, true, DType::bf16, nullptr);
      });
      report("148 sum_squares bf16", shape, ms, static_cast<double>(n) * 2.0, false, copy_ceiling);
      ms = time_ms(opt, [&] {
        ZP_CUDA_CHECK(cudaMemsetAsync(norm.get(), 0, 8, nullptr));
        kg::multi_sum_squares(ctx, norm.as<double>(), runs.data(), static_cast<std::int64_t>(runs.size()), DType::bf16,
                              nullptr);
      });
      report("multi_sum_squares bf16", shape, ms, static_cast<double>(n) * 2.0, false, copy_ceiling);
    }

    // ---------------------------------------------------------------- fused attention
    {
      struct Attn {
        const char* name;
        std::int64_t B, H, T, D;
        bool causal, mask;
        float p;
      };
      const Attn attns[] = {{"gpt2 causal", 16 / scale, 12, 1024, 64, true, false, 0.0f},
                            {"gpt2 causal dropout 0.1", 16 / scale, 12, 1024, 64, true, false, 0.1f},
                            {"gpt2-medium causal", 16 / scale, 16, 1024, 64, true, false, 0.0f},
                            {"bert-large mask dropout 0.1", 64 / scale, 16, 128, 64, false, true, 0.1f},
                            {"llama causal D=128", 4 / (opt.quick ? 2 : 1), 32, 2048, 128, true, false, 0.0f}};
      kg::ContextOptions chunk32_options;  // the backward in steps of 32 positions (ContextOptions)
      chunk32_options.sdpa_backward_chunk = 32;
      kg::Context chunk32(chunk32_options);
      kg::ContextOptions one_pass_options;  // dQ from the dK/dV kernel's dS (D <= 64; else the two passes)
      one_pass_options.sdpa_backward_one_pass = true;
      kg::Context one_pass(one_pass_options);
      kg::ContextOptions atomic_options = one_pass_options;  // one pass, dQ's sums by atomic adds
      atomic_options.sdpa_backward_atomic_dq = true;
      kg::Context atomic_pass(atomic_options);
      kg::ContextOptions kv_registers_options;  // dK/dV: K and V in registers, three blocks an SM
      kv_registers_options.sdpa_backward_kv_registers = true;
      kg::Context kv_registers(kv_registers_options);
      // cuDNN's flash attention (ContextOptions::sdpa_cudnn; no additive mask), where built.
      kg::ContextOptions cudnn_options;
      cudnn_options.sdpa_cudnn = true;
      kg::Context cudnn(cudnn_options);
      Buffer rng(16);
      const std::int64_t seed_offset[2] = {7, 0};
      ZP_CUDA_CHECK(cudaMemcpy(rng.get(), seed_offset, sizeof seed_offset, cudaMemcpyHostToDevice));
      const auto* rng_ptr = static_cast<const std::int64_t*>(rng.get());
      for (DType dt : {DType::bf16, DType::fp16}) {
        for (const Attn& a : attns) {
          const std::int64_t n = a.B * a.H * a.T * a.D, rows_n = a.B * a.H * a.T;
          const std::size_t eb = static_cast<std::size_t>(zp::dtype_size(dt));
          Buffer q(static_cast<std::size_t>(n) * eb), k(static_cast<std::size_t>(n) * eb), v(static_cast<std::size_t>(n) * eb),
              o(static_cast<std::size_t>(n) * eb), dout(static_cast<std::size_t>(n) * eb), dq(static_cast<std::size_t>(n) * eb),
              dk(static_cast<std::size_t>(n) * eb), dv(static_cast<std::size_t>(n) * eb),
              lse(static_cast<std::size_t>(rows_n) * 4), mask(static_cast<std::size_t>(a.B * a.T) * eb);
          fill(q, n, dt, 20);
          fill(k, n, dt, 21);
          fill(v, n, dt, 22);
          fill(dout, n, dt, 23);
          fill(mask, a.B * a.T, dt, 24, -1.0f, 0.0f);
          const float sc = 1.0f / std::sqrt(static_cast<float>(a.D));
          const void* mp = a.mask ? mask.get() : nullptr;
          const double pairs = a.causal ? f(a.T) * f(a.T + 1) / 2.0 : f(a.T) * f(a.T);
          const double fwd_flops = 4.0 * static_cast<double>(a.B * a.H) * pairs * static_cast<double>(a.D);
          const std::string shape = dims({a.B, a.H, a.T, a.D});
          double ms = time_ms(opt, [&] {
            kg::sdpa_forward(o.get(), lse.as<float>(), q.get(), k.get(), v.get(), mp, a.B, a.H, a.T, a.D, a.causal, sc,
                             a.p, 7, 0, dt, nullptr);
          });
          report(std::string("sdpa fwd ") + std::string(zp::dtype_name(dt)) + " " + a.name, shape, ms, fwd_flops, true,
                 gemm_ceiling);
          ms = time_ms(opt, [&] {
            kg::sdpa_backward(ctx, dq.get(), dk.get(), dv.get(), dout.get(), q.get(), k.get(), v.get(), o.get(),
                              lse.as<float>(), mp, a.B, a.H, a.T, a.D, a.causal, sc, a.p, 7, 0, dt, nullptr);
          });
          // 5 products of the forward's size (S and dP recomputed twice: counted once, as FA2 reports).
          report(std::string("sdpa bwd ") + std::string(zp::dtype_name(dt)) + " " + a.name, shape, ms,
                 2.5 * fwd_flops, true, gemm_ceiling);
          ms = time_ms(opt, [&] {
            kg::sdpa_backward(chunk32, dq.get(), dk.get(), dv.get(), dout.get(), q.get(), k.get(), v.get(), o.get(),
                              lse.as<float>(), mp, a.B, a.H, a.T, a.D, a.causal, sc, a.p, 7, 0, dt, nullptr);
          });
          report(std::string("sdpa bwd ") + std::string(zp::dtype_name(dt)) + " " + a.name + ", steps of 32", shape,
                 ms, 2.5 * fwd_flops, true, gemm_ceiling);
          if (!a.mask && kg::sdpa_cudnn_refusal(a.T, a.D, dt).empty()) {
            ms = time_ms(opt, [&] {
              kg::sdpa_cudnn_forward(cudnn, o.get(), lse.as<float>(), q.get(), k.get(), v.get(), a.B, a.H, a.H, a.T,
                                     a.D, a.causal, sc, a.p, rng_ptr, dt, nullptr);
            });
            report(std::string("sdpa fwd ") + std::string(zp::dtype_name(dt)) + " " + a.name + ", cuDNN " +
                       std::to_string(kg::sdpa_cudnn_version()),
                   shape, ms, fwd_flops, true, gemm_ceiling);
            ms = time_ms(opt, [&] {
              kg::sdpa_cudnn_backward(cudnn, dq.get(), dk.get(), dv.get(), dout.get(), q.get(), k.get(), v.get(),
                                      o.get(), lse.as<float>(), a.B, a.H, a.H, a.T, a.D, a.causal, sc, a.p, rng_ptr,
                                      dt, nullptr, kg::SdpaAccumulate{false, false, false});
            });
            report(std::string("sdpa bwd ") + std::string(zp::dtype_name(dt)) + " " + a.name + ", cuDNN", shape, ms,
                   2.5 * fwd_flops, true, gemm_ceiling);
          }
          if (a.D <= 64) {  // K and V in registers only up to head dim 64
            ms = time_ms(opt, [&] {
              kg::sdpa_backward(kv_registers, dq.get(), dk.get(), dv.get(), dout.get(), q.get(), k.get(), v.get(), o.get(),
                                lse.as<float>(), mp, a.B, a.H, a.T, a.D, a.causal, sc, a.p, 7, 0, dt, nullptr);
            });
            report(std::string("sdpa bwd ") + std::string(zp::dtype_name(dt)) + " " + a.name + ", K/V in registers",
                   shape, ms, 2.5 * fwd_flops, true, gemm_ceiling);
          }
          if (a.D <= 64) {  // one pass only up to head dim 64
            ms = time_ms(opt, [&] {
              kg::sdpa_backward(one_pass, dq.get(), dk.get(), dv.get(), dout.get(), q.get(), k.get(), v.get(), o.get(),
                                lse.as<float>(), mp, a.B, a.H, a.T, a.D, a.causal, sc, a.p, 7, 0, dt, nullptr);
            });
            report(std::string("sdpa bwd ") + std::string(zp::dtype_name(dt)) + " " + a.name + ", one pass", shape, ms,
                   2.5 * fwd_flops, true, gemm_ceiling);
            ms = time_ms(opt, [&] {
              kg::sdpa_backward(atomic_pass, dq.get(), dk.get(), dv.get(), dout.get(), q.get(), k.get(), v.get(), o.get(),
                                lse.as<float>(), mp, a.B, a.H, a.T, a.D, a.causal, sc, a.p, 7, 0, dt, nullptr);
            });
            report(std::string("sdpa bwd ") + std::string(zp::dtype_name(dt)) + " " + a.name + ", one pass, atomic dq",
                   shape, ms, 2.5 * fwd_flops, true, gemm_ceiling);
          }
        }
      }
    }
    ZP_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zeroplan_bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
