#include "kernels/cpu/loss.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

// Rows are as long as a vocabulary (50k for GPT-2): the passes over them are written so
// the compiler vectorises them (lanes of partial results, an exp without library calls).
constexpr int kLanes = 16;

// e^x for x <= 0 (a logit minus its row's maximum): 2^n · e^r with n = round(x · log2 e)
// and r = x − n · ln 2 in two parts (Cody–Waite), e^r by its degree-6 minimax polynomial on
// |r| <= ln2 / 2. Relative error below 3e-7 against std::exp; arguments below -87 (where
// e^x < 2e-38, nothing next to the row's maximum term 1) give e^-87; NaN gives NaN.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // NaN passes
  // round(t) for t <= 0 as a truncation (vectorises; std::floor would be a call); the
  // clamp keeps a NaN's conversion defined (its r, and so the result, is NaN anyway)
  float t = x * 1.44269504088896341f - 0.5f;
  t = t > -127.0f ? t : -127.0f;
  const auto ni = static_cast<std::int32_t>(t);
  const auto n = static_cast<float>(ni);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t bits = (ni + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// The row's maximum, or NaN when the row holds a NaN.
float row_max(const float* x, std::int64_t V) {
  float lane[kLanes];
  int nan[kLanes] = {};
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  std::int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
      nan[l] |= x[j + l] != x[j + l];
    }
  float mx = -std::numeric_limits<float>::infinity();
  bool any_nan = false;
  for (int l = 0; l < kLanes; ++l) {
    mx = std::max(mx, lane[l]);
    any_nan = any_nan || nan[l] != 0;
  }
  for (; j < V; ++j) {
    mx = std::max(mx, x[j]);
    any_nan = any_nan || std::isnan(x[j]);
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : mx;
}

float row_logsumexp(const float* x, std::int64_t V) {
  const float mx = row_max(x, V);
  if (!std::isfinite(mx)) {
    // An infinite or NaN logit (an fp16 overflow upstream): the loss is not finite, so the
    // overflow check sees it.
    double sum = 0.0;
    for (std::int64_t j = 0; j < V; ++j) sum += static_cast<double>(std::exp(x[j] - mx));
    return mx + static_cast<float>(std::log(sum));
  }
  float lane[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += exp_nonpositive(x[j + l] - mx);
  double sum = 0.0;
  for (float l : lane) sum += static_cast<double>(l);
  for (; j < V; ++j) sum += static_cast<double>(exp_nonpositive(x[j] - mx));
  return mx + static_cast<float>(std::log(sum));
}

std::int64_t count_targets(const std::int64_t* targets, std::int64_t N, std::int64_t ignore_index) {
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < N; ++i) count += targets[i] != ignore_index ? 1 : 0;
  return count;
}

// One row of dlogits: scale * (p - onehot), p[j] = prob(j); zeros on an ignored row.
template <class Prob>
void ce_grad_row(float* d, std::int64_t target, std::int64_t V, float scale, bool ignored, bool accumulate, Prob prob) {
  if (ignored) {
    if (!accumulate) std::fill(d, d + V, 0.0f);
    return;
  }
  if (accumulate)
    for (std::int64_t j = 0; j < V; ++j) d[j] += scale * prob(j);
  else
    for (std::int64_t j = 0; j < V; ++j) d[j] = scale * prob(j);
  if (target >= 0 && target < V) d[target] -= scale;
}

}  // namespace

float cross_entropy_forward(float* lse, const float* logits, const std::int64_t* targets, std::int64_t N,
                            std::int64_t V, std::int64_t ignore_index) {
  double total = 0.0;
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;
    const float l = row_logsumexp(x, V);
    if (lse != nullptr) lse[i] = l;
    if (targets[i] == ignore_index) continue;
    total += static_cast<double>(l - x[targets[i]]);
    ++count;
  }
  return count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const std::int64_t* targets,
                            std::int64_t N, std::int64_t V, float dloss, bool accumulate, std::int64_t ignore_index) {
  const std::int64_t count = count_targets(targets, N, ignore_index);
  const float scale = count > 0 ? dloss / static_cast<float>(count) : 0.0f;
  for (std::int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;
    const bool ignored = targets[i] == ignore_index;
    const float l = ignored ? 0.0f : (lse != nullptr ? lse[i] : row_logsumexp(x, V));
    if (std::isfinite(l))
      ce_grad_row(dlogits + i * V, targets[i], V, scale, ignored, accumulate,
                  [&](std::int64_t j) { return exp_nonpositive(x[j] - l); });
    else  // non-finite logits: propagate them
      ce_grad_row(dlogits + i * V, targets[i], V, scale, ignored, accumulate,
                  [&](std::int64_t j) { return std::exp(x[j] - l); });
  }
}

void log_softmax_forward(float* logp, const float* logits, std::int64_t N, std::int64_t V) {
  for (std::int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;
    const float l = row_logsumexp(x, V);
    for (std::int64_t j = 0; j < V; ++j) logp[i * V + j] = x[j] - l;
  }
}

float nll_loss_forward(const float* logp, const std::int64_t* targets, std::int64_t N, std::int64_t V,
                       std::int64_t ignore_index) {
  double total = 0.0;
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets[i] == ignore_index) continue;
    total -= static_cast<double>(logp[i * V + targets[i]]);
    ++count;
  }
  return count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
}

void log_softmax_nll_backward(float* dlogits, const float* logp, const std::int64_t* targets, std::int64_t N,
                              std::int64_t V, float dloss, bool accumulate, std::int64_t ignore_index) {
  const std::int64_t count = count_targets(targets, N, ignore_index);
  const float scale = count > 0 ? dloss / static_cast<float>(count) : 0.0f;
  for (std::int64_t i = 0; i < N; ++i) {
    const float* lp = logp + i * V;
    ce_grad_row(dlogits + i * V, targets[i], V, scale, targets[i] == ignore_index, accumulate,
                [&](std::int64_t j) { return exp_nonpositive(lp[j]); });
  }
}

void nll_loss_backward(float* dlogp, const std::int64_t* targets, std::int64_t N, std::int64_t V, float dloss,
                       std::int64_t ignore_index) {
  const std::int64_t count = count_targets(targets, N, ignore_index);
  const float scale = count > 0 ? dloss / static_cast<float>(count) : 0.0f;
  std::fill(dlogp, dlogp + N * V, 0.0f);
  for (std::int64_t i = 0; i < N; ++i)
    if (targets[i] != ignore_index && targets[i] >= 0 && targets[i] < V) dlogp[i * V + targets[i]] = -scale;
}

void log_softmax_backward(float* dlogits, const float* logp, const float* dlogp, std::int64_t N, std::int64_t V,
                          bool accumulate) {
  for (std::int64_t i = 0; i < N; ++i) {
    const float* lp = logp + i * V;
    const float* g = dlogp + i * V;
    float* d = dlogits + i * V;
    double sum = 0.0;
    for (std::int64_t j = 0; j < V; ++j) sum += static_cast<double>(g[j]);
    const auto s = static_cast<float>(sum);
    if (accumulate)
      for (std::int64_t j = 0; j < V; ++j) d[j] += g[j] - exp_nonpositive(lp[j]) * s;
    else
      for (std::int64_t j = 0; j < V; ++j) d[j] = g[j] - exp_nonpositive(lp[j]) * s;
  }
}

}  // namespace zp::kernels::cpu
