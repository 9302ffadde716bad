#include "kernels/cpu/convert.hpp"

namespace zp::kernels::cpu {

void float_to_bf16(std::uint16_t* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

void bf16_to_float(float* y, const std::uint16_t* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

void float_to_fp16(std::uint16_t* y, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = float_to_fp16(x[i]);
}

void fp16_to_float(float* y, const std::uint16_t* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp16_to_float(x[i]);
}

}  // namespace zp::kernels::cpu
