#pragma once
// Dropout in training mode with the counter-based mask both backends share
// (kernels/common/philox.hpp): element i is kept when uniform(seed, offset + i) < 1 - p,
// so the mask equals the CPU's (kernels/cpu/dropout.hpp) bit for bit. Kept elements are
// scaled by 1 / (1 - p); p == 0 is the exact identity (mask all 1); p >= 1 drops everything.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

void dropout_forward(void* y,             // (n)
                     std::uint8_t* mask,  // (n), 1 = kept, 0 = dropped
                     const void* x,       // (n)
                     std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset, DType dt,
                     cudaStream_t stream);

// dx = dy * mask / (1 - p).
void dropout_backward(void* dx,                  // (n)
                      const std::uint8_t* mask,  // (n)
                      const void* dy,            // (n)
                      std::int64_t n, float p, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
