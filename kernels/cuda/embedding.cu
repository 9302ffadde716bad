#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <string>

#include "kernels/common/align.hpp"
#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/embedding.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::kWidth;

constexpr int kGatherBlock = 256;

// The gradient's order (kernels/cpu/embedding.cpp's twin does the same): positions sorted
// stably by id, the sorted array cut into chunks of kChunk rows; each id's rows fall into
// pieces at those cuts, each piece summed in sorted order from 0.0f, and dW[id] (in fp32)
// gets the pieces' sums added in chunk order, then is rounded once.
constexpr int kChunk = 32;          // sorted rows per chunk (the CPU twin's kChunk)
constexpr int kScatterBlock = 128;  // threads per block of partials_kernel, each W contiguous columns
constexpr int kFinishBlock = 128;   // threads per block of finish_kernel, one column each
constexpr int kFinishUnroll = 32;   // chunks' partial sums loaded at once, then added in order
constexpr std::uint32_t kNoKey = 0xFFFFFFFFu;  // never an id (ids are below 2^31)

template <class T, bool Vec>
__global__ void gather_kernel(T* __restrict__ y, const std::int64_t* __restrict__ ids, const T* __restrict__ w,
                              std::int64_t N, std::int64_t C) {
  constexpr int W = kWidth<T, Vec>;
  const std::int64_t chunks = N * C / W;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c * W / C, col = c * W % C;
    const std::int64_t row = ids != nullptr ? ids[i] : i;
    float v[W];
    detail::load_f<T, W>(w + row * C + col, v);
    detail::store_f<T, W>(y + i * C + col, v);
  }
}

// ids (int64, in [0, V)) -> sort keys (uint32) and positions (int32).
__global__ void keys_kernel(std::uint32_t* __restrict__ keys, std::int32_t* __restrict__ pos,
                            const std::int64_t* __restrict__ ids, std::int64_t N) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = static_cast<std::uint32_t>(ids[i]);
    pos[i] = static_cast<std::int32_t>(i);
  }
}

// What ends at a chunk's sorted row i (partials_kernel's per-row flags).
enum : std::uint8_t { kRunGoesOn, kRunOwned, kRunSlot0, kRunSlot1, kRunPadding };

// W elements of T as stored (one 16-byte access when they fill it).
template <class T, int W>
__device__ __forceinline__ void load_raw(const T* p, T (&e)[W]) {
  if constexpr (W * sizeof(T) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    memcpy(e, &raw, 16);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) e[k] = p[k];
  }
}

