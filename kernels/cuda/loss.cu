#include <cstdint>
#include <type_traits>

#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/loss.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::block_max;
using detail::block_sum;
using detail::load_f;
using detail::to_float;

constexpr int kMeanBlock = 1024;

// Calls f(j, std::integral_constant<int, W>) over a row of V elements, the block's threads
// taking turns: with Vec, whole 16-byte groups (W = kPack) between the row's first and last
// 16-byte boundaries (of `anchor`, the row in memory: any row of any width, GPT-2's 50257
// included, and every operand whose base is congruent to it modulo 16 bytes), the few
// elements before and after singly (W = 1); without, every element singly.
template <class T, bool Vec, class F>
__device__ __forceinline__ void for_row(const T* anchor, std::int64_t V, F&& f) {
  constexpr int P = detail::kPack<T>;
  std::int64_t head = V, end = V;
  if constexpr (Vec) {
    const auto mis = static_cast<std::int64_t>((reinterpret_cast<std::uintptr_t>(anchor) & 15u) / sizeof(T));
    head = (P - mis) % P < V ? (P - mis) % P : V;
    end = head + (V - head) / P * P;
  }
  const std::int64_t t = threadIdx.x, n = blockDim.x;
  for (std::int64_t j = t; j < head; j += n) f(j, std::integral_constant<int, 1>{});
  for (std::int64_t j = head + t * P; j < end; j += n * P) f(j, std::integral_constant<int, P>{});
  for (std::int64_t j = end + t; j < V; j += n) f(j, std::integral_constant<int, 1>{});
}

// logsumexp of one row, every thread of the block taking part (online max and sum per
// thread, then merged in a fixed tree). NaN when the row holds a NaN or is -inf
// everywhere; a +inf logit gives NaN as well (inf - inf), as the CPU twin.
template <class T, bool Vec>
__device__ float row_logsumexp(const T* x, std::int64_t V, float* sm) {
  float m = -INFINITY, s = 0.0f;
  bool nan = false;
  for_row<T, Vec>(x, V, [&](std::int64_t j, auto width) {
    constexpr int W = decltype(width)::value;
    float v[W];
    load_f<T, W>(x + j, v);
    float cm = -INFINITY;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      cm = fmaxf(cm, v[k]);
      nan = nan || v[k] != v[k];
    }
    if (cm > m) {
      s = s * expf(m - cm);
      m = cm;
    }
    if (m != -INFINITY) {
#pragma unroll
      for (int k = 0; k < W; ++k) s += expf(v[k] - m);
    }
  });
  const float M = block_max(m, sm);
  const float any_nan = block_max(nan ? 1.0f : 0.0f, sm);
  const float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), sm);
  if (any_nan > 0.0f || M == -INFINITY) return NAN;
  return M + logf(S);
}

// Per row: lse, and the row's loss lse - x[target] (0 when ignored).
template <class T, bool Vec>
__global__ void ce_forward_kernel(float* __restrict__ row_loss, float* __restrict__ lse, const T* __restrict__ logits,
                                  const std::int64_t* __restrict__ targets, std::int64_t N, std::int64_t V,
                                  std::int64_t ld, std::int64_t ignore_index) {
  __shared__ float sm[33];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* x = logits + row * ld;
    const float l = row_logsumexp<T, Vec>(x, V, sm);
    if (threadIdx.x == 0) {
      if (lse != nullptr) lse[row] = l;
      const std::int64_t t = targets[row];
      row_loss[row] = t == ignore_index ? 0.0f : l - to_float(x[t]);
    }
  }
}

template <class T, bool Vec>
__global__ void log_softmax_kernel(T* logp, const T* logits, std::int64_t N, std::int64_t V) {
  __shared__ float sm[33];
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* x = logits + row * V;
    const float l = row_logsumexp<T, Vec>(x, V, sm);
    for_row<T, Vec>(x, V, [&](std::int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      float v[W];
      load_f<T, W>(x + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] -= l;
      detail::store_f<T, W>(logp + row * V + j, v);
    });
  }
}

