#include "kernels/cpu/activation.hpp"

#include <cmath>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

constexpr float kSqrtHalf = 0.70710678118654752440f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kGeluCoeff = 0.044715f;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void gelu_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kSqrtHalf));
}

void gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + std::erf(x[i] * kSqrtHalf));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]);
    store(dx + i, dy[i] * (cdf + x[i] * pdf), accumulate);
  }
}

void gelu_tanh_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float inner = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
    y[i] = 0.5f * v * (1.0f + std::tanh(inner));
  }
}

void gelu_tanh_backward(float* dx, const float* x, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kSqrt2OverPi * (v + kGeluCoeff * v * v * v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v * v);
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner;
    store(dx + i, dy[i] * grad, accumulate);
  }
}

void silu_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

void silu_backward(float* dx, const float* x, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(x[i]);
    store(dx + i, dy[i] * s * (1.0f + x[i] * (1.0f - s)), accumulate);
  }
}

void relu_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN propagates, as clamp_min
}

void relu_backward(float* dx, const float* y, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx + i, y[i] <= 0.0f ? 0.0f : dy[i], accumulate);
}

void tanh_forward(float* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

void tanh_backward(float* dx, const float* y, const float* dy, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dx + i, dy[i] * (1.0f - y[i] * y[i]), accumulate);
}

}  // namespace zp::kernels::cpu
