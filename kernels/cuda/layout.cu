#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/layout.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::kWidth;

constexpr int kLayoutBlock = 256;

// Heads (B, H, T, D) <- columns [offset, offset + H*D) of rows (B, T, W), W-wide chunks
// along d (a chunk never straddles two heads: D % W == 0 on the vectorised path).
template <class T, bool Vec>
__global__ void rows_to_heads_kernel(T* __restrict__ y, const T* __restrict__ x, std::int64_t B, std::int64_t T_,
                                     std::int64_t H, std::int64_t D, std::int64_t W, std::int64_t offset,
                                     bool accumulate) {
  constexpr int V = kWidth<T, Vec>;
  const std::int64_t chunks = B * H * T_ * D / V;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c * V;  // index into y (B, H, T, D)
    const std::int64_t d = i % D, t = (i / D) % T_, h = (i / (D * T_)) % H, b = i / (D * T_ * H);
    float v[V];
    detail::load_f<T, V>(x + (b * T_ + t) * W + offset + h * D + d, v);
    detail::store_acc<T, V>(y + i, v, accumulate);
  }
}

// Rows (B, T, W) <- heads (B, H, T, D) in columns [offset, offset + H*D), written or added
// into; the other columns are not touched.
template <class T, bool Vec>
__global__ void heads_to_rows_kernel(T* __restrict__ y, const T* __restrict__ x, std::int64_t B, std::int64_t T_,
                                     std::int64_t H, std::int64_t D, std::int64_t W, std::int64_t offset,
                                     bool accumulate) {
  constexpr int V = kWidth<T, Vec>;
  const std::int64_t C = H * D;  // the block's columns: only they are visited
  const std::int64_t chunks = B * T_ * C / V;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = c * V;  // index into the block (B, T, H·D)
    const std::int64_t col = j % C, bt = j / C;
    const std::int64_t h = col / D, d = col % D, b = bt / T_, t = bt % T_;
    float v[V];
    detail::load_f<T, V>(x + ((b * H + h) * T_ + t) * D + d, v);
    detail::store_acc<T, V>(y + bt * W + offset + col, v, accumulate);
  }
}

template <class T, bool Vec>
__global__ void repeat_kv_forward_kernel(T* __restrict__ y, const T* __restrict__ x, std::int64_t B, std::int64_t KV,
                                         std::int64_t rep, std::int64_t plane) {
  constexpr int V = kWidth<T, Vec>;
  const std::int64_t chunks = B * KV * rep * plane / V;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c * V;
    const std::int64_t within = i % plane, p = i / plane;  // p = b*(KV*rep) + g*rep + r
    const std::int64_t b = p / (KV * rep), g = (p % (KV * rep)) / rep;
    float v[V];
    detail::load_f<T, V>(x + (b * KV + g) * plane + within, v);
    detail::store_f<T, V>(y + i, v);
  }
}

template <class T, bool Vec>
__global__ void repeat_kv_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, std::int64_t B,
                                          std::int64_t KV, std::int64_t rep, std::int64_t plane, bool accumulate) {
  constexpr int V = kWidth<T, Vec>;
  const std::int64_t chunks = B * KV * plane / V;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c * V;
    const std::int64_t within = i % plane, bg = i / plane;
    float s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = 0.0f;
    for (std::int64_t r = 0; r < rep; ++r) {
      float v[V];
      detail::load_f<T, V>(dy + (bg * rep + r) * plane + within, v);
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] += v[k];
    }
    detail::store_acc<T, V>(dx + i, s, accumulate);
  }
}

template <class T, bool Vec>
__global__ void select_token_forward_kernel(T* __restrict__ y, const T* __restrict__ x, std::int64_t B,
                                            std::int64_t T_, std::int64_t C, std::int64_t t) {
  constexpr int V = kWidth<T, Vec>;
  const std::int64_t chunks = B * C / V;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c * V, b = i / C, col = i % C;
    float v[V];
    detail::load_f<T, V>(x + (b * T_ + t) * C + col, v);
    detail::store_f<T, V>(y + i, v);
  }
}

template <class T, bool Vec>
__global__ void select_token_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, std::int64_t B,
                                             std::int64_t T_, std::int64_t C, std::int64_t t, bool accumulate) {
  constexpr int V = kWidth<T, Vec>;
  const std::int64_t chunks = B * T_ * C / V;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c * V, col = i % C, bt = i / C, b = bt / T_;
    float v[V];
    if (bt % T_ == t) {
      detail::load_f<T, V>(dy + b * C + col, v);
    } else {
      if (accumulate) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = 0.0f;
    }
    detail::store_acc<T, V>(dx + i, v, accumulate);
  }
}

// Every extent the vectorised path's chunks must not straddle is a multiple of the pack.
template <class T>
bool packs_fit(std::initializer_list<std::int64_t> extents, std::initializer_list<const void*> ptrs) {
  for (std::int64_t e : extents)
    if (e % detail::kPack<T> != 0) return false;
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) return false;
  return true;
}

