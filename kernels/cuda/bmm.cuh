#pragma once
// Matrix products on row-major buffers through cuBLASLt (kernels/cpu/bmm.hpp's twins):
// fp32 accumulation whatever the storage dtype; fp32 operands without TF32 unless the
// Context allows it; `accumulate` is beta = 1.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// C(m,n) = op(A) · op(B), or C += op(A) · op(B) when accumulating. op(A) is (m,k): A is
// stored (m,k), or (k,m) when trans_a, its rows lda elements apart (0: packed). op(B) is
// (k,n): B is stored (k,n), or (n,k) when trans_b.
void gemm(Context& ctx,
          void* c,        // (m, n)
          const void* a,  // (m, k), or (k, m) when trans_a
          const void* b,  // (k, n), or (n, k) when trans_b
          std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, bool accumulate, DType dt,
          cudaStream_t stream, std::int64_t lda = 0);

// Batched: C[i] = op(A[i]) · op(B[i]) for i < batch (one strided-batched cuBLASLt call).
void bmm_forward(Context& ctx,
                 void* c,        // (batch, m, n)
                 const void* a,  // (batch, m, k), or (batch, k, m) when trans_a
                 const void* b,  // (batch, k, n), or (batch, n, k) when trans_b
                 std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                 DType dt, cudaStream_t stream);

// Gradients of bmm_forward in the operands' stored layouts; da or db may be nullptr (skipped).
void bmm_backward(Context& ctx,
                  void* da,        // like a, or nullptr
                  void* db,        // like b, or nullptr
                  const void* dc,  // (batch, m, n)
                  const void* a,   // as in bmm_forward
                  const void* b,   // as in bmm_forward
                  std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                  bool accumulate, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
