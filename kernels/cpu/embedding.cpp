#include "kernels/cpu/embedding.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

namespace zp::kernels::cpu {

namespace {

// Sorted rows per piece of the gradient's sums; kernels/cuda/embedding.cu's kChunk (the two
// must agree for the CUDA gradient to equal this one bit for bit).
constexpr std::int64_t kChunk = 32;

}  // namespace

void embedding_forward(float* y, const std::int64_t* ids, const float* w, std::int64_t N, std::int64_t C) {
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int64_t row = ids != nullptr ? ids[i] : i;
    std::copy(w + row * C, w + (row + 1) * C, y + i * C);
  }
}

// With ids, the order of the CUDA twin: the positions sorted stably by id (equal ids in
// increasing position), the sorted array cut at every multiple of kChunk; each id's rows
// fall into pieces at those cuts, each piece summed in sorted order from 0.0f, and the
// pieces' sums added to dW[id] in order.
void embedding_backward(float* dw, const std::int64_t* ids, const float* dy, std::int64_t N, std::int64_t V,
                        std::int64_t C, std::int64_t padding_idx, bool accumulate) {
  if (!accumulate) std::fill(dw, dw + V * C, 0.0f);
  if (ids == nullptr) {
    for (std::int64_t i = 0; i < N; ++i) {
      if (i == padding_idx) continue;
      float* dst = dw + i * C;
      const float* src = dy + i * C;
      for (std::int64_t c = 0; c < C; ++c) dst[c] += src[c];
    }
    return;
  }
  if (N <= 0 || C <= 0) return;
  std::vector<std::int64_t> order(static_cast<std::size_t>(N));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [ids](std::int64_t a, std::int64_t b) { return ids[a] < ids[b]; });
  std::vector<float> part(static_cast<std::size_t>(C));
  for (std::int64_t b = 0; b < N;) {
    const std::int64_t id = ids[order[static_cast<std::size_t>(b)]];
    std::int64_t e = b + 1;
    while (e < N && ids[order[static_cast<std::size_t>(e)]] == id) ++e;
    if (id != padding_idx) {
      float* dst = dw + id * C;
      for (std::int64_t p = b; p < e;) {
        const std::int64_t pe = std::min(e, (p / kChunk + 1) * kChunk);
        std::fill(part.begin(), part.end(), 0.0f);
        for (std::int64_t r = p; r < pe; ++r) {
          const float* src = dy + order[static_cast<std::size_t>(r)] * C;
          for (std::int64_t c = 0; c < C; ++c) part[static_cast<std::size_t>(c)] += src[c];
        }
        for (std::int64_t c = 0; c < C; ++c) dst[c] += part[static_cast<std::size_t>(c)];
        p = pe;
      }
    }
    b = e;
  }
}

}  // namespace zp::kernels::cpu
