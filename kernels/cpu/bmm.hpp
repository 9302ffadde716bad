#pragma once
// Matrix products on row-major fp32 buffers (Eigen GEMM, single-threaded).
#include <cstdint>

namespace zp::kernels::cpu {

// C(m,n) = op(A) · op(B), or C += op(A) · op(B) when accumulating.
// op(A) is (m,k): A is stored (m,k), or (k,m) when trans_a. op(B) is (k,n): B is stored
// (k,n), or (n,k) when trans_b.
void gemm(float* c,        // (m, n)
          const float* a,  // (m, k), or (k, m) when trans_a
          const float* b,  // (k, n), or (n, k) when trans_b
          std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, bool accumulate);

// Batched: C[i] = op(A[i]) · op(B[i]) for i < batch (torch.matmul on (..., m, k) operands).
// Q·K^T with K stored (B, H, T, D): bmm(c, q, k, B*H, T, T, D, false, true).
void bmm_forward(float* c,        // (batch, m, n)
                 const float* a,  // (batch, m, k), or (batch, k, m) when trans_a
                 const float* b,  // (batch, k, n), or (batch, n, k) when trans_b
                 std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b);

// Gradients of bmm_forward in the operands' stored layouts; da or db may be nullptr (skipped).
void bmm_backward(float* da,        // like a
                  float* db,        // like b
                  const float* dc,  // (batch, m, n)
                  const float* a,   // as in bmm_forward
                  const float* b,   // as in bmm_forward
                  std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                  bool accumulate);

}  // namespace zp::kernels::cpu
