#pragma once
// Normalisation over the last dimension C of `rows` rows (kernels/cpu/norm.hpp's twins,
// plus a fused RMSNorm). LayerNorm is one fused op (as torch.native_layer_norm, statistics
// in fp32); RMSNorm is HF Llama's decomposition
//   sq = pow2(x); r = rms_rsqrt(sq); y = mul_rowscale(x, r); out = mul_weight(y, w)
// (pow2 in elementwise.cuh), or rmsnorm_forward fused. Every gradient output may be
// nullptr (not needed); `accumulate` adds into all of them. Column sums (weight and bias
// gradients) are deterministic (no atomics; columns.cuh).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var biased. mean and rstd are
// fp32 whatever dt; w and b may be nullptr (elementwise_affine=False).
void layernorm_forward(void* y,        // (rows, C)
                       float* mean,    // (rows)
                       float* rstd,    // (rows)
                       const void* x,  // (rows, C)
                       const void* w,  // (C), or nullptr
                       const void* b,  // (C), or nullptr
                       std::int64_t rows, std::int64_t C, float eps, DType dt, cudaStream_t stream);

void layernorm_backward(Context& ctx,
                        void* dx,           // (rows, C), or nullptr
                        void* dw,           // (C), or nullptr
                        void* db,           // (C), or nullptr
                        const void* dy,     // (rows, C)
                        const void* x,      // (rows, C)
                        const float* mean,  // (rows)
                        const float* rstd,  // (rows)
                        const void* w,      // (C), or nullptr (weight of 1)
                        std::int64_t rows, std::int64_t C, bool accumulate, DType dt, cudaStream_t stream);
// The same with dx's accumulation apart from dw's and db's (a fresh input gradient is written,
// the params' are added into). With dx and a param gradient, rows of at most 128 packs and
// room in ctx's scratch, one pass over dy and x makes all three: each of up to one wave of
// warps (one per 4 rows; ContextOptions::layernorm_backward_warps fixes the number) sums its
// rows' dy·x̂ and dy, each block adds its warps' sums, and a column reduction of the blocks'
// sums gives dw and db.
void layernorm_backward(Context& ctx, void* dx, void* dw, void* db, const void* dy, const void* x, const float* mean,
                        const float* rstd, const void* w, std::int64_t rows, std::int64_t C, bool accumulate_dx,
                        bool accumulate_params, DType dt, cudaStream_t stream);

// zeroplan's fused residual LayerNorm (models::Fn::dropout_add_layernorm):
//   sum = x + dropout(b), y = LayerNorm(sum)
// the dropout's mask drawn as dropout_forward draws it (element i at offset + i), its output
// and the sum rounded to dt as the chain dropout_forward, add_forward, layernorm_forward stores
// them, so y, sum, mask, mean and rstd are that chain's bits. p = 0: no dropout (mask unused,
// may be nullptr). One pass where a warp holds a row (rows of at most 256 16-byte packs), else
// the chain's kernels.
void dropout_add_layernorm_forward(void* y,               // (rows, C)
                                   float* mean,           // (rows)
                                   float* rstd,           // (rows)
                                   void* sum,             // (rows, C)
                                   std::uint8_t* mask,    // (rows, C), or nullptr where p = 0
                                   const void* b,         // (rows, C): the dropped operand
                                   const void* x,         // (rows, C): the residual
                                   const void* w,         // (C), or nullptr
                                   const void* beta,      // (C), or nullptr
                                   std::int64_t rows, std::int64_t C, float eps, float p, std::uint64_t seed,
                                   std::uint64_t offset, DType dt, cudaStream_t stream);
