#pragma once
// Internal helpers shared by the kernel sources (not part of the public API).
#include <cstdint>

namespace zp::kernels::cpu::detail {

// dst = v, or dst += v when accumulating into a gradient buffer.
inline void store(float* dst, float v, bool accumulate) {
  if (accumulate)
    *dst += v;
  else
    *dst = v;
}

// dst[i] = v[i] or dst[i] += v[i] for a buffer of per-element values summed in double.
inline void store_all(float* dst, const double* v, std::int64_t n, bool accumulate) {
  for (std::int64_t i = 0; i < n; ++i) store(dst + i, static_cast<float>(v[i]), accumulate);
}

}  // namespace zp::kernels::cpu::detail
