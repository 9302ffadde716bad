#pragma once
// nn.Embedding (kernels/cpu/embedding.hpp's twins): a row gather and its scatter-add
// gradient. The gradient is deterministic and has the CPU twin's summation order: the
// positions are sorted stably by id (CUB radix sort, in the Context's scratch), the sorted
// array is cut at every multiple of 32 rows, each id's rows in one piece between cuts are
// summed in sorted order (fp32, from 0), and dW[id] gets the pieces' sums added in order.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.cuh"

namespace zp::kernels::cuda {

// y[i] = W[ids[i]]; ids == nullptr means ids[i] = i (position ids arange(N)).
void embedding_forward(void* y,                  // (N, C)
                       const std::int64_t* ids,  // (N) on the device, or nullptr
                       const void* w,            // (V, C)
                       std::int64_t N, std::int64_t C, DType dt, cudaStream_t stream);

// dW[ids[i]] += dy[i], in the order above (fp32 sums, rounded once; the CPU twin sums the
// same pieces in the same order, so fp32 results are equal bit for bit). Rows with
// ids[i] == padding_idx contribute nothing; pass -1 for none. accumulate=false first zeroes
// the whole table gradient (V rows). Ids must lie in [0, V). The scratch holds the sort's
// arrays and 2 * ceil(N / 32) fp32 partial sums per column, for as many columns at a time as
// it has room for (the same bits; a CudaError when it cannot hold 16 columns).
void embedding_backward(Context& ctx,
                        void* dw,                 // (V, C)
                        const std::int64_t* ids,  // (N) on the device, or nullptr
                        const void* dy,           // (N, C)
                        std::int64_t N, std::int64_t V, std::int64_t C, std::int64_t padding_idx, bool accumulate,
                        DType dt, cudaStream_t stream);

}  // namespace zp::kernels::cuda
