#pragma once
// Casts between the storage dtypes (kernels/cpu/convert.hpp's twins): round to nearest
// even, fp16 overflow to ±inf, fp16 subnormals kept; bit-exact with the CPU conversions
// except NaN payloads (a NaN stays a NaN, as __float2bfloat16_rn and PyTorch's GPU casts
// leave it).
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

// y = x converted from x_dt to y_dt (fp32, bf16, fp16; a plain copy when they are equal).
void convert(void* y,        // (n) in y_dt
             DType y_dt,
             const void* x,  // (n) in x_dt
             DType x_dt, std::int64_t n, cudaStream_t stream);

// y += x rounded to y's dtype first (n elements): convert into a temporary, then
// copy_accumulate, in one pass and without the temporary (autograd's cast of a gradient to
// its input's dtype before accumulating it). The same bits as those two calls.
void convert_accumulate(void* y,        // (n) in y_dt, accumulated into
                        DType y_dt,
                        const void* x,  // (n) in x_dt
                        DType x_dt, std::int64_t n, cudaStream_t stream);

// y += x with the sum of the two values in fp32 and one rounding into y's dtype (exec's
// Device::add between dtypes): the same bits as converting both to fp32, copy_accumulate in
// fp32 and converting back, in one pass and without the two fp32 temporaries.
void add_mixed(void* y,        // (n) in y_dt, accumulated into
               DType y_dt,
               const void* x,  // (n) in x_dt
               DType x_dt, std::int64_t n, cudaStream_t stream);

}  // namespace zp::kernels::cuda
