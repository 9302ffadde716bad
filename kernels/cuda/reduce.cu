#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/reduce.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::kWidth;

constexpr int kReduceBlock = 256;
constexpr std::int64_t kMaxPartials = 1024;
constexpr std::int64_t kPerThread = 64;  // elements per thread before another block is added

template <class T, bool Vec, bool Square>
__global__ void partials_kernel(double* __restrict__ partial, const T* __restrict__ x, std::int64_t n) {
  __shared__ double sm[33];
  constexpr int W = kWidth<T, Vec>;
  double s = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * W;
  for (std::int64_t j = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W; j < n; j += stride) {
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
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
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
