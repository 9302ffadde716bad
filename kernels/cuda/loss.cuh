#pragma once
// Cross entropy as torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100,
// reduction="mean") over the full vocabulary (kernels/cpu/loss.hpp's twins): the mean over
// the rows whose target is not ignore_index; 0 (and zero gradients) when every target is
// ignored. Row statistics (max, sum of exponentials, logsumexp) in fp32; the mean is a
// fixed-order sum (double) over the rows, so two runs give the same bits. The loss is
// written to device memory (no synchronisation). Targets (device int64) must lie in [0, V)
// unless equal to ignore_index.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

constexpr std::int64_t kIgnoreIndex = -100;

// Fused softmax-cross-entropy forward: one pass over each row (online max and sum).
// loss[0] = the mean loss; lse[i] = logsumexp(logits[i]) for every row when lse != nullptr.
// The logits' rows are ld elements apart (0: V; a padded row pitch, models::Tensor::row_pitch).
void cross_entropy_forward(Context& ctx,
                           float* loss,                  // (1)
                           float* lse,                   // (N), or nullptr
                           const void* logits,           // (N, V), rows ld apart
                           const std::int64_t* targets,  // (N)
                           std::int64_t N, std::int64_t V, std::int64_t ignore_index, DType dt, cudaStream_t stream,
                           std::int64_t ld = 0);

// dlogits = dloss * (softmax(logits) - onehot(target)) / count; 0 on ignored rows. lse is
// the forward's output (nullptr: recomputed). dlogits may be logits itself (in place). Both
// have rows ld elements apart (0: V); the elements past V in each row are not touched.
void cross_entropy_backward(Context& ctx,
                            void* dlogits,                // (N, V), rows ld apart
                            const void* logits,           // (N, V), rows ld apart
                            const float* lse,             // (N), or nullptr
                            const std::int64_t* targets,  // (N)
                            std::int64_t N, std::int64_t V, float dloss, bool accumulate, std::int64_t ignore_index,
                            DType dt, cudaStream_t stream, std::int64_t ld = 0);

// The same loss split as autograd records it: logp = log_softmax(logits), then nll_loss.
void log_softmax_forward(void* logp,          // (N, V)
                         const void* logits,  // (N, V)
                         std::int64_t N, std::int64_t V, DType dt, cudaStream_t stream);
void nll_loss_forward(float* loss,                  // (1)
                      const void* logp,             // (N, V)
                      const std::int64_t* targets,  // (N)
                      std::int64_t N, std::int64_t V, std::int64_t ignore_index, DType dt, cudaStream_t stream);
// dlogits = dloss * (exp(logp) - onehot(target)) / count, from the saved logp.
void log_softmax_nll_backward(Context& ctx,
                              void* dlogits,                // (N, V)
                              const void* logp,             // (N, V)
                              const std::int64_t* targets,  // (N)
                              std::int64_t N, std::int64_t V, float dloss, bool accumulate,
                              std::int64_t ignore_index, DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
