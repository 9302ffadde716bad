#pragma once
// torch.nn.functional.scaled_dot_product_attention in training mode, as a fused (flash /
// memory-efficient) kernel computes it on heads (B, H, T, D):
//   S = scale · Q Kᵀ (+ an additive (B, 1, 1, T) mask; causal: only j <= i),
//   P = softmax(S), O = dropout(P) V,
// keeping only O and the row logsumexp (B, H, T) for backward, which recomputes P from Q, K
// and the logsumexp, and the dropout mask from (seed, offset): element (b, h, i, j) is kept
// when uniform(seed, offset + ((b·H + h)·T + i)·T + j) < 1 - p, as kernels/cpu/dropout does.
#include <cstdint>

namespace zp::kernels::cpu {

void sdpa_forward(float* o,            // (B, H, T, D)
                  float* lse,          // (B, H, T)
                  const float* q,      // (B, H, T, D)
                  const float* k,      // (B, H, T, D)
                  const float* v,      // (B, H, T, D)
                  const float* mask,   // (B, T) additive, or nullptr
                  std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool causal, float scale,
                  float p, std::uint64_t seed, std::uint64_t offset);

// Accumulates into dq, dk, dv (+=).
void sdpa_backward(float* dq,           // (B, H, T, D)
                   float* dk,           // (B, H, T, D)
                   float* dv,           // (B, H, T, D)
                   const float* dout,   // (B, H, T, D)
                   const float* q, const float* k, const float* v,
                   const float* lse,    // (B, H, T)
                   const float* mask,   // (B, T) additive, or nullptr
                   std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool causal, float scale,
                   float p, std::uint64_t seed, std::uint64_t offset);

}  // namespace zp::kernels::cpu
