#pragma once
// The shared counter-based generator (kernels/common/philox.hpp) on the device: the same
// values as kernels/cpu/rng.hpp's fills for the same (seed, offset), stored in dt.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

// out[i] = uniform(seed, offset + i), in [0, 1) with 24 random bits.
void uniform_fill(void* out,  // (n)
                  std::int64_t n, std::uint64_t seed, std::uint64_t offset, DType dt, cudaStream_t stream);

// out[i] = mean + stddev * normal(seed, offset + i) (Box-Muller in double, as the CPU).
void normal_fill(void* out,  // (n)
                 std::int64_t n, std::uint64_t seed, std::uint64_t offset, float mean, float stddev, DType dt,
                 cudaStream_t stream);

}  // namespace zp::kernels::cuda
