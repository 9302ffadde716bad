#include "kernels/cpu/linear.hpp"

#include <vector>

#include "kernels/cpu/bmm.hpp"
#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

namespace {

void add_bias(float* y, const float* b, std::int64_t M, std::int64_t N) {
  if (b == nullptr) return;
  for (std::int64_t i = 0; i < M; ++i) {
    float* row = y + i * N;
    for (std::int64_t j = 0; j < N; ++j) row[j] += b[j];
  }
}

}  // namespace

void bias_backward(float* db, const float* dy, std::int64_t M, std::int64_t N, bool accumulate) {
  std::vector<double> sum(static_cast<std::size_t>(N), 0.0);
  for (std::int64_t i = 0; i < M; ++i) {
    const float* row = dy + i * N;
    for (std::int64_t j = 0; j < N; ++j) sum[static_cast<std::size_t>(j)] += static_cast<double>(row[j]);
  }
  detail::store_all(db, sum.data(), N, accumulate);
}

void linear_forward(float* y, const float* x, const float* w, const float* b, std::int64_t M, std::int64_t N,
                    std::int64_t K) {
  gemm(y, x, w, M, N, K, false, true, false);
  add_bias(y, b, M, N);
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, std::int64_t M,
                     std::int64_t N, std::int64_t K, bool accumulate) {
  if (dx != nullptr) gemm(dx, dy, w, M, K, N, false, false, accumulate);
  if (dw != nullptr) gemm(dw, dy, x, N, K, M, true, false, accumulate);
  if (db != nullptr) bias_backward(db, dy, M, N, accumulate);
}

void conv1d_forward(float* y, const float* x, const float* w, const float* b, std::int64_t M, std::int64_t N,
                    std::int64_t K) {
  gemm(y, x, w, M, N, K, false, false, false);
  add_bias(y, b, M, N);
}

void conv1d_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, std::int64_t M,
                     std::int64_t N, std::int64_t K, bool accumulate) {
  if (dx != nullptr) gemm(dx, dy, w, M, K, N, false, true, accumulate);
  if (dw != nullptr) gemm(dw, x, dy, K, N, M, true, false, accumulate);
  if (db != nullptr) bias_backward(db, dy, M, N, accumulate);
}

}  // namespace zp::kernels::cpu
