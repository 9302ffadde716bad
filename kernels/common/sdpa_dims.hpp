#pragma once
// The head dimensions kernels/cuda/sdpa.cu's fused attention is instantiated for, shared with
// the CPU-side rules that predict what the CUDA device runs (exec/cuda_scratch.cpp).
#include <cstdint>

#include "kernels/common/align.hpp"

namespace zp::kernels {

constexpr bool sdpa_head_dim_supported(std::int64_t D) { return D == 16 || D == 32 || D == 64 || D == 128; }

// Whether cuDNN's flash attention (kernels/cuda/sdpa_cudnn.cpp, train --attention-kernel cudnn)
// takes an attention: 16-bit storage, a head dim that is a multiple of 8 up to 128, more than
// one position (cuDNN 9.19 refuses s_q = s_kv = 1). Elsewhere the own kernels run.
constexpr bool sdpa_cudnn_takes(std::int64_t T, std::int64_t D, bool sixteen_bit) {
  return sixteen_bit && D > 0 && D <= 128 && D % 8 == 0 && T > 1;
}

// The workspace cuDNN's attention asks for (cudnn-frontend's get_workspace_size), as cuDNN 9.19
// does on an H100, rounded up to the 256 bytes the launcher aligns to: the backward an fp32 dQ
// accumulator (B·H·T·D), an fp32 sum per row (B·H·T) and 256 bytes more, and with fewer key/value
// heads than query heads (Hk < H, GQA) 4·B·H·T·D bytes more (the key's and value's gradients
// over all H query heads, 16-bit each, before cuDNN sums them over each group); the forward 256
// bytes. Measured at six shapes with Hk = H, T = 64 to 2048 and T = 130, and two with Hk < H
// (tiny Llama's 2 of 4 heads, Llama 3's 8 of 32 at T = 2048), causal or not, with dropout or not
// (tests/gpu/test_kernels_cuda.cpp checks both against the cuDNN at hand).
constexpr std::int64_t kSdpaCudnnForwardWorkspace = 256;
constexpr std::int64_t sdpa_cudnn_backward_workspace(std::int64_t B, std::int64_t H, std::int64_t Hk, std::int64_t T,
                                                     std::int64_t D) {
  return carve_aligned(4 * B * H * T * D + (Hk < H ? 4 * B * H * T * D : 0) + 4 * B * H * T + 256);
}

}  // namespace zp::kernels
