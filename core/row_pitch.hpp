#pragma once
#include <cstdint>

namespace zp {

// The fewest elements of `elem` bytes, at least n, that make whole 16-byte groups: the row
// stride from which tensor-core kernels load whole vectors (models::Tensor::row_pitch,
// kernels/common/gemm_pieces.hpp).
constexpr std::int64_t padded_row_elements(std::int64_t n, std::int64_t elem) { return (n * elem + 15) / 16 * 16 / elem; }

}  // namespace zp
