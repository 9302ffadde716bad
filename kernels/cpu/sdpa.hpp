#pragma once
// Fused (flash / memory-efficient) attention in training mode, on heads:
//   S = scale · Q Kᵀ (+ an additive (B, 1, 1, T) mask; causal: only j <= i),
//   P = softmax(S), O = dropout(P) V,
// keeping only O and the row logsumexp (B, H, T) for backward, which recomputes P from Q, K
// and the logsumexp, and the dropout mask from (seed, offset): element (b, h, i, j) is kept
// when uniform(seed, offset + ((b·H + h)·T + i)·T + j) < 1 - p, as kernels/cpu/dropout does.
//
// Two entry points, one computation:
//  - sdpa_*: q, k, v and o (B, H, T, D) contiguous, k and v with H heads, an optional mask;
//  - attention_*: any layout (each operand through its own strides) and grouped k, v with
//    K heads (H % K == 0, query head h reads kv head h / (H / K)), as PyTorch's flash sdpa
//    (enable_gqa) and flash-attn's flash_attn_func take them from transformers' sdpa and
//    flash_attention_2 paths: (B, T, H, D) views of the projections or the KV cache's
//    (B, K, T, D) copies, the output written in (B, T, H, D) order. The executor runs both
//    paths through it (models::heads_layout).
#include <cstdint>

namespace zp::kernels::cpu {

// Element (b, h, t, d) of an operand lives at base[b·b_ + h·h_ + t·t_ + d].
struct HeadStrides {
  std::int64_t b = 0, h = 0, t = 0;
};
// (B, H, T, D) contiguous.
inline HeadStrides bhtd(std::int64_t H, std::int64_t T, std::int64_t D) { return {H * T * D, T * D, D}; }
// Heads as column blocks of a (B, T, W) tensor: (B, T, H, D) when W = H·D.
inline HeadStrides bthd(std::int64_t T, std::int64_t W, std::int64_t D) { return {T * W, D, W}; }

void attention_forward(float* o, HeadStrides so,          // H heads
                       float* lse,                        // (B, H, T)
                       const float* q, HeadStrides sq,    // H heads
                       const float* k, HeadStrides sk,    // K heads
                       const float* v, HeadStrides sv,    // K heads
                       const float* mask,                 // (B, T) additive, or nullptr
                       std::int64_t B, std::int64_t H, std::int64_t K, std::int64_t T, std::int64_t D, bool causal,
                       float scale, float p, std::uint64_t seed, std::uint64_t offset);

// Accumulates into dq, dk, dv (+=); dk and dv sum over the query heads sharing a kv head.
void attention_backward(float* dq, HeadStrides sdq, float* dk, HeadStrides sdk, float* dv, HeadStrides sdv,
                        const float* dout, HeadStrides sdo,
                        const float* q, HeadStrides sq, const float* k, HeadStrides sk, const float* v, HeadStrides sv,
                        const float* lse,   // (B, H, T)
                        const float* mask,  // (B, T) additive, or nullptr
                        std::int64_t B, std::int64_t H, std::int64_t K, std::int64_t T, std::int64_t D, bool causal,
                        float scale, float p, std::uint64_t seed, std::uint64_t offset);

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
