#pragma once
// Deterministic reductions (kernels/cpu/reduce.hpp's twins), written to a device scalar:
// a grid whose size depends only on n sums fixed strided subsets in double, each block
// combines its threads in a fixed tree, and one block sums the block partials (in the
// Context's scratch) in order. No atomics: two runs give the same bits.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// out[0] = sum of x[i]^2 (the squared L2 norm, for gradient-norm clipping), or out[0] +=
// it when accumulating (a norm over several buffers).
void sum_squares(Context& ctx,
                 double* out,    // (1) on the device
                 const void* x,  // (n)
                 std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// out[0] (+)= sum of x[i].
void sum(Context& ctx,
         double* out,    // (1) on the device
         const void* x,  // (n)
         std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
