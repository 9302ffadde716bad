#pragma once
// fp32 <-> bf16 / fp16 conversions, bit-exact with PyTorch's c10::BFloat16 and c10::Half:
// round to nearest, ties to even; fp16 overflow gives ±inf, fp16 subnormals are kept;
// a NaN stays a quiet NaN (fp32 -> bf16: 0x7FC0; fp32 -> fp16: 0x7E00 with the sign).
// 16-bit values are stored as their bit patterns (std::uint16_t).
#include <bit>
#include <cstdint>

namespace zp::kernels::cpu {

constexpr std::uint16_t kBf16Nan = 0x7FC0;
constexpr std::uint16_t kFp16Nan = 0x7E00;

constexpr float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

constexpr std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return kBf16Nan;
  const std::uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

constexpr float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (static_cast<std::uint32_t>(h) >> 10) & 0x1Fu;
  const std::uint32_t mant = static_cast<std::uint32_t>(h) & 0x3FFu;
  if (exp == 0x1Fu) {  // inf, or NaN (made quiet)
    const std::uint32_t quiet = mant != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7F800000u | quiet | (mant << 13));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

constexpr std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>(sign | kFp16Nan);
  if (ax >= 0x38800000u) {  // normal in fp16 (>= 2^-14), or overflow
    // >= 65520 (halfway between 65504 and 2^16) rounds to inf.
    if (ax >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
    // Rebias the exponent from 127 to 15; the low 13 mantissa bits round.
    const std::uint32_t r = ax - 0x38000000u;
    std::uint32_t h = r >> 13;
    const std::uint32_t rest = r & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry moves into the exponent
    return static_cast<std::uint16_t>(sign | h);
  }
  if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25 rounds to zero
  // fp16 subnormal: the value in units of 2^-24.
  const std::uint32_t e = ax >> 23;
  const std::uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // 14..24
  std::uint32_t h = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u) != 0)) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

// Array conversions, n elements each.
void float_to_bf16(std::uint16_t* y,  // (n)
                   const float* x,    // (n)
                   std::int64_t n);
void bf16_to_float(float* y,                // (n)
                   const std::uint16_t* x,  // (n)
                   std::int64_t n);
void float_to_fp16(std::uint16_t* y,  // (n)
                   const float* x,    // (n)
                   std::int64_t n);
void fp16_to_float(float* y,                // (n)
                   const std::uint16_t* x,  // (n)
                   std::int64_t n);

}  // namespace zp::kernels::cpu
