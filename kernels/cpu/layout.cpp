#include "kernels/cpu/layout.hpp"

#include <algorithm>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

// Zero the columns of each of `rows` rows of width W outside [lo, hi).
void zero_outside(float* x, std::int64_t rows, std::int64_t W, std::int64_t lo, std::int64_t hi) {
  for (std::int64_t i = 0; i < rows; ++i) {
    std::fill(x + i * W, x + i * W + lo, 0.0f);
    std::fill(x + i * W + hi, x + (i + 1) * W, 0.0f);
  }
}

}  // namespace

void split_heads_forward(float* y, const float* x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                         std::int64_t W, std::int64_t offset) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        const float* src = x + (b * T + t) * W + offset + h * D;
        std::copy(src, src + D, y + ((b * H + h) * T + t) * D);
      }
}

void split_heads_backward(float* dx, const float* dy, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                          std::int64_t W, std::int64_t offset, bool accumulate) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        float* dst = dx + (b * T + t) * W + offset + h * D;
        const float* src = dy + ((b * H + h) * T + t) * D;
        for (std::int64_t d = 0; d < D; ++d) store(dst + d, src[d], accumulate);
      }
}

void merge_heads_forward(float* y, const float* x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        const float* src = x + ((b * H + h) * T + t) * D;
        std::copy(src, src + D, y + (b * T + t) * H * D + h * D);
      }
}

void merge_heads_backward(float* dx, const float* dy, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                          bool accumulate) {
  // merge_heads is split_heads' inverse: its gradient is split_heads of dy.
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        float* dst = dx + ((b * H + h) * T + t) * D;
        const float* src = dy + (b * T + t) * H * D + h * D;
        for (std::int64_t d = 0; d < D; ++d) store(dst + d, src[d], accumulate);
      }
}

void repeat_kv_forward(float* y, const float* x, std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T,
                       std::int64_t D) {
  const std::int64_t plane = T * D;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t g = 0; g < KV; ++g) {
      const float* src = x + (b * KV + g) * plane;
      for (std::int64_t r = 0; r < rep; ++r) std::copy(src, src + plane, y + ((b * KV + g) * rep + r) * plane);
    }
}

void repeat_kv_backward(float* dx, const float* dy, std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T,
                        std::int64_t D, bool accumulate) {
  const std::int64_t plane = T * D;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t g = 0; g < KV; ++g) {
      float* dst = dx + (b * KV + g) * plane;
      const float* src = dy + (b * KV + g) * rep * plane;
      for (std::int64_t i = 0; i < plane; ++i) {
        float s = 0.0f;
        for (std::int64_t r = 0; r < rep; ++r) s += src[r * plane + i];
        store(dst + i, s, accumulate);
      }
    }
}

void select_token_forward(float* y, const float* x, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t) {
  for (std::int64_t b = 0; b < B; ++b) std::copy(x + (b * T + t) * C, x + (b * T + t + 1) * C, y + b * C);
}

void select_token_backward(float* dx, const float* dy, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t,
                           bool accumulate) {
  if (!accumulate) zero_outside(dx, B, T * C, t * C, (t + 1) * C);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t c = 0; c < C; ++c) store(dx + (b * T + t) * C + c, dy[b * C + c], accumulate);
}

}  // namespace zp::kernels::cpu
