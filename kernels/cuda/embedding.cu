#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/embedding.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::kWidth;

constexpr int kGatherBlock = 256;
constexpr int kScatterBlock = 128;  // threads per distinct id, each a chunk of columns

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

// One block per sorted position that starts a run of equal ids: dW[id] += its rows, in
// increasing position order (the stable sort keeps them so), one thread per column.
template <class T>
__global__ void scatter_sorted_kernel(T* __restrict__ dw, const std::uint32_t* __restrict__ keys,
                                      const std::int32_t* __restrict__ pos, const T* __restrict__ dy, std::int64_t N,
                                      std::int64_t C, std::int64_t padding_idx) {
  for (std::int64_t s = blockIdx.x; s < N; s += gridDim.x) {
    const std::uint32_t id = keys[s];
    if ((s > 0 && keys[s - 1] == id) || static_cast<std::int64_t>(id) == padding_idx) continue;
    std::int64_t end = s + 1;
    while (end < N && keys[end] == id) ++end;
    T* dst = dw + static_cast<std::int64_t>(id) * C;
    for (std::int64_t col = threadIdx.x; col < C; col += blockDim.x) {
      float acc = detail::to_float(dst[col]);
      for (std::int64_t r = s; r < end; ++r) acc += detail::to_float(dy[static_cast<std::int64_t>(pos[r]) * C + col]);
      dst[col] = detail::from_float<T>(acc);
    }
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

std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

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
  if (!accumulate && V * C > 0)
    ZP_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<std::size_t>(V * C * dtype_size(dt)), stream));
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
  // Scratch: keys and positions in, sorted keys and positions out, then CUB's own storage.
  const int n = static_cast<int>(N);
  const std::size_t arr = round_up(static_cast<std::size_t>(N) * sizeof(std::int32_t));
  std::size_t cub_bytes = 0;
  ZP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                static_cast<std::uint32_t*>(nullptr),
                                                static_cast<const std::int32_t*>(nullptr),
                                                static_cast<std::int32_t*>(nullptr), n, 0, key_bits(V), stream));
  char* base = static_cast<char*>(ctx.scratch(4 * arr + cub_bytes, "embedding_backward"));
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + arr);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + 2 * arr);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + 3 * arr);
  void* cub_storage = base + 4 * arr;
  keys_kernel<<<detail::grid_for(N, kGatherBlock), kGatherBlock, 0, stream>>>(keys_in, pos_in, ids, N);
  ZP_CUDA_CHECK_LAUNCH("keys_kernel");
  ZP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_storage, cub_bytes, keys_in, keys_out, pos_in, pos_out, n, 0,
                                                key_bits(V), stream));
  detail::dispatch(dt, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    scatter_sorted_kernel<T><<<detail::grid_for(N, 1), kScatterBlock, 0, stream>>>(
        static_cast<T*>(dw), keys_out, pos_out, static_cast<const T*>(dy), N, C, padding_idx);
    ZP_CUDA_CHECK_LAUNCH("scatter_sorted_kernel");
  });
}

}  // namespace zp::kernels::cuda