// Its backward: t = ds + LayerNorm's input gradient (ds: the sum's gradient from a later reader
// of it, or nullptr), rounded once to dt as the chain's LayerNorm backward adds into the sum's
// gradient; dres = t, db = t · mask / (1 - p), each written or added into (accumulate_*; either
// may be nullptr); dw and dbeta added into as layernorm_backward's. In the pass of
// layernorm_backward's warp kernels where kernels::dropout_add_layernorm_backward_warp_takes
// (kernels/common/norm_dims.hpp); elsewhere through `scratch` (rows · C elements of dt): t made
// there by the row kernels (ds copied first, LayerNorm's gradient added), then the epilogue over
// it. Either way the chain's bits. Throws std::logic_error where the scratch is needed and not
// given.
void dropout_add_layernorm_backward(Context& ctx, void* db, void* dres, void* dw, void* dbeta, const void* dy,
                                    const void* ds, const void* sum, const std::uint8_t* mask, const float* mean,
                                    const float* rstd, const void* w, std::int64_t rows, std::int64_t C, float p,
                                    bool accumulate_b, bool accumulate_res, void* scratch, DType dt,
                                    cudaStream_t stream);

// r = 1 / sqrt(mean(sq over C) + eps).
void rms_rsqrt_forward(void* r,         // (rows)
                       const void* sq,  // (rows, C)
                       std::int64_t rows, std::int64_t C, float eps, DType dt, cudaStream_t stream);

// dsq[i, j] = dr[i] * (-0.5) * r[i]^3 / C, from the saved output r.
void rms_rsqrt_backward(void* dsq,       // (rows, C)
                        const void* dr,  // (rows)
                        const void* r,   // (rows)
                        std::int64_t rows, std::int64_t C, bool accumulate, DType dt, cudaStream_t stream);

// y = x * r, r broadcast over each row.
void mul_rowscale_forward(void* y,        // (rows, C)
                          const void* x,  // (rows, C)
                          const void* r,  // (rows)
                          std::int64_t rows, std::int64_t C, DType dt, cudaStream_t stream);

// dx = dy * r; dr[i] = sum_j dy[i, j] * x[i, j].
void mul_rowscale_backward(void* dx,        // (rows, C), or nullptr
                           void* dr,        // (rows), or nullptr
                           const void* dy,  // (rows, C)
                           const void* x,   // (rows, C)
                           const void* r,   // (rows)
                           std::int64_t rows, std::int64_t C, bool accumulate, DType dt, cudaStream_t stream);

// y = x * w, w broadcast over the rows.
void mul_weight_forward(void* y,        // (rows, C)
                        const void* x,  // (rows, C)
                        const void* w,  // (C)
                        std::int64_t rows, std::int64_t C, DType dt, cudaStream_t stream);

// dx = dy * w; dw[j] = sum_i dy[i, j] * x[i, j].
void mul_weight_backward(Context& ctx,
                         void* dx,        // (rows, C), or nullptr
                         void* dw,        // (C), or nullptr
                         const void* dy,  // (rows, C)
                         const void* x,   // (rows, C)
                         const void* w,   // (C)
                         std::int64_t rows, std::int64_t C, bool accumulate, DType dt, cudaStream_t stream);

// HF LlamaRMSNorm in one pass: r = 1/sqrt(mean(x^2) + eps) in fp32 (saved as rstd),
// y = w * round_dt(x * r) (the cast back to the input dtype before the weight, as HF).
void rmsnorm_forward(void* y,        // (rows, C)
                     float* rstd,    // (rows)
                     const void* x,  // (rows, C)
                     const void* w,  // (C)
                     std::int64_t rows, std::int64_t C, float eps, DType dt, cudaStream_t stream);

// With h = x * r and dh = dy * w: dx = r * dh - x * r^3 * mean(dh * x); dw = sum_rows dy * round_dt(h).
void rmsnorm_backward(Context& ctx,
                      void* dx,           // (rows, C), or nullptr
                      void* dw,           // (C), or nullptr
                      const void* dy,     // (rows, C)
                      const void* x,      // (rows, C)
                      const float* rstd,  // (rows)
                      const void* w,      // (C)
                      std::int64_t rows, std::int64_t C, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
