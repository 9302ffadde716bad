#include "kernels/common/philox.hpp"
#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/dropout.cuh"

namespace zp::kernels::cuda {

namespace {

constexpr int kDropoutBlock = 256;

float keep_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

// One thread per Philox block: the (up to) four elements whose stream positions
// offset + i share the block's counter, so each block is computed once.
template <class T>
__global__ void dropout_forward_kernel(T* __restrict__ y, std::uint8_t* __restrict__ mask, const T* __restrict__ x,
                                       std::int64_t n, float keep, float scale, std::uint64_t seed,
                                       std::uint64_t offset) {
  const std::uint64_t first = offset >> 2;
  const std::uint64_t last = (offset + static_cast<std::uint64_t>(n) - 1) >> 2;
  const std::uint64_t blocks = last - first + 1;
  for (std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < blocks;
       g += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const philox::Block r = philox::block_at(seed, first + g, 0u);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const std::uint64_t pos = ((first + g) << 2) + static_cast<std::uint64_t>(w);
      if (pos < offset || pos - offset >= static_cast<std::uint64_t>(n)) continue;
      const std::int64_t i = static_cast<std::int64_t>(pos - offset);
      const bool kept = philox::to_unit(r.w[w]) < keep;
      mask[i] = kept ? 1 : 0;
      y[i] = detail::from_float<T>(kept ? detail::to_float(x[i]) * scale : 0.0f);
    }
  }
}

template <class T>
__global__ void dropout_identity_kernel(T* __restrict__ y, std::uint8_t* __restrict__ mask, const T* __restrict__ x,
                                        std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    mask[i] = 1;
    y[i] = x[i];
  }
}

template <class T>
__global__ void dropout_backward_kernel(T* __restrict__ dx, const std::uint8_t* __restrict__ mask,
                                        const T* __restrict__ dy, std::int64_t n, float scale, bool accumulate) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    detail::store1(dx + i, mask[i] != 0 ? detail::to_float(dy[i]) * scale : 0.0f, accumulate);
}

}  // namespace

void dropout_forward(void* y, std::uint8_t* mask, const void* x, std::int64_t n, float p, std::uint64_t seed,
                     std::uint64_t offset, DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  detail::dispatch(dt, "dropout_forward", [&](auto tag) {
    using T = decltype(tag);
    if (p <= 0.0f) {
      dropout_identity_kernel<T><<<detail::grid_for(n, kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(y), mask, static_cast<const T*>(x), n);
    } else {
      const std::int64_t blocks =
          static_cast<std::int64_t>(((offset + static_cast<std::uint64_t>(n) - 1) >> 2) - (offset >> 2) + 1);
      dropout_forward_kernel<T><<<detail::grid_for(blocks, kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(y), mask, static_cast<const T*>(x), n, 1.0f - p, keep_scale(p), seed, offset);
    }
    ZP_CUDA_CHECK_LAUNCH("dropout_forward_kernel");
  });
}

void dropout_backward(void* dx, const std::uint8_t* mask, const void* dy, std::int64_t n, float p, bool accumulate,
                      DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  const float scale = p <= 0.0f ? 1.0f : keep_scale(p);
  detail::dispatch(dt, "dropout_backward", [&](auto tag) {
    using T = decltype(tag);
    dropout_backward_kernel<T><<<detail::grid_for(n, kDropoutBlock), kDropoutBlock, 0, stream>>>(
        static_cast<T*>(dx), mask, static_cast<const T*>(dy), n, scale, accumulate);
    ZP_CUDA_CHECK_LAUNCH("dropout_backward_kernel");
  });
}

}  // namespace zp::kernels::cuda
