#pragma once
// The counter-based generator both backends draw from (Philox4x32-10, Salmon et al. 2011):
// a value depends only on (seed, offset), never on call order, so a CPU run and a GPU run
// draw the same dropout masks, and any element can be regenerated on its own.
//
// Element `offset` of the uniform stream is word (offset % 4) of the Philox block whose
// counter is (offset / 4 as two words, 0, 0) and whose key is the seed's two words; the
// normal stream (kernels/cpu/rng.hpp) uses counter (offset, 1, 0) so it never overlaps it.
// The executor's dropout offset of element i of op `id` is (id << 32) + i, and its seed
// mixes the run's seed with the step, the micro-step and the rank: a mask is a function of
// (seed, micro-step, op, element) alone.
#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace zp::kernels::philox {

struct Block {
  std::uint32_t w[4];
};

namespace detail {
constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
}  // namespace detail

// One Philox4x32-10 block (the Random123 reference function).
ZP_HOST_DEVICE Block philox4x32_10(Block c, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += detail::kWeyl0;
      k1 += detail::kWeyl1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(detail::kMul0) * c.w[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(detail::kMul1) * c.w[2];
    const Block n = {{static_cast<std::uint32_t>(p1 >> 32) ^ c.w[1] ^ k0, static_cast<std::uint32_t>(p1),
                      static_cast<std::uint32_t>(p0 >> 32) ^ c.w[3] ^ k1, static_cast<std::uint32_t>(p0)}};
    c = n;
  }
  return c;
}

// The block holding offsets 4·index .. 4·index + 3 of stream `stream` (0: uniform, 1: normal).
ZP_HOST_DEVICE Block block_at(std::uint64_t seed, std::uint64_t index, std::uint32_t stream) {
  const Block c = {{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream, 0u}};
  return philox4x32_10(c, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// Word i (0..3) of a block, selected without indexing the array at run time (on the GPU a
// run-time index would move the block to local memory).
ZP_HOST_DEVICE std::uint32_t word(const Block& b, std::uint32_t i) {
  return i == 0 ? b.w[0] : i == 1 ? b.w[1] : i == 2 ? b.w[2] : b.w[3];
}

// The raw 32-bit value at (seed, offset).
ZP_HOST_DEVICE std::uint32_t random_u32(std::uint64_t seed, std::uint64_t offset) {
  return word(block_at(seed, offset >> 2, 0u), static_cast<std::uint32_t>(offset & 3u));
}

// A 32-bit word to a uniform in [0, 1) with 24 random bits: (u >> 8) · 2^-24 (exact in fp32).
ZP_HOST_DEVICE float to_unit(std::uint32_t u) { return static_cast<float>(u >> 8) * 0x1p-24f; }

// Uniform in [0, 1) at (seed, offset).
ZP_HOST_DEVICE float uniform(std::uint64_t seed, std::uint64_t offset) { return to_unit(random_u32(seed, offset)); }

// Dropout: element at `offset` is kept when uniform(seed, offset) < 1 - p.
ZP_HOST_DEVICE bool keep(std::uint64_t seed, std::uint64_t offset, float p) { return uniform(seed, offset) < 1.0f - p; }

// Attention's dropout (the sdpa kernels of both backends): a 16-bit uniform per probability
// (bh, i, j) (query i, key j of head bh, a T x T matrix), drawn in patches laid out for the
// mma.sync accumulator layout, where a thread holds queries {x, x+8} and keys {y, y+1, y+8,
// y+9} of a 16 x 16 tile (or, in the key-major backward, the same with the roles swapped):
// every coordinate x has a group (x / 16) * 4 + (x % 8) / 2, shared by x, x+1, x+8, x+9 (x
// even), and a place 2 * ((x / 8) % 2) + x % 2 in [0, 4). A patch (query group, key group)
// holds 16 probabilities in two Philox blocks: the queries of even place in the first, odd in
// the second; in a block, word 2 * (query place / 2) + key place / 2, half key place % 2 (the
// low half first). So a thread draws one block per 8 probabilities, where one per element
// (or pair) was drawn before. Block numbers start at offset / 4 (offsets are multiples of 4).
namespace attention_dropout {

ZP_HOST_DEVICE std::int64_t group(std::int64_t x) { return (x >> 4) * 4 + ((x & 7) >> 1); }
ZP_HOST_DEVICE std::uint32_t place(std::int64_t x) { return static_cast<std::uint32_t>(((x >> 3) & 1) * 2 + (x & 1)); }
ZP_HOST_DEVICE std::int64_t groups(std::int64_t T) { return (T + 15) / 16 * 4; }

// The block of patch (query group gi, key group gj) of head bh holding the queries whose
// place has parity `parity`.
ZP_HOST_DEVICE Block block(std::uint64_t seed, std::uint64_t offset, std::int64_t bh, std::int64_t T, std::int64_t gi,
                           std::int64_t gj, std::uint32_t parity) {
  const std::int64_t G = groups(T);
  const auto patch = static_cast<std::uint64_t>((bh * G + gi) * G + gj);
  return block_at(seed, (offset >> 2) + 2 * patch + parity, 0u);
}

// The 16-bit draw of (query place qp, key place kp) from its block (the one of parity qp % 2).
ZP_HOST_DEVICE std::uint32_t draw(const Block& b, std::uint32_t qp, std::uint32_t kp) {
  const std::uint32_t w = word(b, 2 * (qp >> 1) + (kp >> 1));
  return (kp & 1u) != 0 ? w >> 16 : w & 0xFFFFu;
}

// A 16-bit draw as a uniform in [0, 1) (exact in fp32).
ZP_HOST_DEVICE float unit(std::uint32_t u16) { return static_cast<float>(u16) * 0x1p-16f; }

// The uniform of probability (bh, i, j): kept when it is below 1 - p.
ZP_HOST_DEVICE float uniform(std::uint64_t seed, std::uint64_t offset, std::int64_t bh, std::int64_t T, std::int64_t i,
                             std::int64_t j) {
  const Block b = block(seed, offset, bh, T, group(i), group(j), place(i) & 1u);
  return unit(draw(b, place(i), place(j)));
}

}  // namespace attention_dropout

// Standard normal at (seed, offset): Box-Muller in double on words 0 and 1 of block
// (offset, stream 1).
ZP_HOST_DEVICE float normal(std::uint64_t seed, std::uint64_t offset) {
  const Block b = block_at(seed, offset, 1u);
  const double u1 = (static_cast<double>(b.w[0]) + 0.5) * 0x1p-32;  // in (0, 1): log is finite
  const double u2 = static_cast<double>(b.w[1]) * 0x1p-32;
  constexpr double kTwoPi = 6.283185307179586476925286766559;  // 2·pi, as 2.0 * std::numbers::pi
  return static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(kTwoPi * u2));
}

}  // namespace zp::kernels::philox
