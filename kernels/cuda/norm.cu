#include <algorithm>
#include <array>
#include <atomic>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common/norm_dims.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/cuda/columns.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/norm.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::block_sum;
using detail::from_float;
using detail::kWidth;
using detail::load_f;
using detail::to_float;

constexpr int kElemBlock = 256;

// The 16-byte path of a row kernel: rows of whole packs, every (non-null) pointer aligned.
template <class T>
bool rows_vec(std::int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % detail::kPack<T> != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !detail::aligned16(p)) return false;
  return true;
}

// One block per row (grid-stride over rows), row_threads(C / W) threads.
template <class T>
dim3 row_block(std::int64_t C, bool vec) {
  return dim3(static_cast<unsigned>(detail::row_threads(vec ? C / detail::kPack<T> : C)));
}

#define ZP_ROW_LOOP(j, W, C) for (std::int64_t j = static_cast<std::int64_t>(threadIdx.x) * (W); j < (C); j += static_cast<std::int64_t>(blockDim.x) * (W))

// ------------------------------------------------------------------ LayerNorm
template <class T, bool Vec>
__global__ void layernorm_forward_kernel(T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                         std::int64_t rows, std::int64_t C, float eps) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  const float fc = static_cast<float>(C);
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * C;
    T* yr = y + row * C;
    float s = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float v[W];
      load_f<T, W>(xr + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) s += v[k];
    }
    const float mu = block_sum(s, sm) / fc;
    float q = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float v[W];
      load_f<T, W>(xr + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float d = v[k] - mu;
        q += d * d;
      }
    }
    const float var = block_sum(q, sm) / fc;
    const float rs = 1.0f / sqrtf(var + eps);
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
    ZP_ROW_LOOP(j, W, C) {
      float v[W], wv[W], bv[W], o[W];
      load_f<T, W>(xr + j, v);
      if (w != nullptr) load_f<T, W>(w + j, wv);
      if (b != nullptr) load_f<T, W>(b + j, bv);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        o[k] = (v[k] - mu) * rs;
        if (w != nullptr) o[k] *= wv[k];
        if (b != nullptr) o[k] += bv[k];
      }
      detail::store_f<T, W>(yr + j, o);
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
template <class T, bool Vec>
__global__ void layernorm_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    const T* __restrict__ w, std::int64_t rows, std::int64_t C, bool accumulate) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  const float fc = static_cast<float>(C);
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * C;
    const T* xr = x + row * C;
    const float mu = mean[row], rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float d[W], v[W], wv[W];
      load_f<T, W>(dyr + j, d);
      load_f<T, W>(xr + j, v);
      if (w != nullptr) load_f<T, W>(w + j, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float g = w != nullptr ? d[k] * wv[k] : d[k];
        sg += g;
        sgx += g * ((v[k] - mu) * rs);
      }
    }
    const float mean_g = block_sum(sg, sm) / fc;
    const float mean_gx = block_sum(sgx, sm) / fc;
    ZP_ROW_LOOP(j, W, C) {
      float d[W], v[W], wv[W], o[W];
      load_f<T, W>(dyr + j, d);
      load_f<T, W>(xr + j, v);
      if (w != nullptr) load_f<T, W>(w + j, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float g = w != nullptr ? d[k] * wv[k] : d[k];
        const float xhat = (v[k] - mu) * rs;
        o[k] = rs * (g - mean_g - xhat * mean_gx);
      }
      detail::store_acc<T, W>(dx + row * C + j, o, accumulate);
    }
  }
}

// The same two as one warp per row with the row held in registers (P 16-byte packs per lane):
// x (and dy) read from memory once, the sums reduced by warp shuffles with no block barrier,
// several rows per block. For rows of whole packs up to 32·P packs. The statistics are the
// block kernels' (the mean, then the mean square of the deviations), summed in another order.
constexpr int kWarpRowsPerBlock = 4;

// f(row, lane) for every row of this warp: one warp per row, grid-stride over the rows.
template <class F>
__device__ __forceinline__ void for_warp_rows(std::int64_t rows, F&& f) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kWarpRowsPerBlock;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32; row < rows;
       row += step)
    f(row, lane);
}

// LayerNorm of one row held in registers (v: the lane's P packs), written to y, mean and rstd.
template <class T, int P>
__device__ __forceinline__ void layernorm_warp_row(float (&v)[P][detail::kPack<T>], T* __restrict__ y,
                                                   float* __restrict__ mean, float* __restrict__ rstd,
                                                   const T* __restrict__ w, const T* __restrict__ b, std::int64_t row,
                                                   std::int64_t C, int lane, float eps) {
  constexpr int W = detail::kPack<T>;
  const float fc = static_cast<float>(C);
  float s = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (static_cast<std::int64_t>(p * 32 + lane) * W < C) {
#pragma unroll
      for (int k = 0; k < W; ++k) s += v[p][k];
    }
  }
  const float mu = detail::warp_sum(s) / fc;
  float q = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (static_cast<std::int64_t>(p * 32 + lane) * W < C) {
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float d = v[p][k] - mu;
        q += d * d;
      }
    }
  }
  const float rs = 1.0f / sqrtf(detail::warp_sum(q) / fc + eps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const std::int64_t j = static_cast<std::int64_t>(p * 32 + lane) * W;
    if (j >= C) continue;
    float wv[W], bv[W], o[W];
    if (w != nullptr) load_f<T, W>(w + j, wv);
    if (b != nullptr) load_f<T, W>(b + j, bv);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      o[k] = (v[p][k] - mu) * rs;
      if (w != nullptr) o[k] *= wv[k];
      if (b != nullptr) o[k] += bv[k];
    }
    detail::store_f<T, W>(y + row * C + j, o);
  }
}

