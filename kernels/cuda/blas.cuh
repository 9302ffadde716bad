#pragma once
// Internal: the cuBLASLt state of a Context and the one row-major matmul every GEMM
// launcher (bmm, linear) goes through.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// A cuBLASLt call that did not return CUBLAS_STATUS_SUCCESS throws CudaError.
void check_cublas(cublasStatus_t status, const char* what, const char* file, int line);
#define ZP_CUBLAS_CHECK(call) ::zp::kernels::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// C[i] (= or +=) op(A[i]) · op(B[i]) (+ bias on every row) for i < batch, row-major, as
// kernels/cpu's gemm: op(A) is (m, k), stored (m, k) or (k, m) when trans_a; op(B) is
// (k, n), stored (k, n) or (n, k) when trans_b; C is (m, n). fp32 accumulation; fp32
// operands run without TF32 unless the Context allows it.
struct Matmul {
  void* c = nullptr;             // (batch, m, n), batch items stride_c apart
  const void* a = nullptr;       // (batch, m, k) or (batch, k, m)
  const void* b = nullptr;       // (batch, k, n) or (batch, n, k)
  const void* bias = nullptr;    // (n), or nullptr; only with batch == 1 and !accumulate
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements
  // Row strides (elements) of the stored operands; 0: packed (k or m for A, n or k for B, n for C).
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false, trans_b = false, accumulate = false;
  DType dt = DType::fp32;
  bool c_fp32 = false;  // C is fp32 whatever dt (A and B in dt): an accumulator of staged parts
};
void matmul(Context& ctx, const Matmul& mm, cudaStream_t stream);
// The Matmul of gemm()'s arguments (bmm.cuh): packed B and C, A's row stride lda (0: packed).
Matmul gemm_operands(void* c, const void* a, const void* b, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
                     bool trans_b, bool accumulate, DType dt, std::int64_t lda = 0);

// mm (batch 1, no bias) with the sum over k of op(A) (length m), or of op(B) (length n) when
// `of_b`, written (not added) to bias_grad by cuBLASLt's bias-gradient epilogue as the product
// reads that operand: in fp32 when `sums_fp32`, else in mm.dt. Returns false, having run
// nothing, where the product would be staged (a dimension not a multiple of 8, an operand not
// 16-byte aligned or not packed) or cuBLASLt has no algorithm for the epilogue on this GPU
// (remembered per shape).
bool matmul_bias_grad(Context& ctx, const Matmul& mm, void* bias_grad, bool of_b, bool sums_fp32, cudaStream_t stream);

// mm (batch 1, packed, not accumulating) with cuBLASLt's GELU epilogues (its tanh form):
// forward (`derivative` false), C = gelu(op(A)·op(B) + bias), the GELU of the fp32 sums rounded
// once to mm.dt, and aux = op(A)·op(B) + bias (mm.bias required; one not 16-byte aligned is
// copied to the Context's scratch first); backward (`derivative` true, no bias), C = gelu'(aux) ·
// (op(A)·op(B)), aux read, the product rounded to a 16-bit mm.dt before the derivative applies
// (measured: linear.cuh). aux is (m, n) in C's layout. Returns false, having run
// nothing, where kernels::gelu_epilogue_takes refuses the operands; throws CudaError where
// cuBLASLt has no algorithm for the epilogue on this GPU.
bool matmul_gelu(Context& ctx, const Matmul& mm, const void* aux, bool derivative, cudaStream_t stream);

// A cached plan: descriptors and the heuristic's algorithm for one shape.
struct MatmulPlan {
  bool unsupported = false;  // cuBLASLt had no algorithm (asked only of the optional epilogues)
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
};

// The epilogue of a cached plan: none, the bias added, a bias gradient (the sum over k of
// op(A), or of op(B)) written (in fp32, or in the product's dtype: *_in_dt), or the GELU with
// the bias and the pre-activation written aside (gelu_aux_bias), or the GELU's derivative at a
// pre-activation read aside (dgelu).
enum class Epilogue : int { none, bias, bias_grad_a, bias_grad_b, bias_grad_a_in_dt, bias_grad_b_in_dt, gelu_aux_bias, dgelu };
constexpr bool is_bias_grad(Epilogue e) {
  return e == Epilogue::bias_grad_a || e == Epilogue::bias_grad_b || e == Epilogue::bias_grad_a_in_dt ||
         e == Epilogue::bias_grad_b_in_dt;
}
constexpr bool is_gelu(Epilogue e) { return e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu; }

// (dtype, batch, m, n, k, strides a/b/c, row strides a/b/c, trans a/b, epilogue, alignments a/b/c,
// TF32 allowed, C in fp32)
using MatmulKey = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                             std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, int, int, int, int,
                             int, bool>;

struct Context::Impl {
  int device = 0;
  int sm_count = 0;
  bool allow_tf32 = false;
  double staged_min_work = 0.0;
  int sdpa_backward_chunk = 16;
  bool sdpa_backward_one_pass = false;
  bool sdpa_backward_atomic_dq = false;
  bool sdpa_backward_kv_registers = false;
  std::int64_t layernorm_backward_warps = 0;
  bool sdpa_cudnn = false;
  std::shared_ptr<void> cudnn;  // released first by ~Impl (cuDNN's handle before the buffers)
  std::uint64_t staged_products = 0;
  bool bias_grad_epilogue = false;
  std::uint64_t bias_grad_epilogues = 0;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* scratch = nullptr;
  std::size_t scratch_bytes = 0;
  void* buffer = nullptr;
  std::size_t buffer_bytes = 0;
  std::map<MatmulKey, MatmulPlan> plans;
  std::int64_t driver_growth[2] = {0, 0};  // by Context::Library
  ~Impl();
};

}  // namespace zp::kernels::cuda