// C columns of a slab whose rows are ld apart (dy, dw point at its first column; partials
// hold C columns per slot).
// Block (q, column tiles): sorted rows [q*kChunk, q*kChunk + n) in order, each thread W
// contiguous columns (a 16-byte pack on the vectorised path). Each run of equal ids in the
// chunk (one piece of that id's rows) is summed from 0.0f. A run wholly inside the chunk is
// added to dW[id] here; one crossing the chunk's start or end leaves its sum in
// partials[2q + slot] (slot 0: the chunk's first run, slot 1: its last run when that is
// another) for finish_kernel. padding_idx's run is skipped. An id ends at most once in a
// chunk and no other block touches an owned run's row, so its dW values are loaded along
// with the dy rows.
template <class T, bool Vec>
__global__ void __launch_bounds__(kScatterBlock)
    partials_kernel(T* __restrict__ dw, float* __restrict__ partials, const std::uint32_t* __restrict__ keys,
                    const std::int32_t* __restrict__ pos, const T* __restrict__ dy, std::int64_t N, std::int64_t C,
                    std::int64_t ld, std::int64_t padding_idx) {
  constexpr int W = kWidth<T, Vec>;
  constexpr int kTile = kScatterBlock * W;  // columns per block
  constexpr int kUnroll = Vec ? 8 : 16;     // rows loaded at once, then added in order
  // sk[0]: the key before the chunk, sk[1..n]: the chunk's keys, sk[n+1]: the key after it
  // (kNoKey past either end of the array); sp: the chunk's positions; se: what ends at row i.
  __shared__ std::uint32_t sk[kChunk + 2];
  __shared__ std::int32_t sp[kChunk];
  __shared__ std::uint8_t se[kChunk];
  const std::int64_t q = blockIdx.x;
  const std::int64_t s0 = q * kChunk;
  const int n = static_cast<int>(N - s0 < kChunk ? N - s0 : kChunk);
  for (int i = threadIdx.x; i < kChunk + 2; i += blockDim.x) {
    const std::int64_t s = s0 - 1 + i;
    sk[i] = i <= n + 1 && s >= 0 && s < N ? keys[s] : kNoKey;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) sp[i] = pos[s0 + i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const std::uint32_t id = sk[i + 1];
    std::uint8_t e = kRunOwned;
    if (i < n - 1 && sk[i + 2] == id)
      e = kRunGoesOn;
    else if (static_cast<std::int64_t>(id) == padding_idx)
      e = kRunPadding;
    else if (sk[0] == id || (i == n - 1 && sk[n + 1] == id))  // crosses the chunk's start or end
      e = id == sk[1] ? kRunSlot0 : kRunSlot1;                 // slot 0: the chunk's first run (keys are sorted)
    se[i] = e;
  }
  __syncthreads();
  for (std::int64_t tile = blockIdx.y; tile * kTile < C; tile += gridDim.y) {
    const std::int64_t c = tile * kTile + static_cast<std::int64_t>(threadIdx.x) * W;
    const bool active = c < C;  // all W columns are (W divides C on the vectorised path)
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] = 0.0f;
    for (int i0 = 0; i0 < n; i0 += kUnroll) {
      T v[kUnroll][W], old[kUnroll][W];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u;
        if (active && i < n) {
          load_raw<T, W>(dy + static_cast<std::int64_t>(sp[i]) * ld + c, v[u]);
          if (se[i] == kRunOwned) load_raw<T, W>(dw + static_cast<std::int64_t>(sk[i + 1]) * ld + c, old[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u;
        if (i >= n) break;
        const std::uint8_t e = se[i];
        if (active) {
#pragma unroll
          for (int k = 0; k < W; ++k) acc[k] += detail::to_float(v[u][k]);
          if (e == kRunOwned) {
            float sum[W];
#pragma unroll
            for (int k = 0; k < W; ++k) sum[k] = detail::to_float(old[u][k]) + acc[k];
            detail::store_f<T, W>(dw + static_cast<std::int64_t>(sk[i + 1]) * ld + c, sum);
          } else if (e == kRunSlot0 || e == kRunSlot1) {
            detail::store_f<float, W>(partials + (2 * q + (e == kRunSlot1 ? 1 : 0)) * C + c, acc);
          }
        }
        if (e != kRunGoesOn) {
#pragma unroll
          for (int k = 0; k < W; ++k) acc[k] = 0.0f;
        }
      }
    }
  }
}

// Block (q, column tiles): the run that starts in chunk q and crosses its end (at most one:
// the chunk's last run), if any and not padding_idx: dW[id] (fp32) += its piece in chunk q
// (slot 0 when the run fills chunk q, else slot 1), then the slot 0 of each later chunk up
// to the one where the run ends, in order; rounded once. One column per thread.
template <class T>
__global__ void __launch_bounds__(kFinishBlock)
    finish_kernel(T* __restrict__ dw, const float* __restrict__ partials, const std::uint32_t* __restrict__ keys,
                  std::int64_t N, std::int64_t C, std::int64_t ld, std::int64_t padding_idx) {
  const std::int64_t q = blockIdx.x;
  const std::int64_t s0 = q * kChunk, s1 = s0 + kChunk;
  if (s1 >= N) return;  // the last chunk: nothing crosses its end
  const std::uint32_t id = keys[s1 - 1];
  if (keys[s1] != id || static_cast<std::int64_t>(id) == padding_idx) return;
  const bool whole = keys[s0] == id;                   // the run fills chunk q (keys are sorted)
  if (whole && s0 > 0 && keys[s0 - 1] == id) return;  // it starts in an earlier chunk
  const std::int64_t chunks = (N + kChunk - 1) / kChunk;
  T* dst = dw + static_cast<std::int64_t>(id) * ld;
  const float* first = partials + (2 * q + (whole ? 0 : 1)) * C;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * kFinishBlock + threadIdx.x; c < C;
       c += static_cast<std::int64_t>(gridDim.y) * kFinishBlock) {
    float f = detail::to_float(dst[c]) + first[c];
    // Later chunks' slot 0 while the chunk starts with id (the run goes on into it; keys are
    // sorted): kFinishUnroll chunks' first keys and partial sums loaded at once, then added
    // in chunk order. Chunk q + 1 always does.
    bool more = true;
    for (std::int64_t q0 = q + 1; more; q0 += kFinishUnroll) {
      std::uint32_t k[kFinishUnroll];
      float v[kFinishUnroll];
#pragma unroll
      for (int u = 0; u < kFinishUnroll; ++u) {
        const bool in = q0 + u < chunks;
        k[u] = in ? keys[(q0 + u) * kChunk] : kNoKey;
        v[u] = in ? partials[2 * (q0 + u) * C + c] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kFinishUnroll; ++u) {
        if (k[u] != id) {
          more = false;
          break;
        }
        f += v[u];
      }
    }
    dst[c] = detail::from_float<T>(f);
  }
}