template <class T, int P>
__global__ void layernorm_forward_warp_kernel(T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                              const T* __restrict__ x, const T* __restrict__ w,
                                              const T* __restrict__ b, std::int64_t rows, std::int64_t C, float eps) {
  constexpr int W = detail::kPack<T>;
  for_warp_rows(rows, [&](std::int64_t row, int lane) {
    float v[P][W];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const std::int64_t j = static_cast<std::int64_t>(p * 32 + lane) * W;
      if (j < C) load_f<T, W>(x + row * C + j, v[p]);
    }
    layernorm_warp_row<T, P>(v, y, mean, rstd, w, b, row, C, lane, eps);
  });
}

// The fused residual LayerNorm's forward (dropout_add_layernorm_forward): per pack, the dropped
// operand's kept elements scaled (the mask drawn as dropout_forward draws it: element i of the
// op's stream at offset + i, a multiple of 4), rounded to T, added to the residual and rounded
// again, as the three kernels of the chain store them; the sum and the mask written, and the
// row's LayerNorm taken from the registers. mask nullptr: no dropout (p = 0).
template <class T, int P>
__global__ void dropout_add_layernorm_warp_kernel(T* __restrict__ y, float* __restrict__ mean,
                                                  float* __restrict__ rstd, T* __restrict__ sum,
                                                  std::uint8_t* __restrict__ mask, const T* __restrict__ b,
                                                  const T* __restrict__ x, const T* __restrict__ w,
                                                  const T* __restrict__ beta, std::int64_t rows, std::int64_t C,
                                                  float eps, float keep, float scale, std::uint64_t seed,
                                                  std::uint64_t offset) {
  constexpr int W = detail::kPack<T>;
  static_assert(W % 4 == 0, "a pack covers whole Philox blocks");
  for_warp_rows(rows, [&](std::int64_t row, int lane) {
    float v[P][W];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const std::int64_t j = static_cast<std::int64_t>(p * 32 + lane) * W;
      if (j >= C) continue;
      const std::int64_t i = row * C + j;
      float bv[W], xv[W];
      load_f<T, W>(b + i, bv);
      load_f<T, W>(x + i, xv);
      std::uint8_t m[W];
#pragma unroll
      for (int q = 0; q < W / 4; ++q) {
        const philox::Block r =
            mask != nullptr ? philox::block_at(seed, (offset >> 2) + static_cast<std::uint64_t>(i / 4) + q, 0u)
                            : philox::Block{};
#pragma unroll
        for (int k = 0; k < 4; ++k) m[q * 4 + k] = mask == nullptr || philox::to_unit(r.w[k]) < keep ? 1 : 0;
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float d = mask == nullptr ? bv[k] : m[k] != 0 ? __fmul_rn(bv[k], scale) : 0.0f;
        v[p][k] = to_float(from_float<T>(__fadd_rn(to_float(from_float<T>(d)), xv[k])));
      }
      detail::store_f<T, W>(sum + i, v[p]);
      if (mask != nullptr) {
        if constexpr (W == 8) {
          uint2 raw;
          memcpy(&raw, m, sizeof raw);
          *reinterpret_cast<uint2*>(mask + i) = raw;
        } else {
          std::uint32_t raw;
          memcpy(&raw, m, sizeof raw);
          *reinterpret_cast<std::uint32_t*>(mask + i) = raw;
        }
      }
    }
    layernorm_warp_row<T, P>(v, y, mean, rstd, w, beta, row, C, lane, eps);
  });
}

// The fused residual LayerNorm's epilogue of dx (dropout_add_layernorm_backward): t = ds + dx
// rounded once to T (as the chain's LayerNorm backward adds into the sum's gradient); the
// residual's gradient t, the dropped operand's t·mask·scale (each written or added into).
template <class T>
struct ResidualDropout {
  const T* ds = nullptr;               // the sum's gradient from a later reader, or nullptr
  T* dres = nullptr;                   // or nullptr
  T* db = nullptr;                     // or nullptr
  const std::uint8_t* mask = nullptr;  // nullptr: no dropout
  float scale = 1.0f;
  bool acc_res = false, acc_b = false;
};

