#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/detail.cuh"

namespace zp::kernels::cuda {

namespace {

constexpr int kConvertBlock = 256;
constexpr int kConvertWidth = 8;  // elements per thread on the aligned path: 16 or 32 bytes

// What a conversion does with y: overwrite it, or add into it x rounded to Y first (autograd's
// cast, then the add), or x as it is (the sum of the two values in fp32, rounded once).
enum Mode : int { kCopy, kAddRounded, kAddExact };

// y = round_Y(x); kAddRounded: y = round_Y(y + round_Y(x)); kAddExact: y = round_Y(y + x), the
// sums in fp32 (as copy_accumulate's).
template <class Y, class X, bool Vec, int M>
__global__ void convert_kernel(Y* __restrict__ y, const X* __restrict__ x, std::int64_t n) {
  constexpr int W = Vec ? kConvertWidth : 1;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * W;
  for (std::int64_t j = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W; j < n; j += stride) {
    if (j + W <= n) {
      float v[W];
      detail::load_f<X, W>(x + j, v);
      if constexpr (M != kCopy) {
        float u[W];
        detail::load_f<Y, W>(y + j, u);
#pragma unroll
        for (int k = 0; k < W; ++k)
          v[k] = __fadd_rn(u[k], M == kAddRounded ? detail::to_float(detail::from_float<Y>(v[k])) : v[k]);
      }
      detail::store_f<Y, W>(y + j, v);
    } else {
      for (std::int64_t i = j; i < n; ++i) {
        const float xv = detail::to_float(x[i]);
        const float v = M == kAddExact ? xv : detail::to_float(detail::from_float<Y>(xv));
        y[i] = detail::from_float<Y>(M != kCopy ? __fadd_rn(detail::to_float(y[i]), v) : v);
      }
    }
  }
}

template <int M>
void launch_convert(void* y, DType y_dt, const void* x, DType x_dt, std::int64_t n, cudaStream_t stream,
                    const char* what) {
  require_float(y_dt, what);
  require_float(x_dt, what);
  const bool vec = detail::aligned16(y) && detail::aligned16(x);
  detail::dispatch(y_dt, what, [&](auto ytag) {
    using Y = decltype(ytag);
    detail::dispatch(x_dt, what, [&](auto xtag) {
      using X = decltype(xtag);
      if (vec)
        convert_kernel<Y, X, true, M><<<detail::grid_for(detail::ceil_div(n, kConvertWidth), kConvertBlock),
                                          kConvertBlock, 0, stream>>>(static_cast<Y*>(y), static_cast<const X*>(x), n);
      else
        convert_kernel<Y, X, false, M><<<detail::grid_for(n, kConvertBlock), kConvertBlock, 0, stream>>>(
            static_cast<Y*>(y), static_cast<const X*>(x), n);
      ZP_CUDA_CHECK_LAUNCH("convert_kernel");
    });
  });
}

}  // namespace

void convert_accumulate(void* y, DType y_dt, const void* x, DType x_dt, std::int64_t n, cudaStream_t stream) {
  if (n > 0) launch_convert<kAddRounded>(y, y_dt, x, x_dt, n, stream, "convert_accumulate");
}

void add_mixed(void* y, DType y_dt, const void* x, DType x_dt, std::int64_t n, cudaStream_t stream) {
  if (n > 0) launch_convert<kAddExact>(y, y_dt, x, x_dt, n, stream, "add_mixed");
}

void convert(void* y, DType y_dt, const void* x, DType x_dt, std::int64_t n, cudaStream_t stream) {
  require_float(y_dt, "convert");
  require_float(x_dt, "convert");
  if (n <= 0) return;
  if (y_dt == x_dt) {
    if (y != x)
      ZP_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n * dtype_size(x_dt)), cudaMemcpyDeviceToDevice,
                                    stream));
    return;
  }
  launch_convert<kCopy>(y, y_dt, x, x_dt, n, stream, "convert");
}

}  // namespace zp::kernels::cuda
