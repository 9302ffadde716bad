#pragma once
// Internal: deterministic column sums out[k][c] (=, or += when accumulating) of
// f(r, c)[k] over the rows r < M (bias, LayerNorm and weight gradients). Rows are cut into
// R chunks (R depends only on M, N and the scratch size); a first kernel sums each chunk's
// rows (each thread a strided subset, then a fixed tree over the block) into partials in
// the Context's scratch, a second sums the R partials of each column in chunk order. No
// atomics: the same inputs give the same bits.
#include <cstdint>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/detail.cuh"

namespace zp::kernels::cuda::detail {

constexpr int kColLanes = 32;         // columns read at once per row (one per lane: a warp's load is contiguous)
constexpr int kColPerLane = 2;        // columns per lane, kColLanes apart
constexpr int kColTile = kColLanes * kColPerLane;  // columns per block
constexpr int kColRowLanes = 8;       // rows read at once per block
constexpr int kColUnroll = 4;         // rows each thread loads before it adds them (loads in flight)
constexpr int kColMinRows = 32;       // fewest rows per chunk
constexpr int kColMaxChunks = 256;
constexpr int kColTargetBlocks = 1024;  // about one wave of 256-thread blocks on a large GPU

// Each thread sums rows r0 + threadIdx.y, + kColRowLanes, ... of its kColPerLane columns, in
// row order (kColUnroll rows loaded, then added in that order: the order of a plain loop).
template <int K, class F>
__global__ void column_partials_kernel(float* __restrict__ partial, std::int64_t M, std::int64_t N,
                                       std::int64_t chunk, F f) {
  __shared__ float sm[K][kColRowLanes][kColTile + 1];
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * chunk;
  const std::int64_t r1 = r0 + chunk < M ? r0 + chunk : M;
  float acc[kColPerLane][K];
#pragma unroll
  for (int j = 0; j < kColPerLane; ++j)
#pragma unroll
    for (int k = 0; k < K; ++k) acc[j][k] = 0.0f;
  auto load = [&](std::int64_t r, int j, float (&v)[K]) {
    const std::int64_t c = c0 + j * kColLanes;
    if (c < N) {
      f(r, c, v);
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = 0.0f;
    }
  };
  std::int64_t r = r0 + threadIdx.y;
  for (; r + (kColUnroll - 1) * kColRowLanes < r1; r += kColUnroll * kColRowLanes) {
    float v[kColUnroll][kColPerLane][K];
#pragma unroll
    for (int u = 0; u < kColUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kColPerLane; ++j) load(r + u * kColRowLanes, j, v[u][j]);
#pragma unroll
    for (int u = 0; u < kColUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kColPerLane; ++j)
#pragma unroll
        for (int k = 0; k < K; ++k) acc[j][k] += v[u][j][k];
  }
  for (; r < r1; r += kColRowLanes)
#pragma unroll
    for (int j = 0; j < kColPerLane; ++j) {
      float v[K];
      load(r, j, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[j][k] += v[k];
    }
#pragma unroll
  for (int j = 0; j < kColPerLane; ++j)
#pragma unroll
    for (int k = 0; k < K; ++k) sm[k][threadIdx.y][threadIdx.x + j * kColLanes] = acc[j][k];
  __syncthreads();
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int j = 0; j < kColPerLane; ++j) {
    const std::int64_t c = c0 + j * kColLanes;
    if (c >= N) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
#pragma unroll
      for (int y = 0; y < kColRowLanes; ++y) s += sm[k][y][threadIdx.x + j * kColLanes];
      partial[(static_cast<std::int64_t>(k) * gridDim.y + blockIdx.y) * N + c] = s;
    }
  }
}

template <class T, int K>
struct ColumnOutputs {
  T* p[K];
};

template <class T, int K>
__global__ void column_finish_kernel(ColumnOutputs<T, K> out, const float* __restrict__ partial, std::int64_t N,
                                     std::int64_t chunks, bool accumulate) {
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < N;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (out.p[k] == nullptr) continue;
      float s = 0.0f;
      for (std::int64_t r = 0; r < chunks; ++r) s += partial[(k * chunks + r) * N + c];
      store1(out.p[k] + c, s, accumulate);
    }
  }
}

template <class T, int K, class F>
void column_reduce(Context& ctx, const ColumnOutputs<T, K>& out, std::int64_t M, std::int64_t N, bool accumulate,
                   F f, cudaStream_t stream, const char* what) {
  if (N <= 0) return;
  if (M <= 0) {
    if (!accumulate)
      for (int k = 0; k < K; ++k)
        if (out.p[k] != nullptr)
          ZP_CUDA_CHECK(cudaMemsetAsync(out.p[k], 0, static_cast<std::size_t>(N) * sizeof(T), stream));
    return;
  }
  const std::int64_t fit = static_cast<std::int64_t>(ctx.scratch_bytes() / (sizeof(float) * K * N));
  // Enough chunks to fill the GPU with blocks (a chunk per block and column tile), no more:
  // each block then streams many rows with several loads in flight.
  std::int64_t chunks = ceil_div(kColTargetBlocks, ceil_div(N, kColTile));
  if (chunks > ceil_div(M, kColMinRows)) chunks = ceil_div(M, kColMinRows);
  if (chunks > kColMaxChunks) chunks = kColMaxChunks;
  if (chunks > fit) chunks = fit;
  if (chunks < 1) chunks = 1;
  const std::int64_t chunk = ceil_div(M, chunks);
  chunks = ceil_div(M, chunk);
  auto* partial = static_cast<float*>(ctx.scratch(sizeof(float) * K * N * chunks, what));
  const dim3 grid(static_cast<unsigned>(ceil_div(N, kColTile)), static_cast<unsigned>(chunks));
  const dim3 block(kColLanes, kColRowLanes);
  column_partials_kernel<K, F><<<grid, block, 0, stream>>>(partial, M, N, chunk, f);
  ZP_CUDA_CHECK_LAUNCH(what);
  constexpr int kFinishBlock = 256;
  column_finish_kernel<T, K><<<grid_for(N, kFinishBlock), kFinishBlock, 0, stream>>>(out, partial, N, chunks,
                                                                                    accumulate);
  ZP_CUDA_CHECK_LAUNCH(what);
}

}  // namespace zp::kernels::cuda::detail