// dx of one row (the warp's lanes each own the same columns in every row); with Sums, the
// row's dy·x̂ and dy added into the lane's sums for dw and db, kept in shared memory (the
// warp's P·W·32 floats each, element (p, k) of lane l at (p·W + k)·32 + l: no bank conflicts).
// In registers they took 64 of the 162 a thread (bf16, P = 4): 12 warps an SM. With Res, dx
// goes through the fused residual LayerNorm's epilogue r instead of to dx.
template <class T, int P, bool Sums, bool Res>
__device__ __forceinline__ void layernorm_dx_row(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                                 float mu, float rs, const T* __restrict__ w, std::int64_t row,
                                                 std::int64_t C, int lane, bool accumulate, float* __restrict__ sw,
                                                 float* __restrict__ sb, const ResidualDropout<T>& r) {
  constexpr int W = detail::kPack<T>;
  const float fc = static_cast<float>(C);
  float g[P][W], xh[P][W];
  float sg = 0.0f, sgx = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const std::int64_t j = static_cast<std::int64_t>(p * 32 + lane) * W;
    if (j >= C) continue;
    float wv[W];
    load_f<T, W>(dy + row * C + j, g[p]);
    load_f<T, W>(x + row * C + j, xh[p]);
    if (w != nullptr) load_f<T, W>(w + j, wv);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      xh[p][k] = (xh[p][k] - mu) * rs;
      if constexpr (Sums) {
        const int at = (p * W + k) * 32 + lane;
        sw[at] += g[p][k] * xh[p][k];
        sb[at] += g[p][k];
      }
      if (w != nullptr) g[p][k] = g[p][k] * wv[k];
      sg += g[p][k];
      sgx += g[p][k] * xh[p][k];
    }
  }
  const float mean_g = detail::warp_sum(sg) / fc;
  const float mean_gx = detail::warp_sum(sgx) / fc;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const std::int64_t j = static_cast<std::int64_t>(p * 32 + lane) * W;
    if (j >= C) continue;
    float o[W];
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = rs * (g[p][k] - mean_g - xh[p][k] * mean_gx);
    if constexpr (Res) {
      const std::int64_t i = row * C + j;
      if (r.ds != nullptr) {
        float a[W];
        load_f<T, W>(r.ds + i, a);
#pragma unroll
        for (int k = 0; k < W; ++k) o[k] = __fadd_rn(a[k], o[k]);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) o[k] = to_float(from_float<T>(o[k]));
      if (r.db != nullptr) {
        float d[W];
        if (r.mask != nullptr) {
          std::uint8_t m[W];
          if constexpr (W == 8) {
            const uint2 raw = *reinterpret_cast<const uint2*>(r.mask + i);
            memcpy(m, &raw, sizeof raw);
          } else {
            const std::uint32_t raw = *reinterpret_cast<const std::uint32_t*>(r.mask + i);
            memcpy(m, &raw, sizeof raw);
          }
#pragma unroll
          for (int k = 0; k < W; ++k) d[k] = m[k] != 0 ? __fmul_rn(o[k], r.scale) : 0.0f;
        } else {
#pragma unroll
          for (int k = 0; k < W; ++k) d[k] = o[k];
        }
        detail::store_acc<T, W>(r.db + i, d, r.acc_b);
      }
      if (r.dres != nullptr) detail::store_acc<T, W>(r.dres + i, o, r.acc_res);
    } else {
      detail::store_acc<T, W>(dx + row * C + j, o, accumulate);
    }
  }
}

template <class T, int P, bool Res>
__global__ void layernorm_dx_warp_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         const T* __restrict__ w, std::int64_t rows, std::int64_t C, bool accumulate,
                                         ResidualDropout<T> r) {
  for_warp_rows(rows, [&](std::int64_t row, int lane) {
    layernorm_dx_row<T, P, false, Res>(dx, dy, x, mean[row], rstd[row], w, row, C, lane, accumulate, nullptr, nullptr,
                                       r);
  });
}

// The same dx, and in the same pass each warp's sums of dy·x̂ and dy over the rows it takes,
// for its lane's columns, then the block's (its warps' in order): partial[0][block][c] and
// partial[1][block][c], fp32. Warp k takes rows k, k + warps, ...; the sums are the same bits
// for the same `warps`. dy and x are read once for all three gradients (the separate column
// reduction read them again).
template <class T, int P, bool Res>
__global__ void layernorm_backward_warp_kernel(T* __restrict__ dx, float* __restrict__ partial,
                                               const T* __restrict__ dy, const T* __restrict__ x,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               const T* __restrict__ w, std::int64_t rows, std::int64_t C,
                                               std::int64_t warps, bool accumulate, ResidualDropout<T> r) {
  constexpr int W = detail::kPack<T>;
  constexpr int kSums = P * W * 32;
  __shared__ float sums[kWarpRowsPerBlock][2][kSums];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int in_block = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpRowsPerBlock + in_block;
  float* sw = sums[in_block][0];
  float* sb = sums[in_block][1];
  for (int i = lane; i < kSums; i += 32) sw[i] = sb[i] = 0.0f;  // each lane its own elements
  for (std::int64_t row = warp; row < rows && warp < warps; row += warps)
    layernorm_dx_row<T, P, true, Res>(dx, dy, x, mean[row], rstd[row], w, row, C, lane, accumulate, sw, sb, r);
  __syncthreads();
  // The block's sums, its warps added in order (a warp past `warps` adds zeros).
  const std::int64_t blocks = gridDim.x;
  for (int i = static_cast<int>(threadIdx.x); i < kSums; i += static_cast<int>(blockDim.x)) {
    const int l = i % 32, p = i / 32 / W, k = i / 32 % W;
    const std::int64_t col = static_cast<std::int64_t>(p * 32 + l) * W + k;
    if (col >= C) continue;
    float a = sums[0][0][i], b = sums[0][1][i];
#pragma unroll
    for (int q = 1; q < kWarpRowsPerBlock; ++q) {
      a += sums[q][0][i];
      b += sums[q][1][i];
    }
    partial[static_cast<std::int64_t>(blockIdx.x) * C + col] = a;
    partial[(blocks + blockIdx.x) * C + col] = b;
  }
}

// The fused residual LayerNorm's epilogue over a whole tensor, from t (LayerNorm's input
// gradient with the sum's gradient added, in T): the rows too long for the warp kernels.
template <class T>
__global__ void residual_dropout_backward_kernel(T* __restrict__ dres, T* __restrict__ db, const T* __restrict__ t,
                                                 const std::uint8_t* __restrict__ mask, std::int64_t n, float scale,
                                                 bool acc_res, bool acc_b) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = to_float(t[i]);
    if (db != nullptr) detail::store1(db + i, mask == nullptr ? v : mask[i] != 0 ? __fmul_rn(v, scale) : 0.0f, acc_b);
    if (dres != nullptr) detail::store1(dres + i, v, acc_res);
  }
}

