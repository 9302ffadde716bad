#include "exec/numeric.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/convert.hpp"

namespace zp::exec {

namespace cpu = zp::kernels::cpu;

float load(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::fp32: return static_cast<const float*>(p)[i];
    case DType::bf16: return cpu::bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::fp16: return cpu::fp16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    default: throw std::logic_error("load: not a floating-point buffer");
  }
}

void store(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::fp32: static_cast<float*>(p)[i] = v; return;
    case DType::bf16: static_cast<std::uint16_t*>(p)[i] = cpu::float_to_bf16(v); return;
    case DType::fp16: static_cast<std::uint16_t*>(p)[i] = cpu::float_to_fp16(v); return;
    default: throw std::logic_error("store: not a floating-point buffer");
  }
}

void reduce_blocks(DType t, zero::ReduceOp op, const std::byte* blocks, std::int64_t n, std::int64_t count, void* out) {
  const auto stride = count * static_cast<std::int64_t>(dtype_size(t));
  const float inv = 1.0f / static_cast<float>(n);
  for (std::int64_t i = 0; i < count; ++i) {
    float acc = load(blocks, t, i);
    for (std::int64_t j = 1; j < n; ++j) {
      const float v = load(blocks + j * stride, t, i);
      acc = op == zero::ReduceOp::max ? std::max(acc, v) : acc + v;
    }
    if (op == zero::ReduceOp::avg) acc *= inv;
    store(out, t, i, acc);
  }
}

}  // namespace zp::exec
