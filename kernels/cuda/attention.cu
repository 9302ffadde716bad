#include <limits>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/detail.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::block_max;
using detail::block_sum;
using detail::from_float;
using detail::kWidth;
using detail::load_f;
using detail::to_float;

constexpr int kElemBlock = 256;

#define ZP_ROW_LOOP(j, W, C) for (std::int64_t j = static_cast<std::int64_t>(threadIdx.x) * (W); j < (C); j += static_cast<std::int64_t>(blockDim.x) * (W))
#define ZP_GRID_LOOP(e, total) for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total); e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <class T, bool Vec>
__global__ void softmax_forward_kernel(T* __restrict__ y, const T* __restrict__ x, std::int64_t rows,
                                       std::int64_t n) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    float mx = -INFINITY;
    ZP_ROW_LOOP(j, W, n) {
      float v[W];
      load_f<T, W>(xr + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) mx = fmaxf(mx, v[k]);
    }
    mx = block_max(mx, sm);
    if (mx == -INFINITY) {  // every entry is -inf
      ZP_ROW_LOOP(j, W, n) {
        float o[W];
#pragma unroll
        for (int k = 0; k < W; ++k) o[k] = 0.0f;
        detail::store_f<T, W>(yr + j, o);
      }
      continue;
    }
    float s = 0.0f;
    ZP_ROW_LOOP(j, W, n) {
      float v[W];
      load_f<T, W>(xr + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) s += expf(v[k] - mx);
    }
    const float inv = 1.0f / block_sum(s, sm);
    ZP_ROW_LOOP(j, W, n) {
      float v[W];
      load_f<T, W>(xr + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = expf(v[k] - mx) * inv;
      detail::store_f<T, W>(yr + j, v);
    }
  }
}

template <class T, bool Vec>
__global__ void softmax_backward_kernel(T* __restrict__ dx, const T* __restrict__ y, const T* __restrict__ dy,
                                        std::int64_t rows, std::int64_t n, bool accumulate) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * n;
    const T* dyr = dy + row * n;
    float dot = 0.0f;
    ZP_ROW_LOOP(j, W, n) {
      float a[W], g[W];
      load_f<T, W>(yr + j, a);
      load_f<T, W>(dyr + j, g);
#pragma unroll
      for (int k = 0; k < W; ++k) dot += a[k] * g[k];
    }
    dot = block_sum(dot, sm);
    ZP_ROW_LOOP(j, W, n) {
      float a[W], g[W];
      load_f<T, W>(yr + j, a);
      load_f<T, W>(dyr + j, g);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = a[k] * (g[k] - dot);
      detail::store_acc<T, W>(dx + row * n + j, a, accumulate);
    }
  }
}

template <class T>
__global__ void causal_where_kernel(T* __restrict__ y, const T* __restrict__ x, std::int64_t BH, std::int64_t T_,
                                    float masked, bool has_x, bool accumulate) {
  ZP_GRID_LOOP(e, BH * T_ * T_) {
    const std::int64_t j = e % T_, i = (e / T_) % T_;
    if (accumulate) {
      if (j <= i) detail::store1(y + e, to_float(x[e]), true);
    } else {
      y[e] = j > i ? from_float<T>(masked) : (has_x ? x[e] : from_float<T>(0.0f));
    }
  }
}

template <class T>
__global__ void padding_mask_kernel(T* __restrict__ m, const std::int64_t* __restrict__ attention_mask,
                                    std::int64_t total, float masked) {
  ZP_GRID_LOOP(e, total) m[e] = from_float<T>(attention_mask[e] != 0 ? 0.0f : masked);
}

template <class T>
__global__ void rope_tables_kernel(T* __restrict__ cos_t, T* __restrict__ sin_t, std::int64_t T_, std::int64_t D,
                                   float theta) {
  const std::int64_t half = D / 2;
  ZP_GRID_LOOP(e, T_ * half) {
    const std::int64_t t = e / half, i = e % half;
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    const float inv_freq = 1.0f / powf(theta, expo);
    const float f = static_cast<float>(t) * inv_freq;
    const T c = from_float<T>(cosf(f)), s = from_float<T>(sinf(f));
    cos_t[t * D + i] = c;
    cos_t[t * D + i + half] = c;
    sin_t[t * D + i] = s;
    sin_t[t * D + i + half] = s;
  }
}

