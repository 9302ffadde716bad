#include "kernels/cpu/dropout.hpp"

#include <algorithm>
#include <vector>

#include "kernels/cpu/detail.hpp"
#include "kernels/cpu/rng.hpp"

namespace zp::kernels::cpu {

namespace {

float keep_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

}  // namespace

void dropout_forward(float* y, std::uint8_t* mask, const float* x, std::int64_t n, float p, std::uint64_t seed,
                     std::uint64_t offset) {
  if (p <= 0.0f) {
    std::copy(x, x + n, y);
    std::fill(mask, mask + n, std::uint8_t{1});
    return;
  }
  const float keep = 1.0f - p;
  const float scale = keep_scale(p);
  constexpr std::int64_t kChunk = 4096;
  std::vector<float> u(static_cast<std::size_t>(std::min(n, kChunk)));
  for (std::int64_t start = 0; start < n; start += kChunk) {
    const std::int64_t len = std::min(kChunk, n - start);
    uniform_fill(u.data(), len, seed, offset + static_cast<std::uint64_t>(start));
    for (std::int64_t i = 0; i < len; ++i) {
      const bool kept = u[static_cast<std::size_t>(i)] < keep;
      mask[start + i] = kept ? 1 : 0;
      y[start + i] = kept ? x[start + i] * scale : 0.0f;
    }
  }
}

void dropout_backward(float* dx, const std::uint8_t* mask, const float* dy, std::int64_t n, float p, bool accumulate) {
  const float scale = p <= 0.0f ? 1.0f : keep_scale(p);
  for (std::int64_t i = 0; i < n; ++i) detail::store(dx + i, mask[i] != 0 ? dy[i] * scale : 0.0f, accumulate);
}

}  // namespace zp::kernels::cpu
