#include "kernels/cpu/embedding.hpp"

#include <algorithm>

namespace zp::kernels::cpu {

void embedding_forward(float* y, const std::int64_t* ids, const float* w, std::int64_t N, std::int64_t C) {
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int64_t row = ids != nullptr ? ids[i] : i;
    std::copy(w + row * C, w + (row + 1) * C, y + i * C);
  }
}

void embedding_backward(float* dw, const std::int64_t* ids, const float* dy, std::int64_t N, std::int64_t V,
                        std::int64_t C, std::int64_t padding_idx, bool accumulate) {
  if (!accumulate) std::fill(dw, dw + V * C, 0.0f);
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int64_t row = ids != nullptr ? ids[i] : i;
    if (row == padding_idx) continue;
    float* dst = dw + row * C;
    const float* src = dy + i * C;
    for (std::int64_t c = 0; c < C; ++c) dst[c] += src[c];
  }
}

}  // namespace zp::kernels::cpu