// Position ids: row i of dW gets dy[i] (each once).
template <class T>
__global__ void scatter_positions_kernel(T* __restrict__ dw, const T* __restrict__ dy, std::int64_t N,
                                         std::int64_t C, std::int64_t padding_idx) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < N * C;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (e / C == padding_idx) continue;
    dw[e] = detail::from_float<T>(detail::to_float(dw[e]) + detail::to_float(dy[e]));
  }
}

int key_bits(std::int64_t V) {
  int bits = 1;
  while (bits < 31 && (std::int64_t{1} << bits) < V) ++bits;
  return bits;
}

std::size_t round_up(std::size_t n) { return static_cast<std::size_t>(carve_aligned(static_cast<std::int64_t>(n))); }

}  // namespace

void embedding_forward(void* y, const std::int64_t* ids, const void* w, std::int64_t N, std::int64_t C, DType dt,
                       cudaStream_t stream) {
  if (N * C <= 0) return;
  detail::dispatch(dt, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = C % detail::kPack<T> == 0 && detail::aligned16(y) && detail::aligned16(w);
    if (vec)
      gather_kernel<T, true><<<detail::grid_for(N * C / detail::kPack<T>, kGatherBlock), kGatherBlock, 0, stream>>>(
          static_cast<T*>(y), ids, static_cast<const T*>(w), N, C);
    else
      gather_kernel<T, false><<<detail::grid_for(N * C, kGatherBlock), kGatherBlock, 0, stream>>>(
          static_cast<T*>(y), ids, static_cast<const T*>(w), N, C);
    ZP_CUDA_CHECK_LAUNCH("gather_kernel");
  });
}