template <class T>
__global__ void rope_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ cos_t,
                            const T* __restrict__ sin_t, std::int64_t BH, std::int64_t T_, std::int64_t D,
                            bool backward, bool accumulate) {
  const std::int64_t half = D / 2;
  ZP_GRID_LOOP(e, BH * T_ * D) {
    const std::int64_t j = e % D, t = (e / D) % T_;
    const T* xr = x + (e - j);
    const T* c = cos_t + t * D;
    const T* s = sin_t + t * D;
    float v;
    if (!backward)
      v = j < half ? to_float(xr[j]) * to_float(c[j]) - to_float(xr[j + half]) * to_float(s[j])
                   : to_float(xr[j]) * to_float(c[j]) + to_float(xr[j - half]) * to_float(s[j]);
    else
      v = j < half ? to_float(xr[j]) * to_float(c[j]) + to_float(xr[j + half]) * to_float(s[j + half])
                   : to_float(xr[j]) * to_float(c[j]) - to_float(xr[j - half]) * to_float(s[j - half]);
    detail::store1(y + e, v, accumulate);
  }
}

// The same rotation, kPack<T> elements of each half of a row per thread (their cos and sin
// too), one division per pack: where the half row is a whole number of packs and every row
// starts aligned.
template <class T>
__global__ void rope_vec_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ cos_t,
                                const T* __restrict__ sin_t, std::int64_t BH, std::int64_t T_, std::int64_t D,
                                bool backward, bool accumulate) {
  constexpr int W = detail::kPack<T>;
  const std::int64_t half = D / 2, packs = half / W;
  ZP_GRID_LOOP(i, BH * T_ * packs) {
    const std::int64_t row = i / packs, j = (i - row * packs) * W, t = row % T_;
    const T* xr = x + row * D;
    const T* c = cos_t + t * D;
    const T* s = sin_t + t * D;
    float a[W], b[W], ca[W], cb[W], sa[W], sb[W], lo[W], hi[W];
    detail::load_f<T, W>(xr + j, a);
    detail::load_f<T, W>(xr + j + half, b);
    detail::load_f<T, W>(c + j, ca);
    detail::load_f<T, W>(c + j + half, cb);
    detail::load_f<T, W>(s + j, sa);
    detail::load_f<T, W>(s + j + half, sb);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (!backward) {
        lo[k] = a[k] * ca[k] - b[k] * sa[k];
        hi[k] = b[k] * cb[k] + a[k] * sb[k];
      } else {
        lo[k] = a[k] * ca[k] + b[k] * sb[k];
        hi[k] = b[k] * cb[k] - a[k] * sa[k];
      }
    }
    detail::store_acc<T, W>(y + row * D + j, lo, accumulate);
    detail::store_acc<T, W>(y + row * D + j + half, hi, accumulate);
  }
}

template <class T>
void launch_rope(T* y, const T* x, const T* cos, const T* sin, std::int64_t BH, std::int64_t T_, std::int64_t D,
                 bool backward, bool accumulate, cudaStream_t stream) {
  constexpr int W = detail::kPack<T>;
  if ((D / 2) % W == 0 && detail::aligned16(y) && detail::aligned16(x) && detail::aligned16(cos) && detail::aligned16(sin))
    rope_vec_kernel<T><<<detail::grid_for(BH * T_ * (D / 2 / W), kElemBlock), kElemBlock, 0, stream>>>(
        y, x, cos, sin, BH, T_, D, backward, accumulate);
  else
    rope_kernel<T><<<detail::grid_for(BH * T_ * D, kElemBlock), kElemBlock, 0, stream>>>(y, x, cos, sin, BH, T_, D,
                                                                                         backward, accumulate);
  ZP_CUDA_CHECK_LAUNCH("rope_kernel");
}

template <class T>
bool rows_vec(std::int64_t n, const void* a, const void* b, const void* c) {
  return n % detail::kPack<T> == 0 && detail::aligned16(a) && detail::aligned16(b) && (c == nullptr || detail::aligned16(c));
}

}  // namespace

float mask_value(DType dt) {
  switch (dt) {
    case DType::bf16: return -0x1.fep127f;  // bf16 0xFF7F
    case DType::fp16: return -65504.0f;
    default: return std::numeric_limits<float>::lowest();
  }
}

void softmax_forward(void* y, const void* x, std::int64_t rows, std::int64_t n, DType dt, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  detail::dispatch(dt, "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(n, y, x, nullptr);
    const dim3 block(static_cast<unsigned>(detail::row_threads(vec ? n / detail::kPack<T> : n)));
    if (vec)
      softmax_forward_kernel<T, true><<<detail::grid_for(rows, 1), block, 0, stream>>>(
          static_cast<T*>(y), static_cast<const T*>(x), rows, n);
    else
      softmax_forward_kernel<T, false><<<detail::grid_for(rows, 1), block, 0, stream>>>(
          static_cast<T*>(y), static_cast<const T*>(x), rows, n);
    ZP_CUDA_CHECK_LAUNCH("softmax_forward_kernel");
  });
}