// The occupancy query is a driver call on every backward's host path (tens a step), and its
// answer depends only on the kernel and the device: asked once per device, kept per kernel,
// by the ordinal of the device current now (the one the query asks about and the kernel
// runs on). A device ordinal past the table is asked every time.
template <class T, int P>
std::int64_t one_wave_warps(const Context& ctx) {
  static std::array<std::atomic<int>, 64> resident_blocks{};  // 0: not asked yet
  int dev = -1;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  int blocks = dev >= 0 && dev < static_cast<int>(resident_blocks.size())
                   ? resident_blocks[static_cast<std::size_t>(dev)].load(std::memory_order_relaxed)
                   : 0;
  if (blocks == 0) {
    // The fused residual epilogue's instance holds more registers (bf16, 4 packs a lane: 115
    // against 96, 4 blocks an SM against 5): both take the warps both hold at once, so both
    // run in one wave and their parameters' gradients stay the same bits.
    int plain = 0, fused = 0;
    ZP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&plain, layernorm_backward_warp_kernel<T, P, false>,
                                                                32 * kWarpRowsPerBlock, 0));
    ZP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fused, layernorm_backward_warp_kernel<T, P, true>,
                                                                32 * kWarpRowsPerBlock, 0));
    blocks = std::max(1, std::min(plain, fused));
    if (dev >= 0 && dev < static_cast<int>(resident_blocks.size()))
      resident_blocks[static_cast<std::size_t>(dev)].store(blocks, std::memory_order_relaxed);
  }
  const std::int64_t resident = std::int64_t{blocks} * kWarpRowsPerBlock * ctx.sm_count();
  return std::max<std::int64_t>(128, resident / 128 * 128);
}

// The blocks' sums as the rows of a column reduction: v = (partial[0][r][c], partial[1][r][c]).
struct WarpPartials {
  const float* p;
  std::int64_t blocks, C;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[2]) const {
    v[0] = p[r * C + c];
    v[1] = p[(blocks + r) * C + c];
  }
};

// Warps of the one-pass LayerNorm backward: one per 4 rows, at most as many as the GPU holds
// at once (one_wave_warps). Their blocks' partial sums (8 bytes per column each, a block of
// kWarpRowsPerBlock warps) then weigh at most half a byte per element of dy, against the 4
// (16-bit) or 8 (fp32) of the second read of dy and x they replace.
constexpr std::int64_t kLayerNormBackwardRowsPerWarp = 4;

// The warps of layernorm_backward_warp_kernel<T, P, Res> resident at once on this GPU (the
// fewer of its plain and fused instances), in whole 128s: the kernel's warps then run in one
// wave. The fused instance, asked for the plain one's 2560 warps where it holds 2112 (bf16,
// 16384 × 1024 on an H100), took 0.103 ms against the plain LayerNorm's 0.058. Before that, the
// cap was 2048 warps: with the sums in registers (162 a thread at bf16, 4 packs a lane) an H100
// held 12 warps an SM, 1,584 in all, so 2048 ran in two waves, the second a quarter full. On an H100 (zeroplan_bench_cuda, GPT-2's
// 16384 × 768 rows, dx added into the residual's gradient) one wave of 1536 took 0.087 ms
// against 0.120 (16384 × 1024: 0.109 against 0.153). The parameters' gradients are sums in
// the warps' order, so their last bits follow the number of warps: the same on GPUs with the
// same SMs (an H100 SXM and an H200 have 132; an H100 PCIe 114), and
// ContextOptions::layernorm_backward_warps fixes it.
template <class T, int P>
std::int64_t one_wave_warps(const Context& ctx);

// Packs per lane of the warp kernels for rows of C elements (0: too long, the block kernels).
template <class T>
int warp_row_packs(std::int64_t C, int most) {
  const std::int64_t per_lane = detail::ceil_div(C / detail::kPack<T>, 32);
  for (int p = 1; p <= most; p *= 2)
    if (per_lane <= p) return p;
  return 0;
}

// launch(P) with P = packs as a compile-time constant (1, 2, 4 ... Most): the warp kernels'
// instances, one warp per row, kWarpRowsPerBlock rows per block.
template <int Most, class Launch>
void with_packs(int packs, Launch&& launch) {
  switch (packs) {
    case 1: launch(std::integral_constant<int, 1>{}); return;
    case 2: launch(std::integral_constant<int, 2>{}); return;
    case 4: launch(std::integral_constant<int, 4>{}); return;
    case 8:
      if constexpr (Most >= 8) {
        launch(std::integral_constant<int, 8>{});
        return;
      }
      break;
    default: break;
  }
  throw std::logic_error("norm: no warp kernel for " + std::to_string(packs) + " packs per lane");
}

template <class T>
struct LayerNormParamGrads {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  std::int64_t C;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[2]) const {
    const float d = to_float(dy[r * C + c]);
    v[0] = d * ((to_float(x[r * C + c]) - mean[r]) * rstd[r]);
    v[1] = d;
  }
};

// ------------------------------------------------------------------ RMSNorm pieces
template <class T, bool Vec>
__global__ void rms_rsqrt_forward_kernel(T* __restrict__ r, const T* __restrict__ sq, std::int64_t rows,
                                         std::int64_t C, float eps) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float s = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float v[W];
      load_f<T, W>(sq + row * C + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) s += v[k];
    }
    const float ms = block_sum(s, sm) / static_cast<float>(C);
    if (threadIdx.x == 0) r[row] = from_float<T>(1.0f / sqrtf(ms + eps));
  }
}

template <class T>
__global__ void rms_rsqrt_backward_kernel(T* __restrict__ dsq, const T* __restrict__ dr, const T* __restrict__ r,
                                          std::int64_t rows, std::int64_t C, bool accumulate) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * C;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = e / C;
    const float ri = to_float(r[i]);
    const float g = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(to_float(dr[i]), -0.5f), ri), ri), ri) * inv_c;
    detail::store1(dsq + e, g, accumulate);
  }
}