void embedding_backward(Context& ctx, void* dw, const std::int64_t* ids, const void* dy, std::int64_t N,
                        std::int64_t V, std::int64_t C, std::int64_t padding_idx, bool accumulate, DType dt,
                        cudaStream_t stream) {
  require_float(dt, "embedding_backward");
  if (V > (std::int64_t{1} << 31) - 1 || N > (std::int64_t{1} << 31) - 1)
    throw std::invalid_argument("embedding_backward: more than 2^31 - 1 rows or ids");
  auto zero_table = [&] {
    if (!accumulate && V * C > 0)
      ZP_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<std::size_t>(V * C * dtype_size(dt)), stream));
  };
  if (N * C <= 0 || ids == nullptr) zero_table();
  if (N * C <= 0) return;
  if (ids == nullptr) {
    detail::dispatch(dt, "embedding_backward", [&](auto tag) {
      using T = decltype(tag);
      scatter_positions_kernel<T><<<detail::grid_for(N * C, kGatherBlock), kGatherBlock, 0, stream>>>(
          static_cast<T*>(dw), static_cast<const T*>(dy), N, C, padding_idx);
      ZP_CUDA_CHECK_LAUNCH("scatter_positions_kernel");
    });
    return;
  }
  // Scratch: keys and positions in, sorted keys and positions out, CUB's storage, then two
  // fp32 partial rows per chunk of kChunk sorted rows for a slab of columns: as many columns
  // as the rest of the scratch holds (the columns are independent, so slabs change no bit).
  const int n = static_cast<int>(N);
  const std::int64_t chunks = detail::ceil_div(N, kChunk);
  const std::size_t arr = round_up(static_cast<std::size_t>(N) * sizeof(std::int32_t));
  std::size_t cub_bytes = 0;
  ZP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                static_cast<std::uint32_t*>(nullptr),
                                                static_cast<const std::int32_t*>(nullptr),
                                                static_cast<std::int32_t*>(nullptr), n, 0, key_bits(V), stream));
  const std::size_t fixed = 4 * arr + round_up(cub_bytes);
  const std::size_t per_column = static_cast<std::size_t>(2 * chunks) * sizeof(float);
  constexpr std::int64_t kSlabAlign = 16;  // columns: keeps every slab on the 16-byte path
  std::int64_t slab = C;
  if (fixed + per_column * static_cast<std::size_t>(C) > ctx.scratch_bytes()) {
    const std::size_t room = ctx.scratch_bytes() > fixed ? ctx.scratch_bytes() - fixed : 0;
    slab = static_cast<std::int64_t>(room / per_column) / kSlabAlign * kSlabAlign;
    if (slab < kSlabAlign)
      throw CudaError("embedding_backward: " + std::to_string(N) + " rows need " +
                      std::to_string(fixed + per_column * kSlabAlign) + " bytes of scratch for a slab of " +
                      std::to_string(kSlabAlign) + " columns, the Context has " + std::to_string(ctx.scratch_bytes()) +
                      " (ContextOptions::scratch_bytes)");
  }
  char* base = static_cast<char*>(ctx.scratch(
      fixed + per_column * static_cast<std::size_t>(slab),
      "embedding_backward (sorted ids and positions, the sort's storage, 2 * ceil(N / 32) fp32 partial sums per column)"));
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + arr);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + 2 * arr);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + 3 * arr);
  void* cub_storage = base + 4 * arr;
  auto* partials = reinterpret_cast<float*>(base + fixed);
  zero_table();  // after the scratch is known to suffice: a refused call writes nothing
  keys_kernel<<<detail::grid_for(N, kGatherBlock), kGatherBlock, 0, stream>>>(keys_in, pos_in, ids, N);
  ZP_CUDA_CHECK_LAUNCH("keys_kernel");
  ZP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_storage, cub_bytes, keys_in, keys_out, pos_in, pos_out, n, 0,
                                                key_bits(V), stream));
  const auto capped = [](std::int64_t tiles) { return static_cast<unsigned>(tiles < 65535 ? tiles : 65535); };
  detail::dispatch(dt, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t c0 = 0; c0 < C; c0 += slab) {
      const std::int64_t w = std::min(slab, C - c0);
      T* dwc = static_cast<T*>(dw) + c0;
      const T* dyc = static_cast<const T*>(dy) + c0;
      const bool vec = C % detail::kPack<T> == 0 && w % detail::kPack<T> == 0 && detail::aligned16(dwc) &&
                       detail::aligned16(dyc);
      const std::int64_t tile = kScatterBlock * (vec ? detail::kPack<T> : 1);  // columns per block
      const dim3 grid(static_cast<unsigned>(chunks), capped(detail::ceil_div(w, tile)));
      if (vec)
        partials_kernel<T, true><<<grid, kScatterBlock, 0, stream>>>(dwc, partials, keys_out, pos_out, dyc, N, w, C,
                                                                     padding_idx);
      else
        partials_kernel<T, false><<<grid, kScatterBlock, 0, stream>>>(dwc, partials, keys_out, pos_out, dyc, N, w, C,
                                                                      padding_idx);
      ZP_CUDA_CHECK_LAUNCH("partials_kernel");
      if (chunks > 1) {
        finish_kernel<T><<<dim3(static_cast<unsigned>(chunks - 1), capped(detail::ceil_div(w, kFinishBlock))),
                           kFinishBlock, 0, stream>>>(dwc, partials, keys_out, N, w, C, padding_idx);
        ZP_CUDA_CHECK_LAUNCH("finish_kernel");
      }
    }
  });
}

}  // namespace zp::kernels::cuda
