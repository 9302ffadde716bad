#pragma once
// Fully connected layers (kernels/cpu/linear.hpp's twins): nn.Linear (weight (out, in))
// and GPT-2's Conv1D (weight (in, out)), through cuBLASLt with fp32 accumulation; the
// forward's bias is the GEMM's epilogue (one rounding, as PyTorch's addmm; a bias that is not
// 16-byte aligned is copied to the Context's scratch first). Every gradient
// output may be nullptr (not needed); `accumulate` adds into all of them (beta = 1).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// nn.Linear: y = x · W^T + b. y's rows are ld_y elements apart (0: N; a padded row pitch,
// models::Tensor::row_pitch, whose extra elements are neither read nor written).
void linear_forward(Context& ctx,
                    void* y,        // (M, N), rows ld_y apart
                    const void* x,  // (M, K)
                    const void* w,  // (N, K)
                    const void* b,  // (N), or nullptr (no bias)
                    std::int64_t M, std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream,
                    std::int64_t ld_y = 0);

// dx = dy · W, dW = dy^T · x, db = column sums of dy; dy's rows ld_dy elements apart (0: N).
void linear_backward(Context& ctx,
                     void* dx,        // (M, K), or nullptr
                     void* dw,        // (N, K), or nullptr
                     void* db,        // (N), or nullptr
                     const void* dy,  // (M, N), rows ld_dy apart
                     const void* x,   // (M, K)
                     const void* w,   // (N, K)
                     std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate, DType dt, cudaStream_t stream,
                     std::int64_t ld_dy = 0);

// transformers' Conv1D (GPT-2): y = x · W + b.
void conv1d_forward(Context& ctx,
                    void* y,        // (M, N)
                    const void* x,  // (M, K)
                    const void* w,  // (K, N)
                    const void* b,  // (N), or nullptr
                    std::int64_t M, std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream);

// dx = dy · W^T, dW = x^T · dy, db = column sums of dy.
void conv1d_backward(Context& ctx,
                     void* dx,        // (M, K), or nullptr
                     void* dw,        // (K, N), or nullptr
                     void* db,        // (N), or nullptr
                     const void* dy,  // (M, N)
                     const void* x,   // (M, K)
                     const void* w,   // (K, N)
                     std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate, DType dt, cudaStream_t stream);

// GPT-2's c_fc with the tanh-form GELU as the product's epilogue (models::Fn::mlp_gelu_tanh):
// pre = x · W + b and y = gelu_tanh(x · W + b), both rounded once from the fp32 sums (the GELU
// is taken before pre is rounded). Returns false, having run nothing, where
// kernels::gelu_epilogue_takes refuses the operands: the caller runs conv1d_forward, then
// gelu_tanh_forward on pre.
bool conv1d_gelu_forward(Context& ctx,
                         void* y,        // (M, N)
                         void* pre,      // (M, N)
                         const void* x,  // (M, K)
                         const void* w,  // (K, N)
                         const void* b,  // (N)
                         std::int64_t M, std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream);

// The gradient of the pre-activation in front of a Conv1D (y = gelu_tanh(pre) · W + b):
// d_pre = gelu_tanh'(pre) · (dy · W^T), the derivative the product's epilogue. cuBLASLt rounds
// the product to dt before it applies the derivative (measured on an H100: in bf16 12,182 of
// 12,288 elements are round(gelu'(pre) · round(dy · W^T)), the chain's two roundings, against
// 9,137 for one rounding of the fp32 sums); in fp32 nothing is rounded on the way. Written, not
// added. Returns false, having run nothing, where
// kernels::gelu_epilogue_takes refuses the operands: the caller runs the input gradient of
// conv1d_backward into a temporary, then gelu_tanh_backward.
bool conv1d_dgelu_backward(Context& ctx,
                           void* d_pre,      // (M, K)
                           const void* dy,   // (M, N)
                           const void* w,    // (K, N)
                           const void* pre,  // (M, K)
                           std::int64_t M, std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream);

// db = sum over rows of dy (fp32, deterministic: no atomics).
void bias_backward(Context& ctx,
                   void* db,        // (N)
                   const void* dy,  // (M, N)
                   std::int64_t M, std::int64_t N, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
