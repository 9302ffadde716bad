#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011; the generator itself is
// kernels/common/philox.hpp, which the CUDA kernels share): a value depends only on
// (seed, offset), never on call order, so any element can be regenerated independently.
// Element `offset` of a stream is word (offset % 4) of the Philox block whose counter is
// (offset / 4, 0); the normal stream uses counter (offset, 1) so it never overlaps the
// uniform stream.
#include <array>
#include <cstdint>

namespace zp::kernels::cpu {

using PhiloxBlock = std::array<std::uint32_t, 4>;

// One Philox4x32-10 block (the Random123 reference function).
PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<std::uint32_t, 2> key);

// The raw 32-bit value at (seed, offset).
std::uint32_t random_u32(std::uint64_t seed, std::uint64_t offset);

// Uniform in [0, 1) with 24 random bits: (u >> 8) * 2^-24.
float uniform(std::uint64_t seed, std::uint64_t offset);

// out[i] = uniform(seed, offset + i).
void uniform_fill(float* out,  // (n)
                  std::int64_t n, std::uint64_t seed, std::uint64_t offset);

// Standard normal at (seed, offset) (Box-Muller in double on two 32-bit words).
float normal(std::uint64_t seed, std::uint64_t offset);

// out[i] = mean + std * normal(seed, offset + i), e.g. for nn.init.normal_ style weights.
void normal_fill(float* out,  // (n)
                 std::int64_t n, std::uint64_t seed, std::uint64_t offset, float mean, float stddev);

}  // namespace zp::kernels::cpu
