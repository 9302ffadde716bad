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

// The 16-byte path: 8 consecutive elements per thread (two Philox blocks; the stream offset a
// multiple of 4, so element i is word i % 4 of block offset/4 + i/4), x and y read and written
// in whole 16-byte accesses and the 8 mask bytes in one. The same draws and the same bits as
// dropout_forward_kernel.
template <class T>
__global__ void dropout_forward_vec_kernel(T* __restrict__ y, std::uint8_t* __restrict__ mask,
                                           const T* __restrict__ x, std::int64_t n, float keep, float scale,
                                           std::uint64_t seed, std::uint64_t offset) {
  constexpr int W = 8;
  const std::uint64_t first = offset >> 2;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * W;
  for (std::int64_t j = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W; j < n; j += stride) {
    const std::uint64_t b = first + static_cast<std::uint64_t>(j >> 2);
    const philox::Block r0 = philox::block_at(seed, b, 0u), r1 = philox::block_at(seed, b + 1, 0u);
    const std::uint32_t words[W] = {r0.w[0], r0.w[1], r0.w[2], r0.w[3], r1.w[0], r1.w[1], r1.w[2], r1.w[3]};
    if (j + W <= n) {
      float v[W];
      detail::load_f<T, W>(x + j, v);
      std::uint8_t m[W];
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const bool kept = philox::to_unit(words[k]) < keep;
        m[k] = kept ? 1 : 0;
        v[k] = kept ? v[k] * scale : 0.0f;
      }
      detail::store_f<T, W>(y + j, v);
      uint2 raw;
      memcpy(&raw, m, sizeof raw);
      *reinterpret_cast<uint2*>(mask + j) = raw;
    } else {  // the tail
      for (std::int64_t i = j; i < n; ++i) {
        const bool kept = philox::to_unit(words[i - j]) < keep;
        mask[i] = kept ? 1 : 0;
        y[i] = detail::from_float<T>(kept ? detail::to_float(x[i]) * scale : 0.0f);
      }
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

// The 16-byte path of the backward: 8 elements per thread, the mask bytes in one access.
template <class T>
__global__ void dropout_backward_vec_kernel(T* __restrict__ dx, const std::uint8_t* __restrict__ mask,
                                            const T* __restrict__ dy, std::int64_t n, float scale, bool accumulate) {
  constexpr int W = 8;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * W;
  for (std::int64_t j = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W; j < n; j += stride) {
    if (j + W <= n) {
      const uint2 raw = *reinterpret_cast<const uint2*>(mask + j);
      std::uint8_t m[W];
      memcpy(m, &raw, sizeof raw);
      float v[W];
      detail::load_f<T, W>(dy + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = m[k] != 0 ? v[k] * scale : 0.0f;
      detail::store_acc<T, W>(dx + j, v, accumulate);
    } else {
      for (std::int64_t i = j; i < n; ++i)
        detail::store1(dx + i, mask[i] != 0 ? detail::to_float(dy[i]) * scale : 0.0f, accumulate);
    }
  }
}

bool aligned8(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 7u) == 0; }

}  // namespace

void dropout_forward(void* y, std::uint8_t* mask, const void* x, std::int64_t n, float p, std::uint64_t seed,
                     std::uint64_t offset, DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  detail::dispatch(dt, "dropout_forward", [&](auto tag) {
    using T = decltype(tag);
    if (p <= 0.0f) {
      dropout_identity_kernel<T><<<detail::grid_for(n, kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(y), mask, static_cast<const T*>(x), n);
      ZP_CUDA_CHECK_LAUNCH("dropout_identity_kernel");
    } else if (offset % 4 == 0 && detail::aligned16(y) && detail::aligned16(x) && aligned8(mask)) {
      dropout_forward_vec_kernel<T><<<detail::grid_for(detail::ceil_div(n, 8), kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(y), mask, static_cast<const T*>(x), n, 1.0f - p, keep_scale(p), seed, offset);
      ZP_CUDA_CHECK_LAUNCH("dropout_forward_vec_kernel");
    } else {
      const std::int64_t blocks =
          static_cast<std::int64_t>(((offset + static_cast<std::uint64_t>(n) - 1) >> 2) - (offset >> 2) + 1);
      dropout_forward_kernel<T><<<detail::grid_for(blocks, kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(y), mask, static_cast<const T*>(x), n, 1.0f - p, keep_scale(p), seed, offset);
      ZP_CUDA_CHECK_LAUNCH("dropout_forward_kernel");
    }
  });
}

void dropout_backward(void* dx, const std::uint8_t* mask, const void* dy, std::int64_t n, float p, bool accumulate,
                      DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  const float scale = p <= 0.0f ? 1.0f : keep_scale(p);
  detail::dispatch(dt, "dropout_backward", [&](auto tag) {
    using T = decltype(tag);
    if (detail::aligned16(dx) && detail::aligned16(dy) && aligned8(mask)) {
      dropout_backward_vec_kernel<T><<<detail::grid_for(detail::ceil_div(n, 8), kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(dx), mask, static_cast<const T*>(dy), n, scale, accumulate);
      ZP_CUDA_CHECK_LAUNCH("dropout_backward_vec_kernel");
    } else {
      dropout_backward_kernel<T><<<detail::grid_for(n, kDropoutBlock), kDropoutBlock, 0, stream>>>(
          static_cast<T*>(dx), mask, static_cast<const T*>(dy), n, scale, accumulate);
      ZP_CUDA_CHECK_LAUNCH("dropout_backward_kernel");
    }
  });
}

}  // namespace zp::kernels::cuda
