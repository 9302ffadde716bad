#pragma once
// Elementwise arithmetic on contiguous fp32 buffers of n elements.
// Backward: each gradient output may be nullptr (not needed); `accumulate` adds into all of them.
#include <array>
#include <cstdint>

namespace zp::kernels::cpu {

using Dims4 = std::array<std::int64_t, 4>;

// dst = src, or dst += src: the backward of identity-like ops (add_scalar, a view, ...).
void copy_accumulate(float* dst,        // (n)
                     const float* src,  // (n)
                     std::int64_t n, bool accumulate);

// y = a + b (same shape).
void add_forward(float* y,        // (n)
                 const float* a,  // (n)
                 const float* b,  // (n)
                 std::int64_t n);
void add_backward(float* da,        // (n), or nullptr
                  float* db,        // (n), or nullptr
                  const float* dy,  // (n)
                  std::int64_t n, bool accumulate);

// y = a + b with b broadcast: dims is y's (and a's) shape; b_dims[i] is dims[i] or 1.
// Pad shorter shapes with leading 1s. Uses: the additive attention masks (B,1,1,T) and
// (1,1,T,T) over scores (B,H,T,T); GPT-2/BERT position embeddings (1,T,C) over (B,T,C).
void add_broadcast_forward(float* y,        // dims
                           const float* a,  // dims
                           const float* b,  // b_dims
                           const Dims4& dims, const Dims4& b_dims);
// da = dy; db = dy summed over the broadcast dimensions (double, in y's order).
void add_broadcast_backward(float* da,        // dims, or nullptr
                            float* db,        // b_dims, or nullptr
                            const float* dy,  // dims
                            const Dims4& dims, const Dims4& b_dims, bool accumulate);

// y = a * b (same shape; SwiGLU's silu(gate) * up).
void mul_forward(float* y,        // (n)
                 const float* a,  // (n)
                 const float* b,  // (n)
                 std::int64_t n);
// da = dy * b; db = dy * a.
void mul_backward(float* da,        // (n), or nullptr
                  float* db,        // (n), or nullptr
                  const float* dy,  // (n)
                  const float* a,   // (n)
                  const float* b,   // (n)
                  std::int64_t n, bool accumulate);

// y = alpha * x; dx = alpha * dy.
void scale_forward(float* y,        // (n)
                   const float* x,  // (n)
                   std::int64_t n, float alpha);
void scale_backward(float* dx,        // (n)
                    const float* dy,  // (n)
                    std::int64_t n, float alpha, bool accumulate);

// y = x + c; dx = dy.
void add_scalar_forward(float* y,        // (n)
                        const float* x,  // (n)
                        std::int64_t n, float c);
void add_scalar_backward(float* dx,        // (n)
                         const float* dy,  // (n)
                         std::int64_t n, bool accumulate);

// y = x^2; dx = 2 x dy (RMSNorm's hidden_states.pow(2)).
void pow2_forward(float* y,        // (n)
                  const float* x,  // (n)
                  std::int64_t n);
void pow2_backward(float* dx,        // (n)
                   const float* x,   // (n)
                   const float* dy,  // (n)
                   std::int64_t n, bool accumulate);

// y = x^3; dx = 3 x^2 dy (GPT-2's gelu_new written as Python ops).
void pow3_forward(float* y,        // (n)
                  const float* x,  // (n)
                  std::int64_t n);
void pow3_backward(float* dx,        // (n)
                   const float* x,   // (n)
                   const float* dy,  // (n)
                   std::int64_t n, bool accumulate);

}  // namespace zp::kernels::cpu