// loss[0] = mean of the rows' losses over the rows not ignored: one block, each thread a
// fixed strided subset summed in double, then a fixed tree. From logp (nll) when
// row_loss is nullptr: the row's loss is -logp[target].
template <class T>
__global__ void mean_loss_kernel(float* __restrict__ loss, const float* __restrict__ row_loss,
                                 const T* __restrict__ logp, const std::int64_t* __restrict__ targets, std::int64_t N,
                                 std::int64_t V, std::int64_t ignore_index) {
  __shared__ double sm[33];
  double s = 0.0, c = 0.0;
  for (std::int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const std::int64_t t = targets[i];
    if (t == ignore_index) continue;
    s += row_loss != nullptr ? static_cast<double>(row_loss[i]) : -static_cast<double>(to_float(logp[i * V + t]));
    c += 1.0;
  }
  s = block_sum(s, sm);
  c = block_sum(c, sm);
  if (threadIdx.x == 0) loss[0] = c > 0.0 ? static_cast<float>(s / c) : 0.0f;
}

__global__ void count_kernel(float* __restrict__ count, const std::int64_t* __restrict__ targets, std::int64_t N,
                             std::int64_t ignore_index) {
  __shared__ float sm[33];
  float c = 0.0f;
  for (std::int64_t i = threadIdx.x; i < N; i += blockDim.x) c += targets[i] != ignore_index ? 1.0f : 0.0f;
  c = block_sum(c, sm);
  if (threadIdx.x == 0) count[0] = c;
}

// dlogits = scale * (p - onehot(target)), p = exp(x - lse) (or exp(logp)); scale = dloss /
// count. In place is allowed: each element is read before it is written, by one thread.
template <class T, bool Vec, bool FromLogp>
__global__ void ce_backward_kernel(T* d, const T* x, const float* __restrict__ lse,
                                   const std::int64_t* __restrict__ targets, const float* __restrict__ count,
                                   std::int64_t N, std::int64_t V, std::int64_t ld, float dloss, bool accumulate,
                                   std::int64_t ignore_index) {
  __shared__ float sm[33];
  const float cnt = count[0];
  const float scale = cnt > 0.0f ? dloss / cnt : 0.0f;
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const std::int64_t t = targets[row];
    T* dr = d + row * ld;
    const T* xr = x + row * ld;
    if (t == ignore_index) {
      if (!accumulate) {
        for_row<T, Vec>(xr, V, [&](std::int64_t j, auto width) {
          constexpr int W = decltype(width)::value;
          float o[W];
#pragma unroll
          for (int k = 0; k < W; ++k) o[k] = 0.0f;
          detail::store_f<T, W>(dr + j, o);
        });
      }
      continue;
    }
    float l = 0.0f;
    if (!FromLogp) l = lse != nullptr ? lse[row] : row_logsumexp<T, Vec>(xr, V, sm);
    for_row<T, Vec>(xr, V, [&](std::int64_t j, auto width) {
      constexpr int W = decltype(width)::value;
      float v[W], o[W];
      load_f<T, W>(xr + j, v);
      if (accumulate) load_f<T, W>(dr + j, o);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float g = scale * expf(FromLogp ? v[k] : v[k] - l);
        o[k] = accumulate ? __fadd_rn(o[k], g) : g;
        if (j + k == t) o[k] = __fsub_rn(o[k], scale);
      }
      detail::store_f<T, W>(dr + j, o);
    });
  }
}

// Whole 16-byte groups in every row (for_row) when the operands' bases are congruent modulo
// 16 bytes (in place, or both aligned): rows the same number of elements apart then share their
// boundaries whatever that number is (for_row anchors each row at its own first boundary).
template <class T>
bool rows_vec(std::int64_t V, const void* a, const void* b) {
  const auto mod = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) & 15u; };
  return V >= detail::kPack<T> && (b == nullptr || mod(a) == mod(b)) && mod(a) % sizeof(T) == 0;
}

template <class T>
dim3 row_block(std::int64_t V, bool vec) {
  return dim3(static_cast<unsigned>(detail::row_threads(vec ? V / detail::kPack<T> : V)));
}

void count_targets(float* count, const std::int64_t* targets, std::int64_t N, std::int64_t ignore_index,
                   cudaStream_t stream) {
  count_kernel<<<1, kMeanBlock, 0, stream>>>(count, targets, N, ignore_index);
  ZP_CUDA_CHECK_LAUNCH("count_kernel");
}

