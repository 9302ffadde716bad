#pragma once
// Element access across the dtypes buffers are stored in (fp32, bf16, fp16), and the
// group-order reduction every communication backend uses.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.hpp"
#include "zero/program.hpp"

namespace zp::exec {

// Elements of a tensor of this shape (the product of its dimensions; 1 for a scalar).
inline std::int64_t shape_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

float load(const void* p, DType t, std::int64_t i);
void store(void* p, DType t, std::int64_t i, float v);

// out[i] = op over j = 0..n-1 (in order) of block j's element i, computed in fp32;
// blocks are n consecutive arrays of `count` elements of dtype t. avg: sum · (1/n).
void reduce_blocks(DType t, zero::ReduceOp op, const std::byte* blocks, std::int64_t n, std::int64_t count, void* out);

}  // namespace zp::exec
