#pragma once
// nn.Embedding: a row gather and its scatter-add gradient.
#include <cstdint>

namespace zp::kernels::cpu {

// y[i] = W[ids[i]]; ids == nullptr means ids[i] = i (position ids arange(N)).
void embedding_forward(float* y,                 // (N, C)
                       const std::int64_t* ids,  // (N), or nullptr
                       const float* w,           // (V, C)
                       std::int64_t N, std::int64_t C);

// dW[ids[i]] += dy[i] (deterministic): the positions sorted stably by id, the sorted array cut
// at every multiple of 32 rows, each id's rows between two cuts summed in sorted order from 0,
// and those sums added to dW[id] in order (kernels/cuda's twin sums the same pieces in the
// same order; without ids, row i gets dy[i]). Rows with ids[i] == padding_idx
// contribute nothing (nn.Embedding(padding_idx=...)); pass -1 for none. accumulate=false
// first zeroes the whole table gradient (V rows).
void embedding_backward(float* dw,                // (V, C)
                        const std::int64_t* ids,  // (N), or nullptr
                        const float* dy,          // (N, C)
                        std::int64_t N, std::int64_t V, std::int64_t C, std::int64_t padding_idx, bool accumulate);

}  // namespace zp::kernels::cpu