template <bool FromLogp>
void backward(Context& ctx, void* dlogits, const void* x, const float* lse, const std::int64_t* targets,
              std::int64_t N, std::int64_t V, std::int64_t ld, float dloss, bool accumulate, std::int64_t ignore_index,
              DType dt, cudaStream_t stream, const char* what) {
  require_float(dt, what);
  if (N <= 0 || V <= 0) return;
  auto* count = static_cast<float*>(ctx.scratch(sizeof(float), what));
  count_targets(count, targets, N, ignore_index, stream);
  detail::dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(V, dlogits, x);
    if (vec)
      ce_backward_kernel<T, true, FromLogp><<<detail::grid_for(N, 1), row_block<T>(V, true), 0, stream>>>(
          static_cast<T*>(dlogits), static_cast<const T*>(x), lse, targets, count, N, V, ld, dloss, accumulate,
          ignore_index);
    else
      ce_backward_kernel<T, false, FromLogp><<<detail::grid_for(N, 1), row_block<T>(V, false), 0, stream>>>(
          static_cast<T*>(dlogits), static_cast<const T*>(x), lse, targets, count, N, V, ld, dloss, accumulate,
          ignore_index);
    ZP_CUDA_CHECK_LAUNCH("ce_backward_kernel");
  });
}

}  // namespace

void cross_entropy_forward(Context& ctx, float* loss, float* lse, const void* logits, const std::int64_t* targets,
                           std::int64_t N, std::int64_t V, std::int64_t ignore_index, DType dt, cudaStream_t stream,
                           std::int64_t ld) {
  if (ld == 0) ld = V;
  require_float(dt, "cross_entropy_forward");
  if (N <= 0) {
    ZP_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), stream));
    return;
  }
  auto* row_loss = static_cast<float*>(ctx.scratch(sizeof(float) * static_cast<std::size_t>(N), "cross_entropy_forward"));
  detail::dispatch(dt, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(V, logits, nullptr);
    if (vec)
      ce_forward_kernel<T, true><<<detail::grid_for(N, 1), row_block<T>(V, true), 0, stream>>>(
          row_loss, lse, static_cast<const T*>(logits), targets, N, V, ld, ignore_index);
    else
      ce_forward_kernel<T, false><<<detail::grid_for(N, 1), row_block<T>(V, false), 0, stream>>>(
          row_loss, lse, static_cast<const T*>(logits), targets, N, V, ld, ignore_index);
    ZP_CUDA_CHECK_LAUNCH("ce_forward_kernel");
    mean_loss_kernel<T><<<1, kMeanBlock, 0, stream>>>(loss, row_loss, nullptr, targets, N, V, ignore_index);
    ZP_CUDA_CHECK_LAUNCH("mean_loss_kernel");
  });
}

void cross_entropy_backward(Context& ctx, void* dlogits, const void* logits, const float* lse,
                            const std::int64_t* targets, std::int64_t N, std::int64_t V, float dloss, bool accumulate,
                            std::int64_t ignore_index, DType dt, cudaStream_t stream, std::int64_t ld) {
  backward<false>(ctx, dlogits, logits, lse, targets, N, V, ld == 0 ? V : ld, dloss, accumulate, ignore_index, dt,
                  stream, "cross_entropy_backward");
}

void log_softmax_forward(void* logp, const void* logits, std::int64_t N, std::int64_t V, DType dt,
                         cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  detail::dispatch(dt, "log_softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(V, logp, logits);
    if (vec)
      log_softmax_kernel<T, true><<<detail::grid_for(N, 1), row_block<T>(V, true), 0, stream>>>(
          static_cast<T*>(logp), static_cast<const T*>(logits), N, V);
    else
      log_softmax_kernel<T, false><<<detail::grid_for(N, 1), row_block<T>(V, false), 0, stream>>>(
          static_cast<T*>(logp), static_cast<const T*>(logits), N, V);
    ZP_CUDA_CHECK_LAUNCH("log_softmax_kernel");
  });
}

void nll_loss_forward(float* loss, const void* logp, const std::int64_t* targets, std::int64_t N, std::int64_t V,
                      std::int64_t ignore_index, DType dt, cudaStream_t stream) {
  require_float(dt, "nll_loss_forward");
  detail::dispatch(dt, "nll_loss_forward", [&](auto tag) {
    using T = decltype(tag);
    mean_loss_kernel<T><<<1, kMeanBlock, 0, stream>>>(loss, nullptr, static_cast<const T*>(logp), targets, N, V,
                                                       ignore_index);
    ZP_CUDA_CHECK_LAUNCH("mean_loss_kernel");
  });
}

void log_softmax_nll_backward(Context& ctx, void* dlogits, const void* logp, const std::int64_t* targets,
                              std::int64_t N, std::int64_t V, float dloss, bool accumulate, std::int64_t ignore_index,
                              DType dt, cudaStream_t stream) {
  backward<true>(ctx, dlogits, logp, nullptr, targets, N, V, V, dloss, accumulate, ignore_index, dt, stream,
                 "log_softmax_nll_backward");
}

}  // namespace zp::kernels::cuda
