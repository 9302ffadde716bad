#pragma once
// torch.nn.functional.scaled_dot_product_attention in training mode as a fused
// (flash-attention style) kernel on heads (B, H, T, D) (kernels/cpu/sdpa.hpp's twin):
//   S = scale · Q Kᵀ (+ an additive (B, T) mask over the keys; causal: only j <= i),
//   P = softmax(S), O = dropout(P) V,
// keeping O and the row logsumexp (B, H, T) for the backward, which recomputes P from Q, K
// and the logsumexp, and the dropout mask from (seed, offset): element (b, h, i, j) is kept
// when uniform(seed, offset + ((b·H + h)·T + i)·T + j) < 1 - p, the CPU twin's mask bit for bit.
//
// Tiles of 64 queries × 64 keys per block of 4 warps; the products run on the tensor cores
// (mma.sync m16n8k16, fp32 accumulation) for bf16 and fp16, and as fp32 FMAs for fp32
// (exact fp32 products, no TF32). Softmax statistics are fp32; P (and dS in the backward)
// are rounded to the storage dtype before their products, as flash-attention does. The
// backward is deterministic (no atomics): one kernel per 64 keys accumulates dK and dV over
// the queries, another per 64 queries accumulates dQ over the keys. Head dims D of 16, 32,
// 64 and 128 are supported (std::invalid_argument otherwise); any T >= 1.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

bool sdpa_supports(std::int64_t D);

void sdpa_forward(void* o,            // (B, H, T, D)
                  float* lse,         // (B, H, T)
                  const void* q,      // (B, H, T, D)
                  const void* k,      // (B, H, T, D)
                  const void* v,      // (B, H, T, D)
                  const void* mask,   // (B, T) additive, in dt, or nullptr
                  std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool causal, float scale,
                  float p, std::uint64_t seed, std::uint64_t offset, DType dt, cudaStream_t stream);

// Which of dq, dk, dv the backward adds into (true: +=, as the CPU twin) or writes whole
// (false: what they held is not read; the same bits as adding into zeros).
struct SdpaAccumulate {
  bool q = true, k = true, v = true;
};

// Accumulates into dq, dk, dv (+=, or = per `acc`), as the CPU twin. `o` is the forward's output: the row
// terms rowsum(dO ∘ O) come from it (computed into the Context's scratch, B·H·T floats).
void sdpa_backward(Context& ctx,
                   void* dq,            // (B, H, T, D)
                   void* dk,            // (B, H, T, D)
                   void* dv,            // (B, H, T, D)
                   const void* dout,    // (B, H, T, D)
                   const void* q, const void* k, const void* v,
                   const void* o,       // (B, H, T, D) the forward's output
                   const float* lse,    // (B, H, T)
                   const void* mask,    // (B, T) additive, in dt, or nullptr
                   std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool causal, float scale,
                   float p, std::uint64_t seed, std::uint64_t offset, DType dt, cudaStream_t stream,
                   SdpaAccumulate acc = {});

}  // namespace zp::kernels::cuda
