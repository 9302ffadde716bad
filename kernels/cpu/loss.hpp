#pragma once
// Cross entropy as torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100,
// reduction="mean"): the mean over the rows whose target is not ignore_index.
// When every target is ignored the loss and the gradients are 0 (PyTorch returns NaN).
// Targets must lie in [0, V) unless equal to ignore_index.
#include <cstdint>

namespace zp::kernels::cpu {

constexpr std::int64_t kIgnoreIndex = -100;

// Returns the mean loss; lse[i] = logsumexp(logits[i]) (max-subtracted, sum in double)
// for the backward, written for every row when lse != nullptr.
float cross_entropy_forward(float* lse,                   // (N), or nullptr
                            const float* logits,          // (N, V)
                            const std::int64_t* targets,  // (N)
                            std::int64_t N, std::int64_t V, std::int64_t ignore_index = kIgnoreIndex);

// dlogits = dloss * (softmax(logits) - onehot(target)) / count; 0 on ignored rows.
// lse is the forward's output (nullptr: recomputed).
void cross_entropy_backward(float* dlogits,               // (N, V)
                            const float* logits,          // (N, V)
                            const float* lse,             // (N), or nullptr
                            const std::int64_t* targets,  // (N)
                            std::int64_t N, std::int64_t V, float dloss, bool accumulate,
                            std::int64_t ignore_index = kIgnoreIndex);

// The same loss split as autograd records it: logp = log_softmax(logits), then nll_loss.
void log_softmax_forward(float* logp,          // (N, V)
                         const float* logits,  // (N, V)
                         std::int64_t N, std::int64_t V);
float nll_loss_forward(const float* logp,            // (N, V)
                       const std::int64_t* targets,  // (N)
                       std::int64_t N, std::int64_t V, std::int64_t ignore_index = kIgnoreIndex);
// Gradient of nll_loss(log_softmax(logits)) w.r.t. the logits, from the saved logp:
// dlogits = dloss * (exp(logp) - onehot(target)) / count.
void log_softmax_nll_backward(float* dlogits,               // (N, V)
                              const float* logp,            // (N, V)
                              const std::int64_t* targets,  // (N)
                              std::int64_t N, std::int64_t V, float dloss, bool accumulate,
                              std::int64_t ignore_index = kIgnoreIndex);

// The same two steps as autograd runs them, through the gradient of logp:
// nll_loss's backward writes dlogp = -dloss / count at each row's target, 0 elsewhere (and on
// ignored rows); log_softmax's writes dlogits = dlogp - exp(logp) · Σ_j dlogp (per row).
void nll_loss_backward(float* dlogp,                 // (N, V)
                       const std::int64_t* targets,  // (N)
                       std::int64_t N, std::int64_t V, float dloss, std::int64_t ignore_index = kIgnoreIndex);
void log_softmax_backward(float* dlogits,      // (N, V)
                          const float* logp,   // (N, V)
                          const float* dlogp,  // (N, V)
                          std::int64_t N, std::int64_t V, bool accumulate);

}  // namespace zp::kernels::cpu
