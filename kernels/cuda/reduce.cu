#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/reduce.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::kWidth;

constexpr int kReduceBlock = 256;
constexpr std::int64_t kMaxPartials = 1024;
constexpr std::int64_t kPerThread = 64;  // elements per thread before another block is added
constexpr int kInFlight = 4;             // loads a thread issues before it adds (memory-level parallelism)

// partial[block] = the block's sum; with `out` (a grid of one block), out[0] = that sum (plus
// out[0] when accumulating) directly: the same bits as partials then finish_kernel, one launch
// fewer (the gradient norm of stages 1-2 visits every parameter, most of them small).
template <class T, bool Vec, bool Square>
__global__ void partials_kernel(double* __restrict__ partial, const T* __restrict__ x, std::int64_t n,
                                double* __restrict__ out = nullptr, bool accumulate = false) {
  __shared__ double sm[33];
  constexpr int W = kWidth<T, Vec>;
  double s = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * W;
  std::int64_t j = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  // kInFlight strides at a time while they fit whole, their loads first (one load in flight
  // per thread leaves HBM idle between them). The order of the additions is fixed by the
  // grid, so the result is the same bits run to run.
  for (; j + (kInFlight - 1) * stride + W <= n; j += kInFlight * stride) {
    float v[kInFlight][W];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) detail::load_f<T, W>(x + j + u * stride, v[u]);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const double d = v[u][k];
        s += Square ? d * d : d;
      }
  }
  for (; j < n; j += stride) {
    if (j + W <= n) {
      float v[W];
      detail::load_f<T, W>(x + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const double d = v[k];
        s += Square ? d * d : d;
      }
    } else {
      for (std::int64_t i = j; i < n; ++i) {
        const double d = detail::to_float(x[i]);
        s += Square ? d * d : d;
      }
    }
  }
  s = detail::block_sum(s, sm);
  if (threadIdx.x != 0) return;
  if (out == nullptr) partial[blockIdx.x] = s;
  else out[0] = accumulate ? out[0] + (0.0 + s) : 0.0 + s;
}

__global__ void finish_kernel(double* __restrict__ out, const double* __restrict__ partial, std::int64_t count,
                              bool accumulate) {
  __shared__ double sm[33];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = detail::block_sum(s, sm);
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + s : s;
}

template <bool Square>
void reduce(Context& ctx, double* out, const void* x, std::int64_t n, bool accumulate, DType dt, cudaStream_t stream,
            const char* what) {
  require_float(dt, what);
  if (n <= 0) {
    if (!accumulate) ZP_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  std::int64_t blocks = detail::ceil_div(n, kReduceBlock * kPerThread);
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  if (blocks == 1) {  // one block: its sum is the result
    detail::dispatch(dt, what, [&](auto tag) {
      using T = decltype(tag);
      if (detail::aligned16(x))
        partials_kernel<T, true, Square><<<1, kReduceBlock, 0, stream>>>(nullptr, static_cast<const T*>(x), n, out,
                                                                          accumulate);
      else
        partials_kernel<T, false, Square><<<1, kReduceBlock, 0, stream>>>(nullptr, static_cast<const T*>(x), n, out,
                                                                           accumulate);
      ZP_CUDA_CHECK_LAUNCH("partials_kernel");
    });
    return;
  }
  auto* partial = static_cast<double*>(ctx.scratch(sizeof(double) * static_cast<std::size_t>(blocks), what));
  detail::dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    if (detail::aligned16(x))
      partials_kernel<T, true, Square><<<static_cast<unsigned>(blocks), kReduceBlock, 0, stream>>>(
          partial, static_cast<const T*>(x), n);
    else
      partials_kernel<T, false, Square><<<static_cast<unsigned>(blocks), kReduceBlock, 0, stream>>>(
          partial, static_cast<const T*>(x), n);
    ZP_CUDA_CHECK_LAUNCH("partials_kernel");
  });
  finish_kernel<<<1, kReduceBlock, 0, stream>>>(out, partial, blocks, accumulate);
  ZP_CUDA_CHECK_LAUNCH("finish_kernel");
}

}  // namespace

void sum_squares(Context& ctx, double* out, const void* x, std::int64_t n, bool accumulate, DType dt,
                 cudaStream_t stream) {
  reduce<true>(ctx, out, x, n, accumulate, dt, stream, "sum_squares");
}

void sum(Context& ctx, double* out, const void* x, std::int64_t n, bool accumulate, DType dt, cudaStream_t stream) {
  reduce<false>(ctx, out, x, n, accumulate, dt, stream, "sum");
}

}  // namespace zp::kernels::cuda
