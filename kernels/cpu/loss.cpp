#include "kernels/cpu/loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

float row_logsumexp(const float* x, std::int64_t V) {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j]);
  double sum = 0.0;
  for (std::int64_t j = 0; j < V; ++j) sum += static_cast<double>(std::exp(x[j] - mx));
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
  for (std::int64_t j = 0; j < V; ++j) store(d + j, scale * (prob(j) - (j == target ? 1.0f : 0.0f)), accumulate);
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
                [&](std::int64_t j) { return std::exp(lp[j]); });
  }
}

}  // namespace zp::kernels::cpu
