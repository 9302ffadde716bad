#pragma once
// Materialising copies (kernels/cpu/layout.hpp's twins): head split/merge permutations,
// GQA's repeat_kv, token selection. Backward with accumulate=false writes the whole
// gradient tensor (zeros where the forward read nothing); with accumulate=true it adds.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

// y[b, h, t, d] = x[b, t, offset + h*D + d]: view(B, T, H, D).transpose(1, 2) of the
// columns [offset, offset + H*D) of x.
void split_heads_forward(void* y,        // (B, H, T, D)
                         const void* x,  // (B, T, W)
                         std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, std::int64_t W,
                         std::int64_t offset, DType dt, cudaStream_t stream);
// Its backward adds into (or, accumulate false, writes) columns [offset, offset + H*D) of
// dx; the other columns are not touched (GPT-2's q, k and v blocks are written by three ops).
void split_heads_backward(void* dx,        // (B, T, W)
                          const void* dy,  // (B, H, T, D)
                          std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, std::int64_t W,
                          std::int64_t offset, bool accumulate, DType dt, cudaStream_t stream);

// y[b, t, h*D + d] = x[b, h, t, d]: transpose(1, 2).reshape(B, T, H*D).
void merge_heads_forward(void* y,        // (B, T, H*D)
                         const void* x,  // (B, H, T, D)
                         std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, DType dt,
                         cudaStream_t stream);
void merge_heads_backward(void* dx,        // (B, H, T, D)
                          const void* dy,  // (B, T, H*D)
                          std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, bool accumulate, DType dt,
                          cudaStream_t stream);

// HF repeat_kv: y[b, g*rep + r] = x[b, g] for r < rep; backward sums the rep copies in order.
void repeat_kv_forward(void* y,        // (B, KV*rep, T, D)
                       const void* x,  // (B, KV, T, D)
                       std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T, std::int64_t D, DType dt,
                       cudaStream_t stream);
void repeat_kv_backward(void* dx,        // (B, KV, T, D)
                        const void* dy,  // (B, KV*rep, T, D)
                        std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T, std::int64_t D,
                        bool accumulate, DType dt, cudaStream_t stream);

// y[b] = x[b, t].
void select_token_forward(void* y,        // (B, C)
                          const void* x,  // (B, T, C)
                          std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t, DType dt,
                          cudaStream_t stream);
void select_token_backward(void* dx,        // (B, T, C)
                           const void* dy,  // (B, C)
                           std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t, bool accumulate, DType dt,
                           cudaStream_t stream);

}  // namespace zp::kernels::cuda
