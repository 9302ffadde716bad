#pragma once
// Pointwise activations on n elements (kernels/cpu/activation.hpp's twins, plus Llama's
// fused SiLU·gate). Backward passes take what autograd saves: the input x (gelu,
// gelu_tanh, silu) or the output y (relu, tanh). `accumulate`: dx += ... instead of dx = ....
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

// F.gelu (exact): y = 0.5 x (1 + erf(x / sqrt(2))).
void gelu_forward(void* y,        // (n)
                  const void* x,  // (n)
                  std::int64_t n, DType dt, cudaStream_t stream);
void gelu_backward(void* dx,        // (n)
                   const void* x,   // (n) saved input
                   const void* dy,  // (n)
                   std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// F.gelu(approximate="tanh"): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_forward(void* y,        // (n)
                       const void* x,  // (n)
                       std::int64_t n, DType dt, cudaStream_t stream);
void gelu_tanh_backward(void* dx,        // (n)
                        const void* x,   // (n) saved input
                        const void* dy,  // (n)
                        std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// F.silu: y = x * sigmoid(x).
void silu_forward(void* y,        // (n)
                  const void* x,  // (n)
                  std::int64_t n, DType dt, cudaStream_t stream);
void silu_backward(void* dx,        // (n)
                   const void* x,   // (n) saved input
                   const void* dy,  // (n)
                   std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// Llama's MLP gate fused: y = silu(gate) * up, one rounding (the unfused ops round silu(gate)
// to the storage dtype first). Backward from the saved inputs:
// dgate = dy * up * silu'(gate), dup = dy * silu(gate); either may be nullptr.
void silu_mul_forward(void* y,           // (n)
                      const void* gate,  // (n)
                      const void* up,    // (n)
                      std::int64_t n, DType dt, cudaStream_t stream);
void silu_mul_backward(void* dgate,       // (n), or nullptr
                       void* dup,         // (n), or nullptr
                       const void* dy,    // (n)
                       const void* gate,  // (n)
                       const void* up,    // (n)
                       std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// F.relu: y = max(x, 0) (NaN propagates); backward from the saved output: dx = dy where y > 0.
void relu_forward(void* y,        // (n)
                  const void* x,  // (n)
                  std::int64_t n, DType dt, cudaStream_t stream);
void relu_backward(void* dx,        // (n)
                   const void* y,   // (n) saved output
                   const void* dy,  // (n)
                   std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// torch.tanh; backward from the saved output: dx = dy (1 - y^2).
void tanh_forward(void* y,        // (n)
                  const void* x,  // (n)
                  std::int64_t n, DType dt, cudaStream_t stream);
void tanh_backward(void* dx,        // (n)
                   const void* y,   // (n) saved output
                   const void* dy,  // (n)
                   std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
