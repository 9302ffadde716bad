#pragma once
// Dropout in training mode with a counter-based mask: element i is kept when
// uniform(seed, offset + i) < 1 - p, so the mask is reproducible from (seed, offset) alone.
// Kept elements are scaled by 1 / (1 - p). p == 0 is the exact identity (mask all 1);
// p >= 1 drops everything (y = 0), as torch.nn.functional.dropout.
#include <cstdint>

namespace zp::kernels::cpu {

void dropout_forward(float* y,            // (n)
                     std::uint8_t* mask,  // (n), 1 = kept, 0 = dropped
                     const float* x,      // (n)
                     std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset);

// dx = dy * mask / (1 - p).
void dropout_backward(float* dx,                 // (n)
                      const std::uint8_t* mask,  // (n)
                      const float* dy,           // (n)
                      std::int64_t n, float p, bool accumulate);

}  // namespace zp::kernels::cpu
