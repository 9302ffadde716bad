#pragma once
// Element access across the dtypes buffers are stored in (fp32, bf16, fp16), and the
// group-order reduction every communication backend uses.
#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"
#include "zero/program.hpp"

namespace zp::exec {

float load(const void* p, DType t, std::int64_t i);
void store(void* p, DType t, std::int64_t i, float v);

// out[i] = op over j = 0..n-1 (in order) of block j's element i, computed in fp32;
// blocks are n consecutive arrays of `count` elements of dtype t. avg: sum · (1/n).
void reduce_blocks(DType t, zero::ReduceOp op, const std::byte* blocks, std::int64_t n, std::int64_t count, void* out);

}  // namespace zp::exec
