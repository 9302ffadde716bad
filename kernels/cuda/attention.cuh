#pragma once
// Eager-attention pieces (kernels/cpu/attention.hpp's twins): softmax over the last
// dimension, masks, rotary embeddings. Masked entries hold mask_value(dt), the storage
// dtype's lowest finite value (torch.finfo(dtype).min, as HF builds its masks); softmax maps
// a row that is -inf everywhere to zeros.
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda {

// torch.finfo(dt).min: -3.4028235e38 (fp32), -3.3895314e38 (bf16), -65504 (fp16).
float mask_value(DType dt);

// y = softmax(x) over rows of length n (max-subtracted, fp32 sums).
void softmax_forward(void* y,        // (rows, n)
                     const void* x,  // (rows, n)
                     std::int64_t rows, std::int64_t n, DType dt, cudaStream_t stream);
// dx = y * (dy - sum(dy * y)), from the saved output y.
void softmax_backward(void* dx,        // (rows, n)
                      const void* y,   // (rows, n)
                      const void* dy,  // (rows, n)
                      std::int64_t rows, std::int64_t n, bool accumulate, DType dt, cudaStream_t stream);

// m[i, j] = 0 for j <= i, `masked` for j > i.
void causal_mask(void* m,  // (T, T)
                 std::int64_t T, float masked, DType dt, cudaStream_t stream);

// GPT-2's torch.where(causal, x, masked); backward passes dy where j <= i, 0 above the diagonal.
void causal_where_forward(void* y,        // (BH, T, T)
                          const void* x,  // (BH, T, T)
                          std::int64_t BH, std::int64_t T, float masked, DType dt, cudaStream_t stream);
void causal_where_backward(void* dx,        // (BH, T, T)
                           const void* dy,  // (BH, T, T)
                           std::int64_t BH, std::int64_t T, bool accumulate, DType dt, cudaStream_t stream);

// BERT's extended attention mask: m[b, t] = 0 where attention_mask is nonzero, `masked` where 0.
void padding_mask(void* m,                             // (B, T)
                  const std::int64_t* attention_mask,  // (B, T) on the device
                  std::int64_t B, std::int64_t T, float masked, DType dt, cudaStream_t stream);

// HF Llama's rotary tables for positions 0..T-1, computed in fp32 (inv_freq[i] =
// 1 / theta^(2i/D), emb = cat(freqs, freqs)) and stored in dt. D must be even.
void rope_tables(void* cos,  // (T, D)
                 void* sin,  // (T, D)
                 std::int64_t T, std::int64_t D, float theta, DType dt, cudaStream_t stream);

// y = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]).
void rope_forward(void* y,          // (B, H, T, D)
                  const void* x,    // (B, H, T, D)
                  const void* cos,  // (T, D)
                  const void* sin,  // (T, D)
                  std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, DType dt, cudaStream_t stream);
// dx = dy * cos + rotate_half^T(dy * sin).
void rope_backward(void* dx,         // (B, H, T, D)
                   const void* dy,   // (B, H, T, D)
                   const void* cos,  // (T, D)
                   const void* sin,  // (T, D)
                   std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool accumulate, DType dt,
                   cudaStream_t stream);

}  // namespace zp::kernels::cuda
