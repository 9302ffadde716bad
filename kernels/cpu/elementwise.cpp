#include "kernels/cpu/elementwise.hpp"

#include <vector>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

// Strides of b (contiguous in b_dims) seen from y's index space: 0 along broadcast dims.
Dims4 broadcast_strides(const Dims4& dims, const Dims4& b_dims) {
  Dims4 s{};
  std::int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    const auto k = static_cast<std::size_t>(i);
    s[k] = (b_dims[k] == 1 && dims[k] != 1) ? 0 : stride;
    stride *= b_dims[k];
  }
  return s;
}

std::int64_t numel(const Dims4& d) { return d[0] * d[1] * d[2] * d[3]; }

// Calls f(y_index, b_index) for every element of y in order.
template <class F>
void for_each_broadcast(const Dims4& dims, const Dims4& b_dims, F f) {
  const Dims4 s = broadcast_strides(dims, b_dims);
  std::int64_t yi = 0;
  for (std::int64_t i0 = 0; i0 < dims[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < dims[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < dims[2]; ++i2) {
        const std::int64_t base = i0 * s[0] + i1 * s[1] + i2 * s[2];
        for (std::int64_t i3 = 0; i3 < dims[3]; ++i3) f(yi++, base + i3 * s[3]);
      }
}

}  // namespace

void copy_accumulate(float* dst, const float* src, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dst + i, src[i], accumulate);
}

void add_forward(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_backward(float* da, float* db, const float* dy, std::int64_t n, bool accumulate) {
  if (da != nullptr) copy_accumulate(da, dy, n, accumulate);
  if (db != nullptr) copy_accumulate(db, dy, n, accumulate);
}

void add_broadcast_forward(float* y, const float* a, const float* b, const Dims4& dims, const Dims4& b_dims) {
  for_each_broadcast(dims, b_dims, [&](std::int64_t i, std::int64_t j) { y[i] = a[i] + b[j]; });
}

void add_broadcast_backward(float* da, float* db, const float* dy, const Dims4& dims, const Dims4& b_dims,
                            bool accumulate) {
  if (da != nullptr) copy_accumulate(da, dy, numel(dims), accumulate);
  if (db == nullptr) return;
  std::vector<double> sum(static_cast<std::size_t>(numel(b_dims)), 0.0);
  for_each_broadcast(dims, b_dims, [&](std::int64_t i, std::int64_t j) {
    sum[static_cast<std::size_t>(j)] += static_cast<double>(dy[i]);
  });
  detail::store_all(db, sum.data(), numel(b_dims), accumulate);
}

void mul_forward(float* y, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void mul_backward(float* da, float* db, const float* dy, const float* a, const float* b, std::int64_t n,
                  bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (da != nullptr) store(da + i, dy[i] * b[i], accumulate);
    if (db != nullptr) store(db + i, dy[i] * a[i], accumulate);
  }
}

void scale_forward(float* y, const float* x, std::int64_t n, float alpha) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
}

void scale_backward(float* dx, const float* dy, std::int64_t n, float alpha, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx + i, alpha * dy[i], accumulate);
}

void add_scalar_forward(float* y, const float* x, std::int64_t n, float c) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] + c;
}

void add_scalar_backward(float* dx, const float* dy, std::int64_t n, bool accumulate) {
  copy_accumulate(dx, dy, n, accumulate);
}

void pow2_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];
}

void pow2_backward(float* dx, const float* x, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx + i, 2.0f * x[i] * dy[i], accumulate);
}

void pow3_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i] * x[i];
}

void pow3_backward(float* dx, const float* x, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx + i, 3.0f * x[i] * x[i] * dy[i], accumulate);
}

}  // namespace zp::kernels::cpu
