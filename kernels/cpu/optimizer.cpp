#include "kernels/cpu/optimizer.hpp"

#include <cmath>

namespace zp::kernels::cpu {

namespace {

// torch.lerp with a scalar weight: start + w*(end - start) when |w| < 0.5.
float lerp(float start, float end, float w) {
  return std::fabs(w) < 0.5f ? start + w * (end - start) : end - (end - start) * (1.0f - w);
}

}  // namespace

void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, std::int64_t step, const AdamConfig& cfg) {
  const double t = static_cast<double>(step);
  const float decay = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
  const float l2 = static_cast<float>(cfg.weight_decay);
  const float w1 = static_cast<float>(1.0 - cfg.beta1);
  const float b2 = static_cast<float>(cfg.beta2);
  const float w2 = static_cast<float>(1.0 - cfg.beta2);
  const float neg_step_size = static_cast<float>(-(cfg.lr / (1.0 - std::pow(cfg.beta1, t))));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
  const float eps = static_cast<float>(cfg.eps);
  const bool has_wd = cfg.weight_decay != 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    float grad = g[i];
    if (has_wd) {
      if (cfg.decoupled)
        p[i] *= decay;
      else
        grad += l2 * p[i];
    }
    m[i] = lerp(m[i], grad, w1);
    v[i] = v[i] * b2 + w2 * grad * grad;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] += neg_step_size * m[i] / denom;
  }
}

void sgd_step(float* p, const float* g, float* buf, std::int64_t n, std::int64_t step, const SgdConfig& cfg) {
  const float wd = static_cast<float>(cfg.weight_decay);
  const float mom = static_cast<float>(cfg.momentum);
  const float damp = static_cast<float>(1.0 - cfg.dampening);
  const float neg_lr = static_cast<float>(-cfg.lr);
  const bool use_momentum = cfg.momentum != 0.0 && buf != nullptr;
  for (std::int64_t i = 0; i < n; ++i) {
    float grad = g[i];
    if (cfg.weight_decay != 0.0) grad += wd * p[i];
    if (use_momentum) {
      buf[i] = step <= 1 ? grad : buf[i] * mom + damp * grad;
      grad = cfg.nesterov ? grad + mom * buf[i] : buf[i];
    }
    p[i] += neg_lr * grad;
  }
}

void scale_inplace(float* x, std::int64_t n, float alpha) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

bool has_inf_or_nan(const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return true;
  return false;
}

}  // namespace zp::kernels::cpu
