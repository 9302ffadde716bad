#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/multi.cuh"

namespace zp::kernels::cuda {

namespace {

constexpr int kMultiBlock = 256;
constexpr int kMultiWidth = 8;  // elements per thread and step on the aligned path, at most
constexpr std::int64_t kMultiChunk = std::int64_t{kMultiBlock} * kMultiWidth * 4;  // elements per block

// Elements per thread and step of a map from X to Y: one 16-byte access on the wider side,
// so that each of a warp's loads and stores covers 512 contiguous bytes. With 8 elements a
// thread, an fp32 side took two 16-byte accesses 32 bytes apart, each instruction's lanes
// writing every other 16 bytes: on an H100 (zeroplan_bench_cuda) a bf16 -> fp32 copy of
// GPT-2's 148 gradients ran at 2.27 TB/s, 2.67 now, where a 350M-element fp32 -> bf16 convert
// runs at 3.07.
template <class Y, class X>
constexpr int kMapWidth = static_cast<int>(16 / (sizeof(Y) > sizeof(X) ? sizeof(Y) : sizeof(X)));

// W elements at p (aligned to W·sizeof(T) bytes) as floats: one 8- or 16-byte access where
// W·sizeof(T) is 8, else detail::load_f's.
template <class T, int W>
__device__ __forceinline__ void load_w(const T* p, float (&v)[W]) {
  if constexpr (W * sizeof(T) == 8) {
    T e[W];
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    memcpy(e, &raw, 8);
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = detail::to_float(e[i]);
  } else {
    detail::load_f<T, W>(p, v);
  }
}

template <class T, int W>
__device__ __forceinline__ void store_w(T* p, const float (&v)[W]) {
  if constexpr (W * sizeof(T) == 8) {
    T e[W];
#pragma unroll
    for (int i = 0; i < W; ++i) e[i] = detail::from_float<T>(v[i]);
    uint2 raw;
    memcpy(&raw, e, 8);
    *reinterpret_cast<uint2*>(p) = raw;
  } else {
    detail::store_f<T, W>(p, v);
  }
}
constexpr int kMultiMax = 48;   // runs per launch, passed in the kernel's parameters (1.8 KB)

// One launch's runs; blocks [first[r], first[r + 1]) take run r, kMultiChunk elements each.
struct RunList {
  void* y[kMultiMax];
  const void* x[kMultiMax];
  const void* x2[kMultiMax];  // null where the run has one source
  std::int64_t n[kMultiMax];
  std::int32_t first[kMultiMax + 1];
  std::uint64_t vec;  // bit r: run r's pointers are 16-byte aligned
  int count;
};

__device__ __forceinline__ int run_of(const RunList& l) {
  int r = 0;
  while (r + 1 < l.count && static_cast<std::int32_t>(blockIdx.x) >= l.first[r + 1]) ++r;
  return r;
}

// x[i], or x[i] + x2[i] in fp32 where there is a second source.
template <class X>
__device__ __forceinline__ float source1(const X* x, const X* x2, std::int64_t i) {
  const float v = detail::to_float(x[i]);
  return x2 == nullptr ? v : __fadd_rn(v, detail::to_float(x2[i]));
}

// The same for W elements from j on (16-byte aligned).
template <class X, int W>
__device__ __forceinline__ void source_w(const X* x, const X* x2, std::int64_t j, float (&v)[W]) {
  load_w<X, W>(x + j, v);
  if (x2 == nullptr) return;
  float u[W];
  load_w<X, W>(x2 + j, u);
#pragma unroll
  for (int k = 0; k < W; ++k) v[k] = __fadd_rn(v[k], u[k]);
}

template <class Y, class X, int M>
__device__ __forceinline__ void map1(Y* y, const X* x, const X* x2, std::int64_t i) {
  const float v = M == static_cast<int>(MultiMode::zero) ? 0.0f : source1(x, x2, i);
  y[i] = detail::from_float<Y>(M == static_cast<int>(MultiMode::add) ? __fadd_rn(detail::to_float(y[i]), v) : v);
}

template <class Y, class X, int M>
__global__ void __launch_bounds__(kMultiBlock) multi_map_kernel(const RunList l) {
  constexpr int W = kMapWidth<Y, X>;
  const int r = run_of(l);
  const std::int64_t n = l.n[r];
  const std::int64_t lo = static_cast<std::int64_t>(static_cast<std::int32_t>(blockIdx.x) - l.first[r]) * kMultiChunk;
  const std::int64_t hi = lo + kMultiChunk < n ? lo + kMultiChunk : n;
  Y* y = static_cast<Y*>(l.y[r]);
  const X* x = static_cast<const X*>(l.x[r]);
  const X* x2 = static_cast<const X*>(l.x2[r]);
  if (((l.vec >> r) & 1u) == 0) {
    for (std::int64_t i = lo + threadIdx.x; i < hi; i += kMultiBlock) map1<Y, X, M>(y, x, x2, i);
    return;
  }
  for (std::int64_t j = lo + static_cast<std::int64_t>(threadIdx.x) * W; j < hi; j += std::int64_t{kMultiBlock} * W) {
    if (j + W > hi) {
      for (std::int64_t i = j; i < hi; ++i) map1<Y, X, M>(y, x, x2, i);
      continue;
    }
    float v[W];
    if constexpr (M == static_cast<int>(MultiMode::zero)) {
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = 0.0f;
    } else {
      source_w<X, W>(x, x2, j, v);
    }
    if constexpr (M == static_cast<int>(MultiMode::add)) {
      float u[W];
      load_w<Y, W>(y + j, u);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = __fadd_rn(u[k], v[k]);
    }
    store_w<Y, W>(y + j, v);
  }
}

// partial[base + block] = the sum of x² (or (x + x2)²) over the block's slice of its run.
template <class X>
__global__ void __launch_bounds__(kMultiBlock) multi_squares_kernel(const RunList l, double* __restrict__ partial,
                                                                    std::int64_t base) {
  __shared__ double sm[33];
  constexpr int W = kMultiWidth;
  const int r = run_of(l);
  const std::int64_t n = l.n[r];
  const std::int64_t lo = static_cast<std::int64_t>(static_cast<std::int32_t>(blockIdx.x) - l.first[r]) * kMultiChunk;
  const std::int64_t hi = lo + kMultiChunk < n ? lo + kMultiChunk : n;
  const X* x = static_cast<const X*>(l.x[r]);
  const X* x2 = static_cast<const X*>(l.x2[r]);
  double s = 0.0;
  if (((l.vec >> r) & 1u) == 0) {
    for (std::int64_t i = lo + threadIdx.x; i < hi; i += kMultiBlock) {
      const double d = source1(x, x2, i);
      s += d * d;
    }
  } else {
    for (std::int64_t j = lo + static_cast<std::int64_t>(threadIdx.x) * W; j < hi; j += std::int64_t{kMultiBlock} * W) {
      if (j + W > hi) {
        for (std::int64_t i = j; i < hi; ++i) {
          const double d = source1(x, x2, i);
          s += d * d;
        }
        continue;
      }
      float v[W];
      source_w<X, W>(x, x2, j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const double d = v[k];
        s += d * d;
      }
    }
  }
  s = detail::block_sum(s, sm);
  if (threadIdx.x == 0) partial[base + blockIdx.x] = s;
}

__global__ void multi_finish_kernel(double* __restrict__ out, const double* __restrict__ partial, std::int64_t count) {
  __shared__ double sm[33];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = detail::block_sum(s, sm);
  if (threadIdx.x == 0) out[0] = out[0] + s;
}

// Calls launch(list, blocks) for the runs [0, count) with n > 0, kMultiMax at a time and at
// most max_blocks blocks a launch (a longer run is cut into pieces of whole chunks).
template <class Launch>
void for_lists(const MultiRun* runs, std::int64_t count, bool reads_x, bool writes_y, std::int64_t max_blocks,
               std::size_t y_size, std::size_t x_size, Launch&& launch) {
  RunList l{};
  std::int64_t blocks = 0;
  auto flush = [&] {
    if (l.count == 0) return;
    l.first[l.count] = static_cast<std::int32_t>(blocks);
    launch(l, blocks);
    l = RunList{};
    blocks = 0;
  };
  auto add = [&](void* y, const void* x, const void* x2, std::int64_t n) {
    const std::int64_t b = detail::ceil_div(n, kMultiChunk);
    if (l.count == kMultiMax || blocks + b > max_blocks) flush();
    const bool aligned = (!writes_y || detail::aligned16(y)) && (!reads_x || detail::aligned16(x)) &&
                         (x2 == nullptr || detail::aligned16(x2));
    l.y[l.count] = y;
    l.x[l.count] = x;
    l.x2[l.count] = x2;
    l.n[l.count] = n;
    l.first[l.count] = static_cast<std::int32_t>(blocks);
    if (aligned) l.vec |= std::uint64_t{1} << l.count;
    ++l.count;
    blocks += b;
  };
  const std::int64_t piece = max_blocks * kMultiChunk;
  for (std::int64_t i = 0; i < count; ++i) {
    const MultiRun& m = runs[i];
    for (std::int64_t at = 0; at < m.n; at += piece) {
      const auto off = static_cast<std::size_t>(at);
      add(m.y ? static_cast<char*>(m.y) + off * y_size : nullptr,
          m.x ? static_cast<const char*>(m.x) + off * x_size : nullptr,
          m.x2 ? static_cast<const char*>(m.x2) + off * x_size : nullptr, std::min(piece, m.n - at));
    }
  }
  flush();
}

}  // namespace

void multi_map(const MultiRun* runs, std::int64_t count, MultiMode mode, DType y_dt, DType x_dt, cudaStream_t stream) {
  require_float(y_dt, "multi_map");
  if (mode != MultiMode::zero) require_float(x_dt, "multi_map");
  const bool reads = mode != MultiMode::zero;
  for (std::int64_t i = 0; i < count; ++i)
    if (runs[i].x2 != nullptr && mode != MultiMode::copy)
      throw std::logic_error("multi_map: a second source outside copy mode");
  const auto ys = static_cast<std::size_t>(dtype_size(y_dt)), xs = static_cast<std::size_t>(dtype_size(x_dt));
  detail::dispatch(y_dt, "multi_map", [&](auto ytag) {
    using Y = decltype(ytag);
    detail::dispatch(reads ? x_dt : y_dt, "multi_map", [&](auto xtag) {
      using X = decltype(xtag);
      for_lists(runs, count, reads, true, std::int64_t{1} << 30, ys, xs, [&](const RunList& l, std::int64_t blocks) {
        const auto grid = static_cast<unsigned>(blocks);
        switch (mode) {
          case MultiMode::copy:
            multi_map_kernel<Y, X, static_cast<int>(MultiMode::copy)><<<grid, kMultiBlock, 0, stream>>>(l);
            break;
          case MultiMode::add:
            multi_map_kernel<Y, X, static_cast<int>(MultiMode::add)><<<grid, kMultiBlock, 0, stream>>>(l);
            break;
          case MultiMode::zero:
            multi_map_kernel<Y, X, static_cast<int>(MultiMode::zero)><<<grid, kMultiBlock, 0, stream>>>(l);
            break;
        }
        ZP_CUDA_CHECK_LAUNCH("multi_map_kernel");
      });
    });
  });
}

void multi_sum_squares(Context& ctx, double* out, const MultiRun* runs, std::int64_t count, DType dt,
                       cudaStream_t stream) {
  require_float(dt, "multi_sum_squares");
  // The partials live in the Context's scratch as it is (a side stream's holds 1 MiB): when
  // they would not fit, those so far are added into out first.
  const auto cap = static_cast<std::int64_t>(ctx.scratch_bytes() / sizeof(double));
  if (cap < 1) throw std::logic_error("multi_sum_squares: the Context has no scratch");
  auto* partial = static_cast<double*>(ctx.scratch(static_cast<std::size_t>(cap) * sizeof(double), "multi_sum_squares"));
  std::int64_t base = 0;
  auto finish = [&] {
    if (base == 0) return;
    multi_finish_kernel<<<1, kMultiBlock, 0, stream>>>(out, partial, base);
    ZP_CUDA_CHECK_LAUNCH("multi_finish_kernel");
    base = 0;
  };
  const auto xs = static_cast<std::size_t>(dtype_size(dt));
  detail::dispatch(dt, "multi_sum_squares", [&](auto tag) {
    using X = decltype(tag);
    for_lists(runs, count, true, false, cap, xs, xs, [&](const RunList& l, std::int64_t blocks) {
      if (base + blocks > cap) finish();
      multi_squares_kernel<X><<<static_cast<unsigned>(blocks), kMultiBlock, 0, stream>>>(l, partial, base);
      ZP_CUDA_CHECK_LAUNCH("multi_squares_kernel");
      base += blocks;
    });
  });
  finish();
}

}  // namespace zp::kernels::cuda
