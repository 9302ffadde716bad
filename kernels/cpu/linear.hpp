#pragma once
// Fully connected layers: nn.Linear (weight (out, in)) and GPT-2's Conv1D (weight (in, out)).
// Every gradient output may be nullptr (not needed); `accumulate` adds into all of them.
#include <cstdint>

namespace zp::kernels::cpu {

// nn.Linear: y = x · W^T + b.
void linear_forward(float* y,        // (M, N)
                    const float* x,  // (M, K)
                    const float* w,  // (N, K)
                    const float* b,  // (N), or nullptr (no bias)
                    std::int64_t M, std::int64_t N, std::int64_t K);

// dx = dy · W, dW = dy^T · x, db = column sums of dy.
void linear_backward(float* dx,        // (M, K), or nullptr
                     float* dw,        // (N, K), or nullptr
                     float* db,        // (N), or nullptr
                     const float* dy,  // (M, N)
                     const float* x,   // (M, K)
                     const float* w,   // (N, K)
                     std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate);

// transformers' Conv1D (GPT-2): y = x · W + b.
void conv1d_forward(float* y,        // (M, N)
                    const float* x,  // (M, K)
                    const float* w,  // (K, N)
                    const float* b,  // (N), or nullptr
                    std::int64_t M, std::int64_t N, std::int64_t K);

// dx = dy · W^T, dW = x^T · dy, db = column sums of dy.
void conv1d_backward(float* dx,        // (M, K), or nullptr
                     float* dw,        // (K, N), or nullptr
                     float* db,        // (N), or nullptr
                     const float* dy,  // (M, N)
                     const float* x,   // (M, K)
                     const float* w,   // (K, N)
                     std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate);

// db = sum over rows of dy (double accumulation, row order).
void bias_backward(float* db,        // (N)
                   const float* dy,  // (M, N)
                   std::int64_t M, std::int64_t N, bool accumulate);

}  // namespace zp::kernels::cpu
