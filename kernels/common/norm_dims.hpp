#pragma once
// Which rows kernels/cuda/norm.cu's warp kernels take (one warp a row, the row in registers),
// shared with the CPU-side rules that predict what the CUDA device runs (exec/cuda_scratch.cpp).
#include <cstdint>

namespace zp::kernels {

// Elements of `elem_bytes` bytes in one 16-byte access.
constexpr std::int64_t row_pack(std::int64_t elem_bytes) { return 16 / elem_bytes; }

// Whether the backward warp kernels (at most 4 packs a lane) take rows of C elements of
// `elem_bytes` bytes: whole packs, at most 128 packs.
constexpr bool layernorm_backward_warp_takes(std::int64_t C, std::int64_t elem_bytes) {
  const std::int64_t pack = row_pack(elem_bytes);
  return C > 0 && C % pack == 0 && (C / pack + 31) / 32 <= 4;
}

// Whether the fused residual LayerNorm's backward (models::Fn::dropout_add_layernorm) needs
// its temporary of rows · C elements: rows the warp kernels do not take, or whose byte mask a
// lane cannot read as one 8-byte word (C not a multiple of 8).
constexpr bool dropout_add_layernorm_backward_needs_scratch(std::int64_t C, std::int64_t elem_bytes) {
  return !(layernorm_backward_warp_takes(C, elem_bytes) && C % 8 == 0);
}

}  // namespace zp::kernels
