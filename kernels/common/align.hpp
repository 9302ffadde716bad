#pragma once
// Byte counts rounded up to the 256 bytes the CUDA launchers carve their scratch, buffers and
// workspaces in (kernels/cuda: the embedding's sort, cuDNN's attention), shared with the CPU-side
// rules that predict those sizes (kernels/common/sdpa_dims.hpp, exec/cuda_memory.cpp).
#include <cstdint>

namespace zp::kernels {

inline constexpr std::int64_t kCarveAlign = 256;

constexpr std::int64_t carve_aligned(std::int64_t bytes) { return (bytes + kCarveAlign - 1) / kCarveAlign * kCarveAlign; }

}  // namespace zp::kernels
