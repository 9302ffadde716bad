#include "kernels/common/philox.hpp"
#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/rng.cuh"

namespace zp::kernels::cuda {

namespace {

constexpr int kFillBlock = 256;

template <class T>
__global__ void uniform_kernel(T* __restrict__ out, std::int64_t n, std::uint64_t seed, std::uint64_t offset) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = detail::from_float<T>(philox::uniform(seed, offset + static_cast<std::uint64_t>(i)));
}

template <class T>
__global__ void normal_kernel(T* __restrict__ out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                              float mean, float stddev) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float z = philox::normal(seed, offset + static_cast<std::uint64_t>(i));
    out[i] = detail::from_float<T>(__fadd_rn(mean, __fmul_rn(stddev, z)));
  }
}

}  // namespace

void uniform_fill(void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  detail::dispatch(dt, "uniform_fill", [&](auto tag) {
    using T = decltype(tag);
    uniform_kernel<T><<<detail::grid_for(n, kFillBlock), kFillBlock, 0, stream>>>(static_cast<T*>(out), n, seed,
                                                                                   offset);
    ZP_CUDA_CHECK_LAUNCH("uniform_kernel");
  });
}

void normal_fill(void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, float mean, float stddev,
                 DType dt, cudaStream_t stream) {
  if (n <= 0) return;
  detail::dispatch(dt, "normal_fill", [&](auto tag) {
    using T = decltype(tag);
    normal_kernel<T><<<detail::grid_for(n, kFillBlock), kFillBlock, 0, stream>>>(static_cast<T*>(out), n, seed,
                                                                                  offset, mean, stddev);
    ZP_CUDA_CHECK_LAUNCH("normal_kernel");
  });
}

}  // namespace zp::kernels::cuda
