#pragma once
// Elementwise arithmetic on contiguous buffers of n elements (kernels/cpu/elementwise.hpp's
// twins). Backward: each gradient output may be nullptr (not needed); `accumulate` adds
// into all of them.
#include <array>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

using Dims4 = std::array<std::int64_t, 4>;

// dst = src, or dst += src.
void copy_accumulate(void* dst,        // (n)
                     const void* src,  // (n)
                     std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// y = a + b (same shape).
void add_forward(void* y,        // (n)
                 const void* a,  // (n)
                 const void* b,  // (n)
                 std::int64_t n, DType dt, cudaStream_t stream);
void add_backward(void* da,        // (n), or nullptr
                  void* db,        // (n), or nullptr
                  const void* dy,  // (n)
                  std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// y = a + b with b broadcast: dims is y's (and a's) shape; b_dims[i] is dims[i] or 1.
void add_broadcast_forward(void* y,        // dims
                           const void* a,  // dims
                           const void* b,  // b_dims
                           const Dims4& dims, const Dims4& b_dims, DType dt, cudaStream_t stream);
// da = dy; db = dy summed over the broadcast dimensions (fp32, in y's order: deterministic).
void add_broadcast_backward(void* da,        // dims, or nullptr
                            void* db,        // b_dims, or nullptr
                            const void* dy,  // dims
                            const Dims4& dims, const Dims4& b_dims, bool accumulate, DType dt, cudaStream_t stream);

// y = a * b; da = dy * b; db = dy * a.
void mul_forward(void* y,        // (n)
                 const void* a,  // (n)
                 const void* b,  // (n)
                 std::int64_t n, DType dt, cudaStream_t stream);
void mul_backward(void* da,        // (n), or nullptr
                  void* db,        // (n), or nullptr
                  const void* dy,  // (n)
                  const void* a,   // (n)
                  const void* b,   // (n)
                  std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// y = alpha * x; dx = alpha * dy.
void scale_forward(void* y,        // (n)
                   const void* x,  // (n)
                   std::int64_t n, float alpha, DType dt, cudaStream_t stream);
void scale_backward(void* dx,        // (n)
                    const void* dy,  // (n)
                    std::int64_t n, float alpha, bool accumulate, DType dt, cudaStream_t stream);

// y = x + c; dx = dy.
void add_scalar_forward(void* y,        // (n)
                        const void* x,  // (n)
                        std::int64_t n, float c, DType dt, cudaStream_t stream);
void add_scalar_backward(void* dx,        // (n)
                         const void* dy,  // (n)
                         std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// y = x^2; dx = 2 x dy.
void pow2_forward(void* y,        // (n)
                  const void* x,  // (n)
                  std::int64_t n, DType dt, cudaStream_t stream);
void pow2_backward(void* dx,        // (n)
                   const void* x,   // (n)
                   const void* dy,  // (n)
                   std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// y = x^3; dx = 3 x^2 dy.
void pow3_forward(void* y,        // (n)
                  const void* x,  // (n)
                  std::int64_t n, DType dt, cudaStream_t stream);
void pow3_backward(void* dx,        // (n)
                   const void* x,   // (n)
                   const void* dy,  // (n)
                   std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
