#pragma once
// The head dimensions kernels/cuda/sdpa.cu's fused attention is instantiated for, shared with
// the CPU-side rules that predict what the CUDA device runs (exec/cuda_scratch.cpp).
#include <cstdint>

namespace zp::kernels {

constexpr bool sdpa_head_dim_supported(std::int64_t D) { return D == 16 || D == 32 || D == 64 || D == 128; }

}  // namespace zp::kernels
