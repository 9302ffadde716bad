#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

void softmax_row(float* y, const float* x, std::int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  if (std::isinf(mx) && mx < 0.0f) {  // every entry is -inf
    std::fill(y, y + n, 0.0f);
    return;
  }
  double sum = 0.0;
  for (std::int64_t j = 0; j < n; ++j) {
    y[j] = std::exp(x[j] - mx);
    sum += static_cast<double>(y[j]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (std::int64_t j = 0; j < n; ++j) y[j] *= inv;
}

}  // namespace

void softmax_forward(float* y, const float* x, std::int64_t rows, std::int64_t n) {
  for (std::int64_t i = 0; i < rows; ++i) softmax_row(y + i * n, x + i * n, n);
}

void softmax_backward(float* dx, const float* y, const float* dy, std::int64_t rows, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* yr = y + i * n;
    const float* dyr = dy + i * n;
    double dot = 0.0;
    for (std::int64_t j = 0; j < n; ++j) dot += static_cast<double>(yr[j]) * static_cast<double>(dyr[j]);
    const float d = static_cast<float>(dot);
    for (std::int64_t j = 0; j < n; ++j) store(dx + i * n + j, yr[j] * (dyr[j] - d), accumulate);
  }
}

void softmax_backward(float* dx, const float* y, const float* dy, float* tmp, std::int64_t rows, std::int64_t n,
                      bool accumulate) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* yr = y + i * n;
    const float* dyr = dy + i * n;
    float* t = tmp + i * n;
    double sum = 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      t[j] = dyr[j] * yr[j];
      sum += static_cast<double>(t[j]);
    }
    const auto s = static_cast<float>(sum);
    for (std::int64_t j = 0; j < n; ++j) store(dx + i * n + j, t[j] - yr[j] * s, accumulate);
  }
}

void causal_mask(float* m, std::int64_t T, float masked) {
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < T; ++j) m[i * T + j] = j > i ? masked : 0.0f;
}

void causal_where_forward(float* y, const float* x, std::int64_t BH, std::int64_t T, float masked) {
  for (std::int64_t r = 0; r < BH * T; ++r) {
    const std::int64_t i = r % T;
    for (std::int64_t j = 0; j < T; ++j) y[r * T + j] = j > i ? masked : x[r * T + j];
  }
}

void causal_where_backward(float* dx, const float* dy, std::int64_t BH, std::int64_t T, bool accumulate) {
  for (std::int64_t r = 0; r < BH * T; ++r) {
    const std::int64_t i = r % T;
    for (std::int64_t j = 0; j < T; ++j) store(dx + r * T + j, j > i ? 0.0f : dy[r * T + j], accumulate);
  }
}

void padding_mask(float* m, const std::int64_t* attention_mask, std::int64_t B, std::int64_t T, float masked) {
  for (std::int64_t i = 0; i < B * T; ++i) m[i] = attention_mask[i] != 0 ? 0.0f : masked;
}

void rope_tables(float* cos, float* sin, std::int64_t T, std::int64_t D, float theta) {
  const std::int64_t half = D / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    const float inv_freq = 1.0f / std::pow(theta, expo);
    for (std::int64_t t = 0; t < T; ++t) {
      const float f = static_cast<float>(t) * inv_freq;
      const float c = std::cos(f), s = std::sin(f);
      cos[t * D + i] = c;
      cos[t * D + i + half] = c;
      sin[t * D + i] = s;
      sin[t * D + i + half] = s;
    }
  }
}

void rope_forward(float* y, const float* x, const float* cos, const float* sin, std::int64_t B, std::int64_t H,
                  std::int64_t T, std::int64_t D) {
  const std::int64_t half = D / 2;
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* xr = x + (bh * T + t) * D;
      float* yr = y + (bh * T + t) * D;
      const float* c = cos + t * D;
      const float* s = sin + t * D;
      for (std::int64_t j = 0; j < half; ++j) yr[j] = xr[j] * c[j] - xr[j + half] * s[j];
      for (std::int64_t j = half; j < D; ++j) yr[j] = xr[j] * c[j] + xr[j - half] * s[j];
    }
}

void rope_backward(float* dx, const float* dy, const float* cos, const float* sin, std::int64_t B, std::int64_t H,
                   std::int64_t T, std::int64_t D, bool accumulate) {
  const std::int64_t half = D / 2;
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* g = dy + (bh * T + t) * D;
      float* dxr = dx + (bh * T + t) * D;
      const float* c = cos + t * D;
      const float* s = sin + t * D;
      for (std::int64_t j = 0; j < half; ++j) store(dxr + j, g[j] * c[j] + g[j + half] * s[j + half], accumulate);
      for (std::int64_t j = half; j < D; ++j) store(dxr + j, g[j] * c[j] - g[j - half] * s[j - half], accumulate);
    }
}

}  // namespace zp::kernels::cpu
