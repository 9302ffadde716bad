#pragma once
// Eager-attention pieces: softmax over the last dimension, masks, rotary embeddings.
//
// Masked entries hold kMaskValue = torch.finfo(float32).min (the lowest finite float), as
// HF does: exp(kMaskValue - rowmax) is exactly 0 whenever the row has a real entry, and a
// row masked everywhere gives a uniform softmax, as in HF. -inf works as well: softmax maps
// it to exactly 0, and a row that is entirely -inf gives zeros here (PyTorch gives NaN).
#include <cstdint>
#include <limits>

namespace zp::kernels::cpu {

constexpr float kMaskValue = std::numeric_limits<float>::lowest();

// y = softmax(x) over rows of length n (max-subtracted, sum in double).
// A row that is -inf everywhere gives zeros.
void softmax_forward(float* y,        // (rows, n)
                     const float* x,  // (rows, n)
                     std::int64_t rows, std::int64_t n);
// dx = y * (dy - sum(dy * y)), from the saved output y.
void softmax_backward(float* dx,        // (rows, n)
                      const float* y,   // (rows, n)
                      const float* dy,  // (rows, n)
                      std::int64_t rows, std::int64_t n, bool accumulate);

// The same as PyTorch's CUDA softmax_backward computes it, through a temporary of dy's size:
// tmp = dy * y, then dx = tmp - y * sum(tmp).
void softmax_backward(float* dx,        // (rows, n)
                      const float* y,   // (rows, n)
                      const float* dy,  // (rows, n)
                      float* tmp,       // (rows, n)
                      std::int64_t rows, std::int64_t n, bool accumulate);

// m[i, j] = 0 for j <= i, `masked` for j > i; add it as (1, 1, T, T) over (B, H, T, T).
void causal_mask(float* m,  // (T, T)
                 std::int64_t T, float masked = kMaskValue);

// GPT-2's torch.where(causal, x, masked): y[.., i, j] = x[.., i, j] for j <= i, else
// `masked`; backward passes dy where j <= i and 0 above the diagonal.
void causal_where_forward(float* y,        // (BH, T, T)
                          const float* x,  // (BH, T, T)
                          std::int64_t BH, std::int64_t T, float masked = kMaskValue);
void causal_where_backward(float* dx,        // (BH, T, T)
                           const float* dy,  // (BH, T, T)
                           std::int64_t BH, std::int64_t T, bool accumulate);

// BERT's extended attention mask (1 - attention_mask) * finfo.min: m[b, t] = 0 where
// attention_mask is nonzero, `masked` where it is 0; add it as (B, 1, 1, T) over (B, H, T, T).
void padding_mask(float* m,                            // (B, T)
                  const std::int64_t* attention_mask,  // (B, T)
                  std::int64_t B, std::int64_t T, float masked = kMaskValue);

// HF Llama's default rotary tables for positions 0..T-1, in fp32 as transformers computes
// them: inv_freq[i] = 1 / theta^(2i/D) (i < D/2), freqs = t * inv_freq,
// emb = cat(freqs, freqs), cos = cos(emb), sin = sin(emb). D must be even.
void rope_tables(float* cos,  // (T, D)
                 float* sin,  // (T, D)
                 std::int64_t T, std::int64_t D, float theta);

// y = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]).
void rope_forward(float* y,          // (B, H, T, D)
                  const float* x,    // (B, H, T, D)
                  const float* cos,  // (T, D)
                  const float* sin,  // (T, D)
                  std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D);
// dx = dy * cos + rotate_half^T(dy * sin).
void rope_backward(float* dx,         // (B, H, T, D)
                   const float* dy,   // (B, H, T, D)
                   const float* cos,  // (T, D)
                   const float* sin,  // (T, D)
                   std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool accumulate);

}  // namespace zp::kernels::cpu
