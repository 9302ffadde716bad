#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/multi.cuh"

namespace zp::kernels::cuda {

namespace {

constexpr int kMultiBlock = 256;
constexpr int kMultiWidth = 8;  // elements per access on the aligned path: 16 or 32 bytes
constexpr std::int64_t kMultiChunk = std::int64_t{kMultiBlock} * kMultiWidth * 4;  // elements per block
constexpr int kMultiMax = 48;   // runs per launch, passed in the kernel's parameters (1.4 KB)

// One launch's runs; blocks [first[r], first[r + 1]) take run r, kMultiChunk elements each.
struct RunList {
  void* y[kMultiMax];
  const void* x[kMultiMax];
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

template <class Y, class X, int M>
__device__ __forceinline__ void map1(Y* y, const X* x, std::int64_t i) {
  const float v = M == static_cast<int>(MultiMode::zero) ? 0.0f : detail::to_float(x[i]);
  y[i] = detail::from_float<Y>(M == static_cast<int>(MultiMode::add) ? __fadd_rn(detail::to_float(y[i]), v) : v);
}

template <class Y, class X, int M>
__global__ void __launch_bounds__(kMultiBlock) multi_map_kernel(const RunList l) {
  constexpr int W = kMultiWidth;
  const int r = run_of(l);
  const std::int64_t n = l.n[r];
  const std::int64_t lo = static_cast<std::int64_t>(static_cast<std::int32_t>(blockIdx.x) - l.first[r]) * kMultiChunk;
  const std::int64_t hi = lo + kMultiChunk < n ? lo + kMultiChunk : n;
  Y* y = static_cast<Y*>(l.y[r]);
  const X* x = static_cast<const X*>(l.x[r]);
  if (((l.vec >> r) & 1u) == 0) {
    for (std::int64_t i = lo + threadIdx.x; i < hi; i += kMultiBlock) map1<Y, X, M>(y, x, i);
    return;
  }
  for (std::int64_t j = lo + static_cast<std::int64_t>(threadIdx.x) * W; j < hi; j += std::int64_t{kMultiBlock} * W) {
    if (j + W > hi) {
      for (std::int64_t i = j; i < hi; ++i) map1<Y, X, M>(y, x, i);
      continue;
    }
    float v[W];
    if constexpr (M == static_cast<int>(MultiMode::zero)) {
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = 0.0f;
    } else {
      detail::load_f<X, W>(x + j, v);
    }
    if constexpr (M == static_cast<int>(MultiMode::add)) {
      float u[W];
      detail::load_f<Y, W>(y + j, u);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = __fadd_rn(u[k], v[k]);
    }
    detail::store_f<Y, W>(y + j, v);
  }
}

// partial[base + block] = the sum of x² over the block's slice of its run.
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
  double s = 0.0;
  if (((l.vec >> r) & 1u) == 0) {
    for (std::int64_t i = lo + threadIdx.x; i < hi; i += kMultiBlock) {
      const double d = detail::to_float(x[i]);
      s += d * d;
    }
  } else {
    for (std::int64_t j = lo + static_cast<std::int64_t>(threadIdx.x) * W; j < hi; j += std::int64_t{kMultiBlock} * W) {
      if (j + W > hi) {
        for (std::int64_t i = j; i < hi; ++i) {
          const double d = detail::to_float(x[i]);
          s += d * d;
        }
        continue;
      }
      float v[W];
      detail::load_f<X, W>(x + j, v);
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
  auto add = [&](void* y, const void* x, std::int64_t n) {
    const std::int64_t b = detail::ceil_div(n, kMultiChunk);
    if (l.count == kMultiMax || blocks + b > max_blocks) flush();
    const bool aligned = (!writes_y || detail::aligned16(y)) && (!reads_x || detail::aligned16(x));
    l.y[l.count] = y;
    l.x[l.count] = x;
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
          m.x ? static_cast<const char*>(m.x) + off * x_size : nullptr, std::min(piece, m.n - at));
    }
  }
  flush();
}

}  // namespace

void multi_map(const MultiRun* runs, std::int64_t count, MultiMode mode, DType y_dt, DType x_dt, cudaStream_t stream) {
  require_float(y_dt, "multi_map");
  if (mode != MultiMode::zero) require_float(x_dt, "multi_map");
  const bool reads = mode != MultiMode::zero;
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