// y = x * r[row] (r may be the per-row scale of either dtype's storage).
template <class T>
__global__ void rowscale_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ r,
                                std::int64_t rows, std::int64_t C, bool accumulate) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * C;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    detail::store1(y + e, to_float(x[e]) * to_float(r[e / C]), accumulate);
}

// The same, kPack<T> elements (16 bytes) per thread and one division per pack, where every
// row starts aligned (C a multiple of the pack).
template <class T>
__global__ void rowscale_vec_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ r,
                                    std::int64_t rows, std::int64_t C, bool accumulate) {
  constexpr int W = detail::kPack<T>;
  const std::int64_t packs = C / W;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / packs, at = row * C + (i - row * packs) * W;
    const float s = to_float(r[row]);
    float v[W];
    load_f<T, W>(x + at, v);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = v[k] * s;
    detail::store_acc<T, W>(y + at, v, accumulate);
  }
}

template <class T>
void launch_rowscale(T* y, const T* x, const T* r, std::int64_t rows, std::int64_t C, bool accumulate, cudaStream_t stream) {
  if (rows_vec<T>(C, {y, x})) {
    rowscale_vec_kernel<T><<<detail::grid_for(rows * C / detail::kPack<T>, kElemBlock), kElemBlock, 0, stream>>>(
        y, x, r, rows, C, accumulate);
  } else {
    rowscale_kernel<T><<<detail::grid_for(rows * C, kElemBlock), kElemBlock, 0, stream>>>(y, x, r, rows, C, accumulate);
  }
  ZP_CUDA_CHECK_LAUNCH("rowscale_kernel");
}

// dr[i] = sum_j dy[i, j] * x[i, j], one block per row.
template <class T, bool Vec>
__global__ void row_dot_kernel(T* __restrict__ dr, const T* __restrict__ dy, const T* __restrict__ x,
                               std::int64_t rows, std::int64_t C, bool accumulate) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float s = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float d[W], v[W];
      load_f<T, W>(dy + row * C + j, d);
      load_f<T, W>(x + row * C + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) s += d[k] * v[k];
    }
    s = block_sum(s, sm);
    if (threadIdx.x == 0) detail::store1(dr + row, s, accumulate);
  }
}

// y = x * w[col].
template <class T>
__global__ void colscale_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                                std::int64_t rows, std::int64_t C, bool accumulate) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * C;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    detail::store1(y + e, to_float(x[e]) * to_float(w[e % C]), accumulate);
}

template <class T>
struct ProductColumns {  // dy * x
  const T* dy;
  const T* x;
  std::int64_t C;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[1]) const {
    v[0] = to_float(dy[r * C + c]) * to_float(x[r * C + c]);
  }
};

// ------------------------------------------------------------------ fused RMSNorm
template <class T, bool Vec>
__global__ void rmsnorm_forward_kernel(T* __restrict__ y, float* __restrict__ rstd, const T* __restrict__ x,
                                       const T* __restrict__ w, std::int64_t rows, std::int64_t C, float eps) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * C;
    float s = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float v[W];
      load_f<T, W>(xr + j, v);
#pragma unroll
      for (int k = 0; k < W; ++k) s += v[k] * v[k];
    }
    const float r = 1.0f / sqrtf(block_sum(s, sm) / static_cast<float>(C) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    ZP_ROW_LOOP(j, W, C) {
      float v[W], wv[W], o[W];
      load_f<T, W>(xr + j, v);
      load_f<T, W>(w + j, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) o[k] = wv[k] * to_float(from_float<T>(v[k] * r));
      detail::store_f<T, W>(y + row * C + j, o);
    }
  }
}

template <class T, bool Vec>
__global__ void rmsnorm_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                  const float* __restrict__ rstd, const T* __restrict__ w, std::int64_t rows,
                                  std::int64_t C, bool accumulate) {
  __shared__ float sm[33];
  constexpr int W = kWidth<T, Vec>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * C;
    const T* xr = x + row * C;
    const float r = rstd[row];
    float s = 0.0f;
    ZP_ROW_LOOP(j, W, C) {
      float d[W], v[W], wv[W];
      load_f<T, W>(dyr + j, d);
      load_f<T, W>(xr + j, v);
      load_f<T, W>(w + j, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) s += d[k] * wv[k] * v[k];
    }
    const float c3 = r * r * r * (block_sum(s, sm) / static_cast<float>(C));
    ZP_ROW_LOOP(j, W, C) {
      float d[W], v[W], wv[W], o[W];
      load_f<T, W>(dyr + j, d);
      load_f<T, W>(xr + j, v);
      load_f<T, W>(w + j, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) o[k] = r * (d[k] * wv[k]) - v[k] * c3;
      detail::store_acc<T, W>(dx + row * C + j, o, accumulate);
    }
  }
}

template <class T>
struct RmsNormWeightGrad {  // dy * round(x * r)
  const T* dy;
  const T* x;
  const float* rstd;
  std::int64_t C;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[1]) const {
    v[0] = to_float(dy[r * C + c]) * to_float(from_float<T>(to_float(x[r * C + c]) * rstd[r]));
  }
};

// kernel<T, true> on the 16-byte path, kernel<T, false> otherwise; one block per row.
#define ZP_LAUNCH_ROWS(kernel, vec, rows, C, ...)                                                   \
  do {                                                                                              \
    const dim3 block_ = row_block<T>((C), (vec));                                                   \
    if (vec)                                                                                        \
      kernel<T, true><<<detail::grid_for((rows), 1), block_, 0, stream>>>(__VA_ARGS__);             \
    else                                                                                            \
      kernel<T, false><<<detail::grid_for((rows), 1), block_, 0, stream>>>(__VA_ARGS__);            \
    ZP_CUDA_CHECK_LAUNCH(#kernel);                                                                  \
  } while (0)

}  // namespace

