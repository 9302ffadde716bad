#pragma once
// Deterministic reductions: blocks of 256 elements summed in order in double, the block
// sums combined pairwise (a fixed tree that depends only on n).
#include <cstdint>

namespace zp::kernels::cpu {

// sum of x[i]^2 (squared L2 norm, for gradient-norm clipping).
double sum_squares(const float* x,  // (n)
                   std::int64_t n);

// sum of x[i].
double sum(const float* x,  // (n)
           std::int64_t n);

}  // namespace zp::kernels::cpu
