#include "kernels/cpu/rng.hpp"

#include "kernels/common/philox.hpp"

namespace zp::kernels::cpu {

namespace {

PhiloxBlock to_array(const philox::Block& b) { return {b.w[0], b.w[1], b.w[2], b.w[3]}; }

}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<std::uint32_t, 2> key) {
  return to_array(philox::philox4x32_10({{counter[0], counter[1], counter[2], counter[3]}}, key[0], key[1]));
}

std::uint32_t random_u32(std::uint64_t seed, std::uint64_t offset) { return philox::random_u32(seed, offset); }

float uniform(std::uint64_t seed, std::uint64_t offset) { return philox::uniform(seed, offset); }

void uniform_fill(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset) {
  std::int64_t i = 0;
  while (i < n) {
    const std::uint64_t pos = offset + static_cast<std::uint64_t>(i);
    const philox::Block b = philox::block_at(seed, pos >> 2, 0u);
    for (std::uint64_t w = pos & 3u; w < 4u && i < n; ++w, ++i) out[i] = philox::to_unit(b.w[w]);
  }
}

float normal(std::uint64_t seed, std::uint64_t offset) { return philox::normal(seed, offset); }

void normal_fill(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, float mean, float stddev) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = mean + stddev * normal(seed, offset + static_cast<std::uint64_t>(i));
}

}  // namespace zp::kernels::cpu