void layernorm_forward(void* y, float* mean, float* rstd, const void* x, const void* w, const void* b,
                       std::int64_t rows, std::int64_t C, float eps, DType dt, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  detail::dispatch(dt, "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(C, {y, x, w, b});
    if (const int packs = vec ? warp_row_packs<T>(C, 8) : 0; packs > 0) {
      with_packs<8>(packs, [&](auto P) {
        layernorm_forward_warp_kernel<T, decltype(P)::value>
            <<<detail::grid_for(rows, kWarpRowsPerBlock), 32 * kWarpRowsPerBlock, 0, stream>>>(
                static_cast<T*>(y), mean, rstd, static_cast<const T*>(x), static_cast<const T*>(w),
                static_cast<const T*>(b), rows, C, eps);
      });
      ZP_CUDA_CHECK_LAUNCH("layernorm_forward_warp_kernel");
      return;
    }
    ZP_LAUNCH_ROWS(layernorm_forward_kernel, vec, rows, C, static_cast<T*>(y), mean, rstd, static_cast<const T*>(x),
                   static_cast<const T*>(w), static_cast<const T*>(b), rows, C, eps);
  });
}

void layernorm_backward(Context& ctx, void* dx, void* dw, void* db, const void* dy, const void* x, const float* mean,
                        const float* rstd, const void* w, std::int64_t rows, std::int64_t C, bool accumulate, DType dt,
                        cudaStream_t stream) {
  layernorm_backward(ctx, dx, dw, db, dy, x, mean, rstd, w, rows, C, accumulate, accumulate, dt, stream);
}

namespace {

// The fused residual LayerNorm's epilogue, before its element type is known.
struct ResidualArgs {
  const void* ds = nullptr;
  void* dres = nullptr;
  void* db = nullptr;
  const std::uint8_t* mask = nullptr;
  float scale = 1.0f;
  bool acc_res = false, acc_b = false;
  void* scratch = nullptr;  // rows·C elements for the rows the warp kernels do not take
};

template <class T>
ResidualDropout<T> typed(const ResidualArgs* a) {
  if (a == nullptr) return {};
  return {static_cast<const T*>(a->ds), static_cast<T*>(a->dres), static_cast<T*>(a->db), a->mask, a->scale,
          a->acc_res, a->acc_b};
}

float keep_scale(float p) { return p <= 0.0f ? 1.0f : p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

// layernorm_backward with the input's gradient through the epilogue `res` where it is given
// (then dx is not written; the row kernels' dx goes to res->scratch first).
void layernorm_backward_impl(Context& ctx, void* dx, void* dw, void* db, const void* dy, const void* x,
                             const float* mean, const float* rstd, const void* w, std::int64_t rows, std::int64_t C,
                             bool accumulate_dx, bool accumulate_params, const ResidualArgs* res, DType dt,
                             cudaStream_t stream) {
  if (C <= 0) return;
  detail::dispatch(dt, "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const ResidualDropout<T> r = typed<T>(res);
    const bool fused = res != nullptr;
    const bool vec = fused ? kernels::dropout_add_layernorm_backward_warp_takes(
                                 C, static_cast<std::int64_t>(sizeof(T)), {dy, x, w, res->ds, res->dres, res->db},
                                 res->mask)
                           : rows_vec<T>(C, {dx, dy, x, w});
    const int packs = vec ? warp_row_packs<T>(C, 4) : 0;
    const bool params = dw != nullptr || db != nullptr;
    const bool gives_dx = dx != nullptr || (fused && (res->dres != nullptr || res->db != nullptr));
    // All three in one pass over dy and x: the warps' partial sums at the scratch's end, the
    // column reduction's own partials (at most 2·C floats per 32 warps) at its start.
    const bool one_pass = gives_dx && params && packs > 0 && rows > 0;
    std::int64_t cap = ctx.layernorm_backward_warps();
    if (cap == 0 && one_pass)
      with_packs<4>(packs, [&](auto P) { cap = one_wave_warps<T, decltype(P)::value>(ctx); });
    const std::int64_t warps = std::min(detail::ceil_div(rows, kLayerNormBackwardRowsPerWarp), std::max<std::int64_t>(cap, 1));
    const std::int64_t blocks = detail::ceil_div(warps, kWarpRowsPerBlock);
    const std::size_t mine = sizeof(float) * 2 * static_cast<std::size_t>(blocks * C);
    const std::size_t theirs =
        sizeof(float) * 2 * static_cast<std::size_t>(C * detail::ceil_div(blocks, detail::kColMinRows));
    if (one_pass && mine + theirs + 256 <= ctx.scratch_bytes()) {
      auto* base = static_cast<char*>(ctx.scratch(ctx.scratch_bytes(), "layernorm_backward"));
      auto* partial = reinterpret_cast<float*>(base + ((ctx.scratch_bytes() - mine) & ~std::size_t{255}));
      with_packs<4>(packs, [&](auto P) {
        auto launch = [&](auto kernel) {
          kernel<<<static_cast<unsigned>(blocks), 32 * kWarpRowsPerBlock, 0, stream>>>(
              static_cast<T*>(dx), partial, static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd,
              static_cast<const T*>(w), rows, C, warps, accumulate_dx, r);
        };
        if (fused) launch(layernorm_backward_warp_kernel<T, decltype(P)::value, true>);
        else launch(layernorm_backward_warp_kernel<T, decltype(P)::value, false>);
      });
      ZP_CUDA_CHECK_LAUNCH("layernorm_backward_warp_kernel");
      detail::column_reduce<T, 2>(ctx, detail::ColumnOutputs<T, 2>{{static_cast<T*>(dw), static_cast<T*>(db)}}, blocks,
                                  C, accumulate_params, WarpPartials{partial, blocks, C}, stream, "layernorm_backward");
      return;
    }
    if (gives_dx && rows > 0) {
      if (packs > 0) {
        with_packs<4>(packs, [&](auto P) {
          auto launch = [&](auto kernel) {
            kernel<<<detail::grid_for(rows, kWarpRowsPerBlock), 32 * kWarpRowsPerBlock, 0, stream>>>(
                static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd,
                static_cast<const T*>(w), rows, C, accumulate_dx, r);
          };
          if (fused) launch(layernorm_dx_warp_kernel<T, decltype(P)::value, true>);
          else launch(layernorm_dx_warp_kernel<T, decltype(P)::value, false>);
        });
        ZP_CUDA_CHECK_LAUNCH("layernorm_dx_warp_kernel");
      } else if (!fused) {
        ZP_LAUNCH_ROWS(layernorm_dx_kernel, vec, rows, C, static_cast<T*>(dx), static_cast<const T*>(dy),
                       static_cast<const T*>(x), mean, rstd, static_cast<const T*>(w), rows, C, accumulate_dx);
      } else {
        // Rows the warp kernels do not take: t = ds + dx made in the scratch (ds copied there,
        // dx added by the row kernel and rounded once, as the warp kernels do), then the epilogue.
        if (res->scratch == nullptr)
          throw std::logic_error("dropout_add_layernorm_backward: rows of " + std::to_string(C) +
                                 " elements need a scratch of rows·C elements");
        T* t = static_cast<T*>(res->scratch);
        const std::int64_t n = rows * C;
        const bool from_ds = res->ds != nullptr;
        if (from_ds) convert(t, dt, res->ds, dt, n, stream);
        const bool tv = rows_vec<T>(C, {t, dy, x, w});
        ZP_LAUNCH_ROWS(layernorm_dx_kernel, tv, rows, C, t, static_cast<const T*>(dy), static_cast<const T*>(x), mean,
                       rstd, static_cast<const T*>(w), rows, C, from_ds);
        residual_dropout_backward_kernel<T><<<detail::grid_for(n, kElemBlock), kElemBlock, 0, stream>>>(
            static_cast<T*>(res->dres), static_cast<T*>(res->db), t, res->mask, n, res->scale, res->acc_res,
            res->acc_b);
        ZP_CUDA_CHECK_LAUNCH("residual_dropout_backward_kernel");
      }
    }
    if (params)
      detail::column_reduce<T, 2>(
          ctx, detail::ColumnOutputs<T, 2>{{static_cast<T*>(dw), static_cast<T*>(db)}}, rows, C, accumulate_params,
          LayerNormParamGrads<T>{static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, C}, stream,
          "layernorm_backward");
  });
}

}  // namespace

