#pragma once
// Where the fused MLP (models::Fn::mlp_gelu_tanh) runs its GELU as cuBLASLt's epilogues
// (kernels/cuda/linear.cu), shared with the CPU-side rule that predicts the CUDA device's
// temporaries (exec/cuda_scratch.cpp): both ask it of the same pointers.
#include <cstdint>
#include <initializer_list>

namespace zp::kernels {

// Whether a packed row-major product C(m, n) = A(m, k) · op(B), with an (m, n) auxiliary
// matrix in C's layout (the pre-activation), runs with a GELU epilogue: n and k whole multiples
// of 8 elements (cuBLASLt's auxiliary matrix needs a leading dimension of 8s; rows of 16 bytes
// keep the product off the staged path) and every operand 16-byte aligned. Elsewhere the chain
// runs: the product, then the GELU's kernel (in backward through a temporary of C's size).
inline bool gelu_epilogue_takes(std::int64_t m, std::int64_t n, std::int64_t k,
                                std::initializer_list<const void*> operands) {
  if (m <= 0 || n <= 0 || k <= 0 || n % 8 != 0 || k % 8 != 0) return false;
  for (const void* p : operands)
    if (p == nullptr || (reinterpret_cast<std::uintptr_t>(p) & 15u) != 0) return false;
  return true;
}

}  // namespace zp::kernels
