#pragma once
// Materialising copies: head split/merge permutations, GQA's repeat_kv, token selection.
// Backward with accumulate=false writes the whole gradient tensor (zeros where the forward
// read nothing); with accumulate=true it adds into it.
#include <cstdint>

namespace zp::kernels::cpu {

// y[b, h, t, d] = x[b, t, offset + h*D + d]: view(B, T, H, D).transpose(1, 2) of the
// columns [offset, offset + H*D) of x. W == H*D, offset 0 is the plain (B,T,H,D) ->
// (B,H,T,D) permutation; W == 3*H*D with offset 0, H*D, 2*H*D splits GPT-2's fused qkv.
void split_heads_forward(float* y,        // (B, H, T, D)
                         const float* x,  // (B, T, W)
                         std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, std::int64_t W,
                         std::int64_t offset);
// Its backward adds into (or, accumulate false, writes) columns [offset, offset + H*D) of
// dx; the other columns are not touched (GPT-2's q, k and v blocks are written by three ops).
void split_heads_backward(float* dx,        // (B, T, W)
                          const float* dy,  // (B, H, T, D)
                          std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, std::int64_t W,
                          std::int64_t offset, bool accumulate);

// y[b, t, h*D + d] = x[b, h, t, d]: transpose(1, 2).reshape(B, T, H*D) (merge heads).
void merge_heads_forward(float* y,        // (B, T, H*D)
                         const float* x,  // (B, H, T, D)
                         std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D);
void merge_heads_backward(float* dx,        // (B, H, T, D)
                          const float* dy,  // (B, T, H*D)
                          std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, bool accumulate);

// HF repeat_kv: y[b, g*rep + r] = x[b, g] for r < rep; backward sums the rep copies.
void repeat_kv_forward(float* y,        // (B, KV*rep, T, D)
                       const float* x,  // (B, KV, T, D)
                       std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T, std::int64_t D);
void repeat_kv_backward(float* dx,        // (B, KV, T, D)
                        const float* dy,  // (B, KV*rep, T, D)
                        std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T, std::int64_t D,
                        bool accumulate);

// y[b] = x[b, t] (e.g. BERT's pooler on the first token: hidden_states[:, 0]).
void select_token_forward(float* y,        // (B, C)
                          const float* x,  // (B, T, C)
                          std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t);
void select_token_backward(float* dx,        // (B, T, C)
                           const float* dy,  // (B, C)
                           std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t, bool accumulate);

}  // namespace zp::kernels::cpu
