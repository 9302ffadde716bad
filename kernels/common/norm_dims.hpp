#pragma once
// Which rows kernels/cuda/norm.cu's warp kernels take (one warp a row, the row in registers),
// shared with the CPU-side rules that predict what the CUDA device runs (exec/cuda_scratch.cpp).
#include <cstdint>
#include <initializer_list>

namespace zp::kernels {

// Elements of `elem_bytes` bytes in one 16-byte access.
constexpr std::int64_t row_pack(std::int64_t elem_bytes) { return 16 / elem_bytes; }

// Whether the backward warp kernels (at most 4 packs a lane) take rows of C elements of
// `elem_bytes` bytes: whole packs, at most 128 packs.
constexpr bool layernorm_backward_warp_takes(std::int64_t C, std::int64_t elem_bytes) {
  const std::int64_t pack = row_pack(elem_bytes);
  return C > 0 && C % pack == 0 && (C / pack + 31) / 32 <= 4;
}

// Whether the fused residual LayerNorm's backward (models::Fn::dropout_add_layernorm) runs in
// the warp kernels: rows they take, every row operand (dy, the sum, the weight, the gradients;
// nullptr: not read) 16-byte aligned, and the byte mask aligned to a lane's pack of it (one
// 8-byte word in 16 bits, 4 bytes in fp32). Elsewhere it needs its temporary of rows · C
// elements. Both the kernel and the prediction of its temporaries ask this, of the same pointers.
inline bool dropout_add_layernorm_backward_warp_takes(std::int64_t C, std::int64_t elem_bytes,
                                                      std::initializer_list<const void*> rows, const void* mask) {
  if (!layernorm_backward_warp_takes(C, elem_bytes)) return false;
  for (const void* p : rows)
    if ((reinterpret_cast<std::uintptr_t>(p) & 15u) != 0) return false;
  return (reinterpret_cast<std::uintptr_t>(mask) % static_cast<std::uintptr_t>(row_pack(elem_bytes))) == 0;
}

}  // namespace zp::kernels
