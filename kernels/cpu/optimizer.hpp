#pragma once
// Optimizer steps on flat fp32 partitions of n elements, following torch.optim's
// single-tensor implementations: elementwise math in fp32, scalar coefficients (bias
// corrections, step sizes) in double and rounded to fp32 where PyTorch does so.
#include <cstdint>

namespace zp::kernels::cpu {

// Hyper-parameters as Python floats (double).
struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;  // true: AdamW (p *= 1 - lr*wd first); false: Adam (g += wd*p)
};

// One Adam / AdamW step; `step` is the 1-based count including this step.
//   m = lerp(m, g, 1 - beta1); v = beta2*v + (1 - beta2)*g*g;
//   p -= lr/(1 - beta1^t) * m / (sqrt(v)/sqrt(1 - beta2^t) + eps).
void adam_step(float* p,        // (n) parameters, updated
               const float* g,  // (n) gradients
               float* m,        // (n) first moment (exp_avg), updated
               float* v,        // (n) second moment (exp_avg_sq), updated
               std::int64_t n, std::int64_t step, const AdamConfig& cfg);

struct SgdConfig {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// One torch.optim.SGD step: g += wd*p; buf = g at step 1, else buf = momentum*buf +
// (1 - dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g.
// buf may be nullptr when momentum == 0.
void sgd_step(float* p,        // (n) parameters, updated
              const float* g,  // (n) gradients
              float* buf,      // (n) momentum buffer, updated (or nullptr)
              std::int64_t n, std::int64_t step, const SgdConfig& cfg);

// x *= alpha (gradient unscaling, clipping by a factor).
void scale_inplace(float* x,  // (n)
                   std::int64_t n, float alpha);

// True when some element is ±inf or NaN (fp16 loss-scale overflow check).
bool has_inf_or_nan(const float* x,  // (n)
                    std::int64_t n);

}  // namespace zp::kernels::cpu
