#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/bmm.cuh"
#include "kernels/cuda/columns.cuh"
#include "kernels/cuda/linear.cuh"

namespace zp::kernels::cuda {

namespace {

template <class T>
struct RowValue {
  const T* dy;
  std::int64_t ld;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[1]) const { v[0] = detail::to_float(dy[r * ld + c]); }
};

void forward(Context& ctx, void* y, const void* x, const void* w, const void* b, std::int64_t M, std::int64_t N,
             std::int64_t K, bool trans_w, DType dt, cudaStream_t stream, std::int64_t ld_y = 0) {
  Matmul mm;
  mm.c = y;
  mm.a = x;
  mm.b = w;
  mm.bias = b;
  mm.m = M;
  mm.n = N;
  mm.k = K;
  mm.ldc = ld_y == N ? 0 : ld_y;
  mm.trans_b = trans_w;
  mm.dt = dt;
  matmul(ctx, mm, stream);
}

void bias_backward_ld(Context& ctx, void* db, const void* dy, std::int64_t M, std::int64_t N, std::int64_t ld,
                      bool accumulate, DType dt, cudaStream_t stream) {
  detail::dispatch(dt, "bias_backward", [&](auto tag) {
    using T = decltype(tag);
    detail::column_reduce<T, 1>(ctx, detail::ColumnOutputs<T, 1>{{static_cast<T*>(db)}}, M, N, accumulate,
                                RowValue<T>{static_cast<const T*>(dy), ld}, stream, "bias_backward");
  });
}

// db = (db +) sums, rounded once to db's type (sums in fp32, or in db's type).
template <class T, class S>
__global__ void add_sums_kernel(T* __restrict__ db, const S* __restrict__ sums, std::int64_t n, bool accumulate) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    db[i] = detail::from_float<T>(detail::to_float(sums[i]) + (accumulate ? detail::to_float(db[i]) : 0.0f));
}

// The weight gradient dw (+)= op(a)·op(b) (an (m, n) product over k = the rows of dY) with the
// bias gradient db (+)= the sum over k of dY (op(a) when !of_b, op(b) when of_b: n_bias
// values), by cuBLASLt's bias-gradient epilogue into sums in the scratch (fp32 where cuBLASLt
// takes that, else in dt where db is not added into), then added into db. Only where the Context asks for it and
// matmul_bias_grad takes the product; false: nothing ran, and the caller runs the product and
// the column sum.
bool weight_and_bias_grad(Context& ctx, void* dw, void* db, const void* a, const void* b, std::int64_t m,
                          std::int64_t n, std::int64_t k, bool of_b, bool accumulate, DType dt, cudaStream_t stream) {
  if (!ctx.bias_grad_epilogue() || dw == nullptr || db == nullptr) return false;
  const std::int64_t n_bias = of_b ? n : m;
  if (static_cast<std::size_t>(n_bias) * sizeof(float) > ctx.scratch_bytes()) return false;
  void* sums = ctx.scratch(static_cast<std::size_t>(n_bias) * sizeof(float), "bias gradient");
  const Matmul mm = gemm_operands(dw, a, b, m, n, k, true, false, accumulate, dt);
  bool fp32 = true;
  if (!matmul_bias_grad(ctx, mm, sums, of_b, true, stream)) {
    // cuBLASLt 13 on an H100 takes fp32 sums only for fp32 products. Sums in the product's
    // dtype are rounded once there; added into db they would be rounded twice (a bf16 ulp off
    // the column sum's one rounding, seen on an H100): only where db is written, not added into.
    fp32 = false;
    if (dt == DType::fp32 || accumulate || !matmul_bias_grad(ctx, mm, sums, of_b, false, stream)) return false;
  }
  detail::dispatch(dt, "bias gradient", [&](auto tag) {
    using T = decltype(tag);
    if (fp32)
      add_sums_kernel<T, float><<<detail::grid_for(n_bias, 256), 256, 0, stream>>>(
          static_cast<T*>(db), static_cast<const float*>(sums), n_bias, accumulate);
    else
      add_sums_kernel<T, T><<<detail::grid_for(n_bias, 256), 256, 0, stream>>>(
          static_cast<T*>(db), static_cast<const T*>(sums), n_bias, accumulate);
    ZP_CUDA_CHECK_LAUNCH("add_sums_kernel");
  });
  return true;
}

}  // namespace

void bias_backward(Context& ctx, void* db, const void* dy, std::int64_t M, std::int64_t N, bool accumulate, DType dt,
                   cudaStream_t stream) {
  bias_backward_ld(ctx, db, dy, M, N, N, accumulate, dt, stream);
}

void linear_forward(Context& ctx, void* y, const void* x, const void* w, const void* b, std::int64_t M,
                    std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream, std::int64_t ld_y) {
  forward(ctx, y, x, w, b, M, N, K, true, dt, stream, ld_y);
}

void linear_backward(Context& ctx, void* dx, void* dw, void* db, const void* dy, const void* x, const void* w,
                     std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate, DType dt, cudaStream_t stream,
                     std::int64_t ld_dy) {
  // dy's rows ld_dy apart (a padded pitch): A of both products.
  const std::int64_t ld = ld_dy != 0 ? ld_dy : N;
  if (dx != nullptr) gemm(ctx, dx, dy, w, M, K, N, false, false, accumulate, dt, stream, ld);
  // dW = dY^T X: the bias gradient is the sum of op(A) = dY^T over k.
  if (ld == N && weight_and_bias_grad(ctx, dw, db, dy, x, N, K, M, false, accumulate, dt, stream)) return;
  if (dw != nullptr) gemm(ctx, dw, dy, x, N, K, M, true, false, accumulate, dt, stream, ld);
  if (db != nullptr) bias_backward_ld(ctx, db, dy, M, N, ld, accumulate, dt, stream);
}

void conv1d_forward(Context& ctx, void* y, const void* x, const void* w, const void* b, std::int64_t M,
                    std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream) {
  forward(ctx, y, x, w, b, M, N, K, false, dt, stream);
}

void conv1d_backward(Context& ctx, void* dx, void* dw, void* db, const void* dy, const void* x, const void* w,
                     std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate, DType dt, cudaStream_t stream) {
  if (dx != nullptr) gemm(ctx, dx, dy, w, M, K, N, false, true, accumulate, dt, stream);
  // dW = X^T dY: the bias gradient is the sum of op(B) = dY over k.
  if (weight_and_bias_grad(ctx, dw, db, x, dy, K, N, M, true, accumulate, dt, stream)) return;
  if (dw != nullptr) gemm(ctx, dw, x, dy, K, N, M, true, false, accumulate, dt, stream);
  if (db != nullptr) bias_backward(ctx, db, dy, M, N, accumulate, dt, stream);
}

bool conv1d_gelu_forward(Context& ctx, void* y, void* pre, const void* x, const void* w, const void* b, std::int64_t M,
                         std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream) {
  Matmul mm = gemm_operands(y, x, w, M, N, K, false, false, false, dt);
  mm.bias = b;
  return matmul_gelu(ctx, mm, pre, false, stream);
}

bool conv1d_dgelu_backward(Context& ctx, void* d_pre, const void* dy, const void* w, const void* pre, std::int64_t M,
                           std::int64_t N, std::int64_t K, DType dt, cudaStream_t stream) {
  // d_pre (M, K) = dy (M, N) · W^T, W stored (K, N).
  const Matmul mm = gemm_operands(d_pre, dy, w, M, K, N, false, true, false, dt);
  return matmul_gelu(ctx, mm, pre, true, stream);
}

}  // namespace zp::kernels::cuda