void layernorm_backward(Context& ctx, void* dx, void* dw, void* db, const void* dy, const void* x, const float* mean,
                        const float* rstd, const void* w, std::int64_t rows, std::int64_t C, bool accumulate_dx,
                        bool accumulate_params, DType dt, cudaStream_t stream) {
  layernorm_backward_impl(ctx, dx, dw, db, dy, x, mean, rstd, w, rows, C, accumulate_dx, accumulate_params, nullptr, dt,
                          stream);
}

void dropout_add_layernorm_forward(void* y, float* mean, float* rstd, void* sum, std::uint8_t* mask, const void* b,
                                   const void* x, const void* w, const void* beta, std::int64_t rows, std::int64_t C,
                                   float eps, float p, std::uint64_t seed, std::uint64_t offset, DType dt,
                                   cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  const bool drop = p > 0.0f;
  if (drop && mask == nullptr) throw std::logic_error("dropout_add_layernorm_forward: p > 0 without a mask");
  bool fused = false;
  detail::dispatch(dt, "dropout_add_layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(C, {y, sum, b, x, w, beta}) && offset % 4 == 0 &&
                     (!drop || (reinterpret_cast<std::uintptr_t>(mask) & 7u) == 0);
    const int packs = vec ? warp_row_packs<T>(C, 8) : 0;
    if (packs == 0) return;
    with_packs<8>(packs, [&](auto P) {
      dropout_add_layernorm_warp_kernel<T, decltype(P)::value>
          <<<detail::grid_for(rows, kWarpRowsPerBlock), 32 * kWarpRowsPerBlock, 0, stream>>>(
              static_cast<T*>(y), mean, rstd, static_cast<T*>(sum), drop ? mask : nullptr, static_cast<const T*>(b),
              static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(beta), rows, C, eps, 1.0f - p,
              keep_scale(p), seed, offset);
    });
    ZP_CUDA_CHECK_LAUNCH("dropout_add_layernorm_warp_kernel");
    fused = true;
  });
  if (fused) return;
  // Rows the warp kernel does not take: the chain's kernels, the dropout's output through y (free
  // until the norm writes it).
  const std::int64_t n = rows * C;
  if (drop) {
    dropout_forward(y, mask, b, n, p, seed, offset, dt, stream);
    add_forward(sum, y, x, n, dt, stream);
  } else {
    add_forward(sum, b, x, n, dt, stream);
  }
  layernorm_forward(y, mean, rstd, sum, w, beta, rows, C, eps, dt, stream);
}

void dropout_add_layernorm_backward(Context& ctx, void* db, void* dres, void* dw, void* dbeta, const void* dy,
                                    const void* ds, const void* sum, const std::uint8_t* mask, const float* mean,
                                    const float* rstd, const void* w, std::int64_t rows, std::int64_t C, float p,
                                    bool accumulate_b, bool accumulate_res, void* scratch, DType dt,
                                    cudaStream_t stream) {
  if (p > 0.0f && mask == nullptr) throw std::logic_error("dropout_add_layernorm_backward: p > 0 without a mask");
  ResidualArgs a;
  a.ds = ds;
  a.dres = dres;
  a.db = db;
  a.mask = p > 0.0f ? mask : nullptr;
  a.scale = keep_scale(p);
  a.acc_res = accumulate_res;
  a.acc_b = accumulate_b;
  a.scratch = scratch;
  layernorm_backward_impl(ctx, nullptr, dw, dbeta, dy, sum, mean, rstd, w, rows, C, false, true, &a, dt, stream);
}

