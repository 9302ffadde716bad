#pragma once
// nn.Embedding (kernels/cpu/embedding.hpp's twins): a row gather and its scatter-add
// gradient. The gradient is deterministic and equals the CPU's summation order: the ids are
// sorted stably (CUB radix sort, in the Context's scratch), and each distinct id's rows
// are added in increasing position order by one thread per column.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// y[i] = W[ids[i]]; ids == nullptr means ids[i] = i (position ids arange(N)).
void embedding_forward(void* y,                  // (N, C)
                       const std::int64_t* ids,  // (N) on the device, or nullptr
                       const void* w,            // (V, C)
                       std::int64_t N, std::int64_t C, DType dt, cudaStream_t stream);

// dW[ids[i]] += dy[i] for i = 0..N-1 in order (fp32 sums, rounded once). Rows with
// ids[i] == padding_idx contribute nothing; pass -1 for none. accumulate=false first zeroes
// the whole table gradient (V rows). Ids must lie in [0, V).
void embedding_backward(Context& ctx,
                        void* dw,                 // (V, C)
                        const std::int64_t* ids,  // (N) on the device, or nullptr
                        const void* dy,           // (N, C)
                        std::int64_t N, std::int64_t V, std::int64_t C, std::int64_t padding_idx, bool accumulate,
                        DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
