#pragma once
// Normalisation over the last dimension C of `rows` rows.
// LayerNorm is one fused op (as torch.native_layer_norm); RMSNorm is HF Llama's decomposition:
//   sq = pow2(x); r = rms_rsqrt(sq) = 1/sqrt(mean(sq) + eps); y = mul_rowscale(x, r);
//   out = mul_weight(y, w). pow2 lives in elementwise.hpp.
// Every gradient output may be nullptr (not needed); `accumulate` adds into all of them.
#include <cstdint>

namespace zp::kernels::cpu {

// y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var biased (divides by C).
// Statistics are computed in double; w and b may be nullptr (elementwise_affine=False).
void layernorm_forward(float* y,        // (rows, C)
                       float* mean,     // (rows)
                       float* rstd,     // (rows)
                       const float* x,  // (rows, C)
                       const float* w,  // (C), or nullptr
                       const float* b,  // (C), or nullptr
                       std::int64_t rows, std::int64_t C, float eps);

void layernorm_backward(float* dx,          // (rows, C), or nullptr
                        float* dw,          // (C), or nullptr
                        float* db,          // (C), or nullptr
                        const float* dy,    // (rows, C)
                        const float* x,     // (rows, C)
                        const float* mean,  // (rows)
                        const float* rstd,  // (rows)
                        const float* w,     // (C), or nullptr (weight of 1)
                        std::int64_t rows, std::int64_t C, bool accumulate);
// The same in one pass, dx added into or written (accumulate_dx) apart from dw and db.
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* w, std::int64_t rows, std::int64_t C, bool accumulate_dx,
                        bool accumulate_params);

// r = 1 / sqrt(mean(sq over C) + eps), the mean in double.
void rms_rsqrt_forward(float* r,         // (rows)
                       const float* sq,  // (rows, C)
                       std::int64_t rows, std::int64_t C, float eps);

// dsq[i, j] = dr[i] * (-0.5) * r[i]^3 / C, from the saved output r.
void rms_rsqrt_backward(float* dsq,       // (rows, C)
                        const float* dr,  // (rows)
                        const float* r,   // (rows)
                        std::int64_t rows, std::int64_t C, bool accumulate);

// y = x * r, r broadcast over each row.
void mul_rowscale_forward(float* y,        // (rows, C)
                          const float* x,  // (rows, C)
                          const float* r,  // (rows)
                          std::int64_t rows, std::int64_t C);

// dx = dy * r; dr[i] = sum_j dy[i, j] * x[i, j].
void mul_rowscale_backward(float* dx,        // (rows, C), or nullptr
                           float* dr,        // (rows), or nullptr
                           const float* dy,  // (rows, C)
                           const float* x,   // (rows, C)
                           const float* r,   // (rows)
                           std::int64_t rows, std::int64_t C, bool accumulate);
// The same with dx's accumulation apart from dr's.
void mul_rowscale_backward(float* dx, float* dr, const float* dy, const float* x, const float* r, std::int64_t rows,
                           std::int64_t C, bool accumulate_dx, bool accumulate_dr);

// y = x * w, w (a parameter) broadcast over the rows.
void mul_weight_forward(float* y,        // (rows, C)
                        const float* x,  // (rows, C)
                        const float* w,  // (C)
                        std::int64_t rows, std::int64_t C);

// dx = dy * w; dw[j] = sum_i dy[i, j] * x[i, j].
void mul_weight_backward(float* dx,        // (rows, C), or nullptr
                         float* dw,        // (C), or nullptr
                         const float* dy,  // (rows, C)
                         const float* x,   // (rows, C)
                         const float* w,   // (C)
                         std::int64_t rows, std::int64_t C, bool accumulate);
// The same with dx's accumulation apart from dw's.
void mul_weight_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, std::int64_t rows,
                         std::int64_t C, bool accumulate_dx, bool accumulate_dw);

}  // namespace zp::kernels::cpu