void rms_rsqrt_forward(void* r, const void* sq, std::int64_t rows, std::int64_t C, float eps, DType dt,
                       cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  detail::dispatch(dt, "rms_rsqrt_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(C, {sq});
    ZP_LAUNCH_ROWS(rms_rsqrt_forward_kernel, vec, rows, C, static_cast<T*>(r), static_cast<const T*>(sq), rows, C,
                   eps);
  });
}

void rms_rsqrt_backward(void* dsq, const void* dr, const void* r, std::int64_t rows, std::int64_t C, bool accumulate,
                        DType dt, cudaStream_t stream) {
  if (rows * C <= 0) return;
  detail::dispatch(dt, "rms_rsqrt_backward", [&](auto tag) {
    using T = decltype(tag);
    rms_rsqrt_backward_kernel<T><<<detail::grid_for(rows * C, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<T*>(dsq), static_cast<const T*>(dr), static_cast<const T*>(r), rows, C, accumulate);
    ZP_CUDA_CHECK_LAUNCH("rms_rsqrt_backward_kernel");
  });
}

void mul_rowscale_forward(void* y, const void* x, const void* r, std::int64_t rows, std::int64_t C, DType dt,
                          cudaStream_t stream) {
  if (rows * C <= 0) return;
  detail::dispatch(dt, "mul_rowscale_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_rowscale(static_cast<T*>(y), static_cast<const T*>(x), static_cast<const T*>(r), rows, C, false, stream);
  });
}

void mul_rowscale_backward(void* dx, void* dr, const void* dy, const void* x, const void* r, std::int64_t rows,
                           std::int64_t C, bool accumulate, DType dt, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  detail::dispatch(dt, "mul_rowscale_backward", [&](auto tag) {
    using T = decltype(tag);
    if (dx != nullptr)
      launch_rowscale(static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(r), rows, C, accumulate, stream);
    if (dr != nullptr) {
      const bool vec = rows_vec<T>(C, {dy, x});
      ZP_LAUNCH_ROWS(row_dot_kernel, vec, rows, C, static_cast<T*>(dr), static_cast<const T*>(dy),
                     static_cast<const T*>(x), rows, C, accumulate);
    }
  });
}

void mul_weight_forward(void* y, const void* x, const void* w, std::int64_t rows, std::int64_t C, DType dt,
                        cudaStream_t stream) {
  if (rows * C <= 0) return;
  detail::dispatch(dt, "mul_weight_forward", [&](auto tag) {
    using T = decltype(tag);
    colscale_kernel<T><<<detail::grid_for(rows * C, kElemBlock), kElemBlock, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), static_cast<const T*>(w), rows, C, false);
    ZP_CUDA_CHECK_LAUNCH("colscale_kernel");
  });
}

void mul_weight_backward(Context& ctx, void* dx, void* dw, const void* dy, const void* x, const void* w,
                         std::int64_t rows, std::int64_t C, bool accumulate, DType dt, cudaStream_t stream) {
  if (C <= 0) return;
  detail::dispatch(dt, "mul_weight_backward", [&](auto tag) {
    using T = decltype(tag);
    if (dx != nullptr && rows > 0) {
      colscale_kernel<T><<<detail::grid_for(rows * C, kElemBlock), kElemBlock, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(w), rows, C, accumulate);
      ZP_CUDA_CHECK_LAUNCH("colscale_kernel");
    }
    if (dw != nullptr)
      detail::column_reduce<T, 1>(ctx, detail::ColumnOutputs<T, 1>{{static_cast<T*>(dw)}}, rows, C, accumulate,
                                  ProductColumns<T>{static_cast<const T*>(dy), static_cast<const T*>(x), C}, stream,
                                  "mul_weight_backward");
  });
}

void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, std::int64_t rows, std::int64_t C, float eps,
                     DType dt, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  detail::dispatch(dt, "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = rows_vec<T>(C, {y, x, w});
    ZP_LAUNCH_ROWS(rmsnorm_forward_kernel, vec, rows, C, static_cast<T*>(y), rstd, static_cast<const T*>(x),
                   static_cast<const T*>(w), rows, C, eps);
  });
}

void rmsnorm_backward(Context& ctx, void* dx, void* dw, const void* dy, const void* x, const float* rstd,
                      const void* w, std::int64_t rows, std::int64_t C, bool accumulate, DType dt,
                      cudaStream_t stream) {
  if (C <= 0) return;
  detail::dispatch(dt, "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    if (dx != nullptr && rows > 0) {
      const bool vec = rows_vec<T>(C, {dx, dy, x, w});
      ZP_LAUNCH_ROWS(rmsnorm_dx_kernel, vec, rows, C, static_cast<T*>(dx), static_cast<const T*>(dy),
                     static_cast<const T*>(x), rstd, static_cast<const T*>(w), rows, C, accumulate);
    }
    if (dw != nullptr)
      detail::column_reduce<T, 1>(ctx, detail::ColumnOutputs<T, 1>{{static_cast<T*>(dw)}}, rows, C, accumulate,
                                  RmsNormWeightGrad<T>{static_cast<const T*>(dy), static_cast<const T*>(x), rstd, C},
                                  stream, "rmsnorm_backward");
  });
}

}  // namespace zp::kernels::cuda
