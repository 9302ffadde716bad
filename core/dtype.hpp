#pragma once
#include <cstdint>
#include <string_view>

namespace zp {

enum class DType : std::uint8_t { fp32, fp16, bf16, u8, b1, i64 };

constexpr std::int64_t dtype_size(DType t) {
  switch (t) {
    case DType::fp32: return 4;
    case DType::fp16: return 2;
    case DType::bf16: return 2;
    case DType::u8: return 1;
    case DType::b1: return 1;  // torch.bool: one byte per element
    case DType::i64: return 8;
  }
  return 0;
}

// A floating-point element type: what is differentiable and what the devices compute on.
constexpr bool is_float(DType t) { return t == DType::fp32 || t == DType::fp16 || t == DType::bf16; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::u8: return "u8";
    case DType::b1: return "bool";
    case DType::i64: return "i64";
  }
  return "?";
}

}  // namespace zp