// Launches kernel<E, true> or kernel<E, false> (E: the element type in scope) over `elements` / width chunks.
#define ZP_LAUNCH_VEC(kernel, vec, elements, ...)                                                              \
  do {                                                                                                         \
    if (vec)                                                                                                   \
      kernel<E, true><<<detail::grid_for((elements) / detail::kPack<E>, kLayoutBlock), kLayoutBlock, 0, stream>>>( \
          __VA_ARGS__);                                                                                        \
    else                                                                                                       \
      kernel<E, false><<<detail::grid_for((elements), kLayoutBlock), kLayoutBlock, 0, stream>>>(__VA_ARGS__);  \
    ZP_CUDA_CHECK_LAUNCH(#kernel);                                                                             \
  } while (0)

}  // namespace

void split_heads_forward(void* y, const void* x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                         std::int64_t W, std::int64_t offset, DType dt, cudaStream_t stream) {
  if (B * T * H * D <= 0) return;
  detail::dispatch(dt, "split_heads_forward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({D, W, offset}, {y, x});
    ZP_LAUNCH_VEC(rows_to_heads_kernel, vec, B * H * T * D, static_cast<E*>(y), static_cast<const E*>(x), B, T, H,
                  D, W, offset, false);
  });
}

void split_heads_backward(void* dx, const void* dy, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                          std::int64_t W, std::int64_t offset, bool accumulate, DType dt, cudaStream_t stream) {
  if (B * T * W <= 0) return;
  detail::dispatch(dt, "split_heads_backward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({D, W, offset}, {dx, dy});
    ZP_LAUNCH_VEC(heads_to_rows_kernel, vec, B * T * H * D, static_cast<E*>(dx), static_cast<const E*>(dy), B, T, H,
                  D, W, offset, accumulate);
  });
}

void merge_heads_forward(void* y, const void* x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                         DType dt, cudaStream_t stream) {
  if (B * T * H * D <= 0) return;
  detail::dispatch(dt, "merge_heads_forward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({D}, {y, x});
    ZP_LAUNCH_VEC(heads_to_rows_kernel, vec, B * T * H * D, static_cast<E*>(y), static_cast<const E*>(x), B, T, H,
                  D, H * D, std::int64_t{0}, false);
  });
}

void merge_heads_backward(void* dx, const void* dy, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                          bool accumulate, DType dt, cudaStream_t stream) {
  if (B * T * H * D <= 0) return;
  detail::dispatch(dt, "merge_heads_backward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({D}, {dx, dy});
    ZP_LAUNCH_VEC(rows_to_heads_kernel, vec, B * H * T * D, static_cast<E*>(dx), static_cast<const E*>(dy), B, T, H,
                  D, H * D, std::int64_t{0}, accumulate);
  });
}

void repeat_kv_forward(void* y, const void* x, std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T,
                       std::int64_t D, DType dt, cudaStream_t stream) {
  if (B * KV * rep * T * D <= 0) return;
  detail::dispatch(dt, "repeat_kv_forward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({T * D}, {y, x});
    ZP_LAUNCH_VEC(repeat_kv_forward_kernel, vec, B * KV * rep * T * D, static_cast<E*>(y), static_cast<const E*>(x),
                  B, KV, rep, T * D);
  });
}

void repeat_kv_backward(void* dx, const void* dy, std::int64_t B, std::int64_t KV, std::int64_t rep, std::int64_t T,
                        std::int64_t D, bool accumulate, DType dt, cudaStream_t stream) {
  if (B * KV * T * D <= 0) return;
  detail::dispatch(dt, "repeat_kv_backward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({T * D}, {dx, dy});
    ZP_LAUNCH_VEC(repeat_kv_backward_kernel, vec, B * KV * T * D, static_cast<E*>(dx), static_cast<const E*>(dy), B,
                  KV, rep, T * D, accumulate);
  });
}

void select_token_forward(void* y, const void* x, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t,
                          DType dt, cudaStream_t stream) {
  if (B * C <= 0) return;
  detail::dispatch(dt, "select_token_forward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({C}, {y, x});
    ZP_LAUNCH_VEC(select_token_forward_kernel, vec, B * C, static_cast<E*>(y), static_cast<const E*>(x), B, T, C, t);
  });
}

void select_token_backward(void* dx, const void* dy, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t t,
                           bool accumulate, DType dt, cudaStream_t stream) {
  if (B * T * C <= 0) return;
  detail::dispatch(dt, "select_token_backward", [&](auto tag) {
    using E = decltype(tag);
    const bool vec = packs_fit<E>({C}, {dx, dy});
    ZP_LAUNCH_VEC(select_token_backward_kernel, vec, B * T * C, static_cast<E*>(dx), static_cast<const E*>(dy), B, T,
                  C, t, accumulate);
  });
}

}  // namespace zp::kernels::cuda
