#pragma once
// Pointwise activations on n elements (any shape, contiguous).
// Backward passes take what autograd saves: the input x (gelu, gelu_tanh, silu) or the
// output y (relu, tanh). `accumulate`: dx += ... instead of dx = ....
#include <cstdint>

namespace zp::kernels::cpu {

// F.gelu (exact): y = 0.5 x (1 + erf(x / sqrt(2))).
void gelu_forward(float* y,        // (n)
                  const float* x,  // (n)
                  std::int64_t n);
void gelu_backward(float* dx,        // (n)
                   const float* x,   // (n) saved input
                   const float* dy,  // (n)
                   std::int64_t n, bool accumulate);

// F.gelu(approximate="tanh"): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_forward(float* y,        // (n)
                       const float* x,  // (n)
                       std::int64_t n);
void gelu_tanh_backward(float* dx,        // (n)
                        const float* x,   // (n) saved input
                        const float* dy,  // (n)
                        std::int64_t n, bool accumulate);

// F.silu: y = x * sigmoid(x).
void silu_forward(float* y,        // (n)
                  const float* x,  // (n)
                  std::int64_t n);
void silu_backward(float* dx,        // (n)
                   const float* x,   // (n) saved input
                   const float* dy,  // (n)
                   std::int64_t n, bool accumulate);

// F.relu: y = max(x, 0); backward from the saved output: dx = dy where y > 0 (NaN
// propagates forward and backward, as torch.relu / threshold_backward).
void relu_forward(float* y,        // (n)
                  const float* x,  // (n)
                  std::int64_t n);
void relu_backward(float* dx,        // (n)
                   const float* y,   // (n) saved output
                   const float* dy,  // (n)
                   std::int64_t n, bool accumulate);

// torch.tanh; backward from the saved output: dx = dy (1 - y^2).
void tanh_forward(float* y,        // (n)
                  const float* x,  // (n)
                  std::int64_t n);
void tanh_backward(float* dx,        // (n)
                   const float* y,   // (n) saved output
                   const float* dy,  // (n)
                   std::int64_t n, bool accumulate);

}  // namespace zp::kernels::cpu
