#include "kernels/cpu/rng.hpp"

#include <cmath>
#include <numbers>

namespace zp::kernels::cpu {

namespace {

constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;

void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b);
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

PhiloxBlock philox_round(const PhiloxBlock& c, const std::array<std::uint32_t, 2>& k) {
  std::uint32_t hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
  mulhilo(kMul0, c[0], hi0, lo0);
  mulhilo(kMul1, c[2], hi1, lo1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

std::array<std::uint32_t, 2> key_of(std::uint64_t seed) {
  return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
}

PhiloxBlock block_at(std::uint64_t seed, std::uint64_t index, std::uint32_t stream) {
  return philox4x32_10({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream, 0u},
                       key_of(seed));
}

float to_unit(std::uint32_t u) { return static_cast<float>(u >> 8) * 0x1p-24f; }

}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<std::uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    counter = philox_round(counter, key);
  }
  return counter;
}

std::uint32_t random_u32(std::uint64_t seed, std::uint64_t offset) {
  return block_at(seed, offset >> 2, 0u)[offset & 3u];
}

float uniform(std::uint64_t seed, std::uint64_t offset) { return to_unit(random_u32(seed, offset)); }

void uniform_fill(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset) {
  std::int64_t i = 0;
  while (i < n) {
    const std::uint64_t pos = offset + static_cast<std::uint64_t>(i);
    const PhiloxBlock b = block_at(seed, pos >> 2, 0u);
    for (std::uint64_t w = pos & 3u; w < 4u && i < n; ++w, ++i) out[i] = to_unit(b[w]);
  }
}

float normal(std::uint64_t seed, std::uint64_t offset) {
  const PhiloxBlock b = block_at(seed, offset, 1u);
  const double u1 = (static_cast<double>(b[0]) + 0.5) * 0x1p-32;  // in (0, 1): log is finite
  const double u2 = static_cast<double>(b[1]) * 0x1p-32;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

void normal_fill(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, float mean, float stddev) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = mean + stddev * normal(seed, offset + static_cast<std::uint64_t>(i));
}

}  // namespace zp::kernels::cpu