void softmax_backward(void* dx, const void* y, const void* dy, std::int64_t rows, std::int64_t n, bool accumulate,
                      DType dt, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  detail::dispatch(dt, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(n, dx, y, dy);
    const dim3 block(static_cast<unsigned>(detail::row_threads(vec ? n / detail::kPack<T> : n)));
    if (vec)
      softmax_backward_kernel<T, true><<<detail::grid_for(rows, 1), block, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(y), static_cast<const T*>(dy), rows, n, accumulate);
    else
      softmax_backward_kernel<T, false><<<detail::grid_for(rows, 1), block, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(y), static_cast<const T*>(dy), rows, n, accumulate);
    ZP_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
  });
}

void causal_mask(void* m, std::int64_t T, float masked, DType dt, cudaStream_t stream) {
  if (T <= 0) return;
  detail::dispatch(dt, "causal_mask", [&](auto tag) {
    using E = decltype(tag);
    causal_where_kernel<E><<<detail::grid_for(T * T, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<E*>(m), nullptr, 1, T, masked, false, false);
    ZP_CUDA_CHECK_LAUNCH("causal_where_kernel");
  });
}

void causal_where_forward(void* y, const void* x, std::int64_t BH, std::int64_t T, float masked, DType dt,
                          cudaStream_t stream) {
  if (BH * T <= 0) return;
  detail::dispatch(dt, "causal_where_forward", [&](auto tag) {
    using E = decltype(tag);
    causal_where_kernel<E><<<detail::grid_for(BH * T * T, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<E*>(y), static_cast<const E*>(x), BH, T, masked, true, false);
    ZP_CUDA_CHECK_LAUNCH("causal_where_kernel");
  });
}

void causal_where_backward(void* dx, const void* dy, std::int64_t BH, std::int64_t T, bool accumulate, DType dt,
                           cudaStream_t stream) {
  if (BH * T <= 0) return;
  detail::dispatch(dt, "causal_where_backward", [&](auto tag) {
    using E = decltype(tag);
    causal_where_kernel<E><<<detail::grid_for(BH * T * T, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<E*>(dx), static_cast<const E*>(dy), BH, T, 0.0f, true, accumulate);
    ZP_CUDA_CHECK_LAUNCH("causal_where_kernel");
  });
}

void padding_mask(void* m, const std::int64_t* attention_mask, std::int64_t B, std::int64_t T, float masked, DType dt,
                  cudaStream_t stream) {
  if (B * T <= 0) return;
  detail::dispatch(dt, "padding_mask", [&](auto tag) {
    using E = decltype(tag);
    padding_mask_kernel<E><<<detail::grid_for(B * T, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<E*>(m), attention_mask, B * T, masked);
    ZP_CUDA_CHECK_LAUNCH("padding_mask_kernel");
  });
}

void rope_tables(void* cos, void* sin, std::int64_t T, std::int64_t D, float theta, DType dt, cudaStream_t stream) {
  if (D % 2 != 0) throw std::invalid_argument("rope_tables: the head dimension must be even");
  if (T * D <= 0) return;
  detail::dispatch(dt, "rope_tables", [&](auto tag) {
    using E = decltype(tag);
    rope_tables_kernel<E><<<detail::grid_for(T * D / 2, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<E*>(cos), static_cast<E*>(sin), T, D, theta);
    ZP_CUDA_CHECK_LAUNCH("rope_tables_kernel");
  });
}

void rope_forward(void* y, const void* x, const void* cos, const void* sin, std::int64_t B, std::int64_t H,
                  std::int64_t T, std::int64_t D, DType dt, cudaStream_t stream) {
  if (D % 2 != 0) throw std::invalid_argument("rope_forward: the head dimension must be even");
  if (B * H * T * D <= 0) return;
  detail::dispatch(dt, "rope_forward", [&](auto tag) {
    using E = decltype(tag);
    launch_rope(static_cast<E*>(y), static_cast<const E*>(x), static_cast<const E*>(cos), static_cast<const E*>(sin),
                B * H, T, D, false, false, stream);
  });
}

void rope_backward(void* dx, const void* dy, const void* cos, const void* sin, std::int64_t B, std::int64_t H,
                   std::int64_t T, std::int64_t D, bool accumulate, DType dt, cudaStream_t stream) {
  if (D % 2 != 0) throw std::invalid_argument("rope_backward: the head dimension must be even");
  if (B * H * T * D <= 0) return;
  detail::dispatch(dt, "rope_backward", [&](auto tag) {
    using E = decltype(tag);
    launch_rope(static_cast<E*>(dx), static_cast<const E*>(dy), static_cast<const E*>(cos), static_cast<const E*>(sin),
                B * H, T, D, true, accumulate, stream);
  });
}

}  // namespace zp::kernels::cuda
