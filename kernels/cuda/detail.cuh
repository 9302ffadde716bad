#pragma once
// Internal helpers of the .cu files (device code; not part of the public API): storage
// types and their fp32 conversions, 16-byte packs, launch arithmetic, the dtype dispatch,
// deterministic warp and block reductions, and the generic elementwise map.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"

namespace zp::kernels::cuda::detail {

using bf16 = __nv_bfloat16;
using fp16 = __half;

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Grid of a grid-stride loop over `work` items, `block` threads each: one item per thread
// up to a cap that keeps the grid small for huge tensors (any larger grid only loops).
constexpr unsigned grid_for(std::int64_t work, int block) {
  constexpr std::int64_t kMaxBlocks = 1 << 16;
  const std::int64_t g = ceil_div(work < 1 ? 1 : work, block);
  return static_cast<unsigned>(g < kMaxBlocks ? g : kMaxBlocks);
}

// ----------------------------------------------------------------- storage types
template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<bf16>(bf16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float<fp16>(fp16 x) {
  return __half2float(x);
}

// Round to nearest even (fp16 overflows to inf, as PyTorch's casts).
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ fp16 from_float<fp16>(float x) {
  return __float2half_rn(x);
}

// Elements of T in one 16-byte access.
template <class T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

// Elements per access of a kernel instance: a 16-byte pack on the vectorised path, else 1.
template <class T, bool Vec>
constexpr int kWidth = Vec ? kPack<T> : 1;

// Loads W consecutive elements (one 16-byte access when W is a whole pack) as fp32.
// Loads W consecutive elements as fp32: whole 16-byte accesses when W elements fill them
// (the caller guarantees the alignment), else element by element.
template <class T, int W>
__device__ __forceinline__ void load_f(const T* p, float (&v)[W]) {
  if constexpr ((W * sizeof(T)) % 16 == 0) {
    constexpr int kAccesses = static_cast<int>(W * sizeof(T) / 16);
    T e[W];
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) {
      const uint4 raw = reinterpret_cast<const uint4*>(p)[a];
      memcpy(e + a * kPack<T>, &raw, 16);
    }
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = to_float(p[i]);
  }
}

template <class T, int W>
__device__ __forceinline__ void store_f(T* p, const float (&v)[W]) {
  if constexpr ((W * sizeof(T)) % 16 == 0) {
    constexpr int kAccesses = static_cast<int>(W * sizeof(T) / 16);
    T e[W];
#pragma unroll
    for (int i = 0; i < W; ++i) e[i] = from_float<T>(v[i]);
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) {
      uint4 raw;
      memcpy(&raw, e + a * kPack<T>, 16);
      reinterpret_cast<uint4*>(p)[a] = raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] = from_float<T>(v[i]);
  }
}

// dst = v, or dst += v when accumulating: the sum in fp32, never fused with the product
// that made v (as the CPU twins round v first), then rounded once.
template <class T, int W>
__device__ __forceinline__ void store_acc(T* p, float (&v)[W], bool accumulate) {
  if (accumulate) {
    float old[W];
    load_f<T, W>(p, old);
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = __fadd_rn(old[i], v[i]);
  }
  store_f<T, W>(p, v);
}

template <class T>
__device__ __forceinline__ void store1(T* p, float v, bool accumulate) {
  *p = from_float<T>(accumulate ? __fadd_rn(to_float(*p), v) : v);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// ----------------------------------------------------------------- dtype dispatch
// Calls f(T{}) with T the storage type of dt (fp32, bf16, fp16).
template <class F>
void dispatch(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::fp32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::fp16: f(fp16{}); return;
    default: break;
  }
  require_float(dt, what);
}

// ----------------------------------------------------------------- reductions
// Butterfly reductions: every lane ends with the same value, combined in a fixed order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `smem` holds 33 values; the call synchronises the block.
template <class V>
__device__ __forceinline__ V block_sum(V v, V* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    V r = lane < warps ? smem[lane] : V(0);
    r = warp_sum(r);
    if (lane == 0) smem[32] = r;
  }
  __syncthreads();
  const V r = smem[32];
  __syncthreads();  // smem may be reused right after
  return r;
}

__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? smem[lane] : -INFINITY;
    r = warp_max(r);
    if (lane == 0) smem[32] = r;
  }
  __syncthreads();
  const float r = smem[32];
  __syncthreads();
  return r;
}

// Threads per block of a row kernel for rows of `chunks` accesses: one access per thread
// up to 1024 threads, at least one warp.
inline int row_threads(std::int64_t chunks) {
  int t = 32;
  while (t < 1024 && t < chunks) t *= 2;
  return t;
}

// ----------------------------------------------------------------- elementwise map
// y[i] = f(in[0][i], ..., in[N-1][i]) (or y[i] += ... when accumulating), all in T.
template <class T, int N>
struct Inputs {
  const T* p[N > 0 ? N : 1];
};

template <class T, bool Vec, int N, class F>
__global__ void map_kernel(T* __restrict__ y, Inputs<T, N> in, std::int64_t n, bool accumulate, F f) {
  constexpr int W = kWidth<T, Vec>;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * W;
  for (std::int64_t j = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W; j < n; j += stride) {
    if (j + W <= n) {
      float x[N][W];
#pragma unroll
      for (int k = 0; k < N; ++k) load_f<T, W>(in.p[k] + j, x[k]);
      float o[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        float a[N];
#pragma unroll
        for (int k = 0; k < N; ++k) a[k] = x[k][w];
        o[w] = f(a);
      }
      store_acc<T, W>(y + j, o, accumulate);
    } else {  // the tail of a vectorised pass
      for (std::int64_t i = j; i < n; ++i) {
        float a[N];
#pragma unroll
        for (int k = 0; k < N; ++k) a[k] = to_float(in.p[k][i]);
        store1(y + i, f(a), accumulate);
      }
    }
  }
}

constexpr int kMapBlock = 256;

// Launches map_kernel on the 16-byte path when every pointer is aligned.
template <class T, int N, class F>
void map(T* y, const Inputs<T, N>& in, std::int64_t n, bool accumulate, F f, cudaStream_t stream, const char* what) {
  if (n <= 0) return;
  bool vec = aligned16(y);
  for (int k = 0; k < N; ++k) vec = vec && aligned16(in.p[k]);
  if (vec) {
    map_kernel<T, true, N, F><<<grid_for(ceil_div(n, kPack<T>), kMapBlock), kMapBlock, 0, stream>>>(y, in, n,
                                                                                                   accumulate, f);
  } else {
    map_kernel<T, false, N, F><<<grid_for(n, kMapBlock), kMapBlock, 0, stream>>>(y, in, n, accumulate, f);
  }
  ZP_CUDA_CHECK_LAUNCH(what);
}

}  // namespace zp::kernels::cuda::detail
