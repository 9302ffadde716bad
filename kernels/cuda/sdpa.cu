#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common/philox.hpp"
#include "kernels/common/sdpa_dims.hpp"
#include "kernels/cuda/detail.cuh"
#include "kernels/cuda/sdpa.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::from_float;
using detail::to_float;

constexpr int kTile = 64;  // rows of Q, K, V, dO per shared-memory tile
constexpr int kWarps = 4;  // each warp owns 16 rows of the block's tile
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 16;  // backward: columns per inner step

// Shared-memory rows padded so that a warp's fragment loads hit 32 different banks.
template <class T>
constexpr int kPad = sizeof(T) == 2 ? 8 : 4;
template <class T, int D>
constexpr int kLd = D + kPad<T>;  // Q, K, V, dO tiles
template <class T>
constexpr int kPLd = kTile + kPad<T>;  // forward: each warp's 16 × 64 probabilities
template <class T>
constexpr int kCLd = kChunk + kPad<T>;  // backward: each warp's 16 × 16 P and dS

// ------------------------------------------------------------------ warp tile products
// A warp's 16 × 8 fp32 tile C (lane = 4·g + t holds C[g][2t], C[g][2t+1], C[g+8][2t],
// C[g+8][2t+1], the mma.sync accumulator layout) += A (16 × 16) · B (16 × 8).
__device__ __forceinline__ std::uint32_t ld32(const void* p) { return *static_cast<const std::uint32_t*>(p); }

// 16-bit operands on the tensor cores: m16n8k16, A and B as packed fragment registers.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                         std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, detail::bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  (void)c, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();  // 16-bit tensor-core products need sm_80 or newer
#endif
}

// fp32 operands on the CUDA cores (exact fp32 products, no TF32), in the same C layout: A
// row-major in shared memory (a[i·lda + k]); B "NK" (b[n·ldb + k]: rows of K, V, Q or dO
// when the product is against their transpose) or "KN" (b[k·ldb + n]).
template <bool NK>
__device__ __forceinline__ void fma_tile(float (&c)[4], const float* a, int lda, const float* b, int ldb) {
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    const float a0 = a[g * lda + kk], a1 = a[(g + 8) * lda + kk];
    const float b0 = NK ? b[(2 * t) * ldb + kk] : b[kk * ldb + 2 * t];
    const float b1 = NK ? b[(2 * t + 1) * ldb + kk] : b[kk * ldb + 2 * t + 1];
    c[0] = fmaf(a0, b0, c[0]);
    c[1] = fmaf(a0, b1, c[1]);
    c[2] = fmaf(a1, b0, c[2]);
    c[3] = fmaf(a1, b1, c[3]);
  }
}

// ------------------------------------------------------------------ 16-bit fragments
// The 16-bit path keeps its operands in registers as mma.sync fragments: Q (or the block's
// K and V in the dK/dV kernel) loaded once per block, P and dS converted from the
// accumulator layout of one product to the A-operand layout of the next without going
// through shared memory (the C fragments of two adjacent n-tiles are exactly the A
// fragment of a 16-wide k-step), and B operands stored [k][n] read with ldmatrix.trans.
__device__ __forceinline__ int lane_g() { return static_cast<int>((threadIdx.x & 31) >> 2); }
__device__ __forceinline__ int lane_t() { return static_cast<int>(threadIdx.x & 3); }

// A fragment of the 16 × 16 block at s (row-major, ld elements per row).
template <class T>
__device__ __forceinline__ void frag_a(std::uint32_t (&a)[4], const T* s, int ld) {
  const int g = lane_g(), t = lane_t();
  a[0] = ld32(s + g * ld + 2 * t);
  a[1] = ld32(s + (g + 8) * ld + 2 * t);
  a[2] = ld32(s + g * ld + 2 * t + 8);
  a[3] = ld32(s + (g + 8) * ld + 2 * t + 8);
}

// Four 8 × 8 matrices of 16-bit elements from shared memory, each lane giving the address of
// one row (lanes 8i .. 8i + 7: matrix i), transposed on the way when Trans.
template <bool Trans, class T>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const T* row) {
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// B fragments of two adjacent 16 (k) × 8 (n) blocks stored [n][k] at s (16 rows of K, V, Q
// or dO): the first n-tile's in r[0], r[1], the next's in r[2], r[3]; one ldmatrix for what
// would take two 32-bit loads per n-tile and lane.
template <class T>
__device__ __forceinline__ void frag_b_nk2(std::uint32_t (&r)[4], const T* s, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31), mi = lane >> 3;
  const T* row = s + ((mi >> 1) * 8 + (lane & 7)) * ld + (mi & 1) * 8;
  ldmatrix_x4<false>(r, row);
}

// B fragments of two adjacent 16 (k) × 8 (n) blocks stored [k][n] at s: the first in r[0],
// r[1], the next 8 columns in r[2], r[3] (four 8 × 8 matrices, transposed on the way).
template <class T>
__device__ __forceinline__ void frag_b_kn2(std::uint32_t (&r)[4], const T* s, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31), mi = lane >> 3;
  const T* row = s + ((mi & 1) * 8 + (lane & 7)) * ld + (mi >> 1) * 8;
  ldmatrix_x4<true>(r, row);
}

// The A fragment of the 16 (m) × 16 (k) block stored [k][m] at s (dS of 16 queries × 16 keys
// where it is stored key-major): four 8 × 8 matrices, transposed on the way.
template <class T>
__device__ __forceinline__ void frag_a_trans(std::uint32_t (&a)[4], const T* s, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31), mi = lane >> 3;
  const T* row = s + ((mi >> 1) * 8 + (lane & 7)) * ld + (mi & 1) * 8;
  ldmatrix_x4<true>(a, row);
}

// Two fp32 values rounded to T and packed (lo in the low half), as an mma operand register.
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  std::uint32_t r;
  if constexpr (std::is_same_v<T, detail::bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

// The accumulators of n-tiles c0 (columns 0-7) and c1 (8-15) as the A fragment of a 16 × 16
// block: a[0] = row g cols 2t, 2t+1; a[1] = row g+8; a[2], a[3] the same 8 columns on.
template <class T>
__device__ __forceinline__ void c_to_a(std::uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  mma16816<T>(c, a[0], a[1], a[2], a[3], b0, b1);
}

// c0 += a · (the first 8 columns of the 16 × 16 B block at s), c1 += a · (the next 8): B
// stored [n][k] (NK: rows of K, V, Q or dO against their transpose) or [k][n].
template <class T, bool NK>
__device__ __forceinline__ void mma2(float (&c0)[4], float (&c1)[4], const std::uint32_t (&a)[4], const T* s, int ld) {
  std::uint32_t b[4];
  if constexpr (NK) frag_b_nk2(b, s, ld);
  else frag_b_kn2(b, s, ld);
  mma<T>(c0, a, b[0], b[1]);
  mma<T>(c1, a, b[2], b[3]);
}

// ------------------------------------------------------------------ helpers
// s[r][0, D) = g[(row0 + r)·D + ...] for r < kTile, zeros past the sequence's end.
template <class T, int D>
__device__ __forceinline__ void load_tile(T* s, const T* g, std::int64_t row0, std::int64_t T_, bool vec) {
  constexpr int LD = kLd<T, D>;
  if (vec) {
    constexpr int E = static_cast<int>(16 / sizeof(T));
    constexpr int kPerRow = D / E;
    for (int c = static_cast<int>(threadIdx.x); c < kTile * kPerRow; c += static_cast<int>(blockDim.x)) {
      const int r = c / kPerRow, cc = (c % kPerRow) * E;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (row0 + r < T_) val = *reinterpret_cast<const uint4*>(g + (row0 + r) * D + cc);
      *reinterpret_cast<uint4*>(s + r * LD + cc) = val;
    }
  } else {
    for (int c = static_cast<int>(threadIdx.x); c < kTile * D; c += static_cast<int>(blockDim.x)) {
      const int r = c / D, cc = c % D;
      s[r * LD + cc] = row0 + r < T_ ? g[(row0 + r) * D + cc] : from_float<T>(0.0f);
    }
  }
}

// The same tile by cp.async (16-byte copies that bypass the registers and land while the
// warps compute on the other buffer; rows past the sequence's end are zero-filled), on the
// vectorised path; element by element otherwise (visible after the next __syncthreads).
// Committed as one group by the caller.
__device__ __forceinline__ void cp_async16(void* s, const void* g, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(s));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(g), "r"(valid ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(s) = valid ? *static_cast<const uint4*>(g) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

template <class T, int D>
__device__ __forceinline__ void load_tile_async(T* s, const T* g, std::int64_t row0, std::int64_t T_, bool vec) {
  if (!vec) {
    load_tile<T, D>(s, g, row0, T_, false);
    return;
  }
  constexpr int LD = kLd<T, D>;
  constexpr int E = static_cast<int>(16 / sizeof(T));
  constexpr int kPerRow = D / E;
  for (int c = static_cast<int>(threadIdx.x); c < kTile * kPerRow; c += static_cast<int>(blockDim.x)) {
    const int r = c / kPerRow, cc = (c % kPerRow) * E;
    const bool valid = row0 + r < T_;
    cp_async16(s + r * LD + cc, valid ? g + (row0 + r) * D + cc : g, valid);
  }
}

// e^x as 2^(x·log2 e) on the special-function unit (ex2.approx: about 2 ulp, subnormal
// results flushed to 0), where expf costs several instructions more per probability. The
// argument is always a difference (score − running max or logsumexp), so the masks'
// dtype-lowest values never overflow the product.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * kLog2e));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Attention's dropout draws (kernels/common/philox.hpp, attention_dropout): a thread's
// probabilities of one 16 x 16 tile come from one Philox block of their patch (forward and
// dQ: the queries' parity is the thread's; dK/dV: both parities, the other block from the
// lane holding the neighbouring key, 4 lanes away).
namespace ad = philox::attention_dropout;

__device__ __forceinline__ float keep_factor(const philox::Block& b, std::uint32_t qp, std::uint32_t kp, float thresh,
                                             float drop_scale) {
  return ad::unit(ad::draw(b, qp, kp)) < thresh ? drop_scale : 0.0f;
}

// The partner lane's block (lane ^ 4: the same queries, the key of the other parity).
__device__ __forceinline__ philox::Block partner_block(const philox::Block& own) {
  philox::Block other;
#pragma unroll
  for (int w = 0; w < 4; ++w) other.w[w] = __shfl_xor_sync(0xffffffffu, own.w[w], 4);
  return other;
}

struct Args {
  std::int64_t H, T;
  bool causal, vec;
  bool add_q, add_k, add_v;  // the backward adds into dq, dk, dv (else writes them)
  bool atomic_dq;            // one pass: dQ's sums by atomic adds, in no fixed order
  float scale, p, thresh, drop_scale;
  std::uint64_t seed, offset;
};

template <class T>
constexpr bool kTensor = !std::is_same_v<T, float>;  // 16-bit: tensor cores, operands in registers

// Shared memory of each kernel (bytes): floats first, then the tiles. The tiles streamed
// over the loop (K and V forward and for dQ; Q and dO for dK/dV) and their per-key or
// per-query floats have S buffers: with S = 2 the next tile's copies are in flight while the
// warps compute on the current one; S = 1 where two buffers exceed what the GPU gives a
// block (fp32, and D = 128 below Hopper).
template <class T, int D, int S>
constexpr std::size_t kForwardSmem = S * kTile * sizeof(float) +
                                     ((1 + 2 * S) * kTile * kLd<T, D> + (kTensor<T> ? 0 : kWarps * 16 * kPLd<T>)) *
                                         sizeof(T);
template <class T, int D, int S>
constexpr std::size_t kDqSmem = S * kTile * sizeof(float) +
                                ((2 + 2 * S) * kTile * kLd<T, D> + (kTensor<T> ? 0 : kWarps * 16 * kCLd<T>)) *
                                    sizeof(T);
template <class T, int D, int S>
constexpr std::size_t kDkDvSmem = 2 * S * kTile * sizeof(float) +
                                  ((2 + 2 * S) * kTile * kLd<T, D> + (kTensor<T> ? 0 : kWarps * 2 * 16 * kCLd<T>)) *
                                      sizeof(T);

// The one-pass backward's dSᵀ tile (64 keys × 64 queries, key-major), after the dK/dV kernel's.
template <class T>
constexpr int kDsLd = kTile + kPad<T>;
template <class T>
constexpr std::size_t kDsSmem = kTile * kDsLd<T> * sizeof(T);

// The top of a pipelined loop over tiles first .. tiles - 1: with two buffers, tile kb + 1's
// copies are issued and tile kb's awaited; with one, tile kb's are issued (the previous
// iteration's closing __syncthreads freed the buffer) and awaited. The caller issued tile
// `first` before the loop and syncs after this.
template <int S, class Issue>
__device__ __forceinline__ void next_tile(int kb, int first, int tiles, Issue&& issue) {
  if constexpr (S == 2) {
    if (kb + 1 < tiles) {
      issue(kb + 1);
      cp_async_wait<1>();
      return;
    }
  } else {
    if (kb > first) issue(kb);
  }
  cp_async_wait<0>();
}

// The grid is (batch · head, tile): consecutive blocks are the same tile of different heads,
// so that under a causal mask every head's longest tiles (the last queries forward and for
// dQ, the first keys for dK/dV) start first and the short ones fill the tail.
__device__ __forceinline__ int tile_of_block(bool longest_last, bool causal) {
  const int y = static_cast<int>(blockIdx.y);
  return causal && longest_last ? static_cast<int>(gridDim.y) - 1 - y : y;
}

// Scores of one tile in place: s · scale (+ the key's mask), −inf where the key is past the
// sequence or (causal) after the query. Only a tile that crosses the diagonal or the
// sequence's end checks positions (kEdge); the others are a multiply (and an add).
template <bool kEdge, bool kMask, int N>
__device__ __forceinline__ void score_tile(float (&s)[N][4], const float* mask_s, int col0, float scale, int k0,
                                           const int (&rows)[2], int T_, bool causal, float (&mx)[2]) {
  const int t = lane_t();
#pragma unroll
  for (int nt = 0; nt < N; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + nt * 8 + 2 * t + (e & 1);
      float x = s[nt][e] * scale;
      if constexpr (kMask) x += mask_s[col];
      if constexpr (kEdge) {
        const int j = k0 + col;
        if (j >= T_ || (causal && j > rows[e >> 1])) x = -INFINITY;
      }
      s[nt][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
}

// score_tile with its position checks and mask chosen per tile (both are uniform over it).
template <int N>
__device__ __forceinline__ void scores(float (&s)[N][4], bool edge, bool has_mask, const float* mask_s, int col0,
                                       float scale, int k0, const int (&rows)[2], int T_, bool causal,
                                       float (&mx)[2]) {
  if (edge) {
    if (has_mask) score_tile<true, true>(s, mask_s, col0, scale, k0, rows, T_, causal, mx);
    else score_tile<true, false>(s, mask_s, col0, scale, k0, rows, T_, causal, mx);
  } else {
    if (has_mask) score_tile<false, true>(s, mask_s, col0, scale, k0, rows, T_, causal, mx);
    else score_tile<false, false>(s, mask_s, col0, scale, k0, rows, T_, causal, mx);
  }
}

// The forward's and dQ's copies of key tile kb: K and V into buffer kb % S of `kvs` ([S][K, V]
// tiles) by cp.async (committed as one group), the keys' mask floats into mask_s[kb % S].
template <class T, int D, int S>
__device__ __forceinline__ void issue_kv(T* kvs, float* mask_s, const T* k, const T* v, const T* mask,
                                         std::int64_t head, std::int64_t b, int kb, const Args& args) {
  constexpr int LD = kLd<T, D>;
  const int k0 = kb * kTile, T_ = static_cast<int>(args.T);
  T* ks = kvs + (kb % S) * 2 * kTile * LD;
  load_tile_async<T, D>(ks, k + head, k0, T_, args.vec);
  load_tile_async<T, D>(ks + kTile * LD, v + head, k0, T_, args.vec);
  cp_async_commit();
  if (mask != nullptr)
    for (int c = static_cast<int>(threadIdx.x); c < kTile; c += static_cast<int>(blockDim.x))
      mask_s[(kb % S) * kTile + c] = k0 + c < T_ ? to_float(mask[b * args.T + k0 + c]) : 0.0f;
}

// ------------------------------------------------------------------ forward
// Block (head x, query tile y); warp w owns rows q0 + 16w .. q0 + 16w + 15. Online softmax
// over 64-key tiles: running max m and sum l per row, O rescaled when the max moves.
template <class T, int D, int S>
__global__ void __launch_bounds__(kThreads) sdpa_forward_kernel(T* __restrict__ o, float* __restrict__ lse,
                                                               const T* __restrict__ q, const T* __restrict__ k,
                                                               const T* __restrict__ v, const T* __restrict__ mask,
                                                               Args args) {
  constexpr int LD = kLd<T, D>, PLD = kPLd<T>, NT = D / 8, KS = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  float* mask_s = reinterpret_cast<float*>(smem);  // [S][kTile]
  T* qs = reinterpret_cast<T*>(smem + S * kTile * sizeof(float));
  T* kvs = qs + kTile * LD;  // [S][K, V]
  [[maybe_unused]] T* pw = kvs + 2 * S * kTile * LD + (threadIdx.x >> 5) * 16 * PLD;  // fp32 path: this warp's P
  const int warp = static_cast<int>(threadIdx.x >> 5), g = lane_g(), t = lane_t();
  const int T_ = static_cast<int>(args.T);
  const std::int64_t bh = blockIdx.x, b = bh / args.H;
  const int q0 = tile_of_block(true, args.causal) * kTile;
  const std::int64_t head = bh * args.T * D;
  const bool has_mask = mask != nullptr;
  auto issue = [&](int kb) { issue_kv<T, D, S>(kvs, mask_s, k, v, mask, head, b, kb, args); };
  const int key_end = args.causal ? min(q0 + kTile, T_) : T_;
  const int tiles = (key_end + kTile - 1) / kTile;
  issue(0);
  load_tile<T, D>(qs, q + head, q0, T_, args.vec);
  __syncthreads();
  [[maybe_unused]] std::uint32_t qf[kTensor<T> ? KS : 1][4];
  if constexpr (kTensor<T>) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) frag_a(qf[kk], qs + (warp * 16) * LD + kk * 16, LD);
  }
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  for (int kb = 0; kb < tiles; ++kb) {
    const int k0 = kb * kTile;
    next_tile<S>(kb, 0, tiles, issue);
    __syncthreads();  // tile kb has landed for every thread's copies
    const T* ks = kvs + (kb % S) * 2 * kTile * LD;
    const T* vs = ks + kTile * LD;
    const float* mk = mask_s + (kb % S) * kTile;

    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2) {
        if constexpr (kTensor<T>) {
          mma2<T, true>(s[nt], s[nt + 1], qf[kk], ks + (nt * 8) * LD + kk * 16, LD);
        } else {
#pragma unroll
          for (int n2 = nt; n2 < nt + 2; ++n2)
            fma_tile<true>(s[n2], qs + (warp * 16) * LD + kk * 16, LD, ks + (n2 * 8) * LD + kk * 16, LD);
        }
      }

    float mx[2] = {-INFINITY, -INFINITY};
    const bool edge = (args.causal && k0 + kTile > q0) || k0 + kTile > T_;
    scores(s, edge, has_mask, mk, 0, args.scale, k0, rows, T_, args.causal, mx);
    float alpha[2], mu[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      mu[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing unmasked yet stays at 0
      alpha[r] = exp_fast(m[r] - mu[r]);
      m[r] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp_fast(s[nt][e] - mu[e >> 1]);
        rs[e >> 1] += pe;
        s[nt][e] = pe;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(rs[r]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] *= alpha[e >> 1];

    // Dropout on P (the normaliser l above is taken before it, as the CPU's P).
    if (args.p > 0.0f) {
      const std::int64_t gi = ad::group(rows[0]);  // rows[1] = rows[0] + 8: the same group
#pragma unroll
      for (int kg = 0; kg < 4; ++kg) {  // the tile's 16-key groups: n-tiles 2kg, 2kg + 1
        const std::int64_t j0 = k0 + kg * 16 + 2 * t;
        const philox::Block blk = ad::block(args.seed, args.offset, bh, args.T, gi, ad::group(j0),
                                            ad::place(rows[0]) & 1u);
#pragma unroll
        for (int n2 = 0; n2 < 2; ++n2)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[2 * kg + n2][e] *= keep_factor(blk, ad::place(rows[e >> 1]), ad::place(j0 + n2 * 8 + (e & 1)),
                                            args.thresh, args.drop_scale);
      }
    }
    if constexpr (kTensor<T>) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        std::uint32_t pa[4];
        c_to_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
          mma2<T, false>(acc[nt], acc[nt + 1], pa, vs + (kk * 16) * LD + nt * 8, LD);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          pw[(g + 8 * half) * PLD + nt * 8 + 2 * t] = s[nt][2 * half];
          pw[(g + 8 * half) * PLD + nt * 8 + 2 * t + 1] = s[nt][2 * half + 1];
        }
      __syncwarp();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) fma_tile<false>(acc[nt], pw + kk * 16, PLD, vs + (kk * 16) * LD + nt * 8, LD);
      __syncwarp();
    }
    __syncthreads();  // every warp is done with buffer kb % S before tile kb + S is copied into it
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = rows[half];
    if (i >= T_) continue;
    const float inv = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      T* dst = o + head + static_cast<std::int64_t>(i) * D + nt * 8 + 2 * t;
      dst[0] = from_float<T>(acc[nt][2 * half] * inv);
      dst[1] = from_float<T>(acc[nt][2 * half + 1] * inv);
    }
    if (t == 0) lse[bh * args.T + i] = m[half] + logf(l[half]);
  }
}

// ------------------------------------------------------------------ backward
template <class T>
constexpr bool DsScaled = std::is_same_v<T, detail::fp16>;

// dvec[row] = sum_d dO[row, d] · O[row, d] (= sum_j P_ij dP_ij), one warp per row.
template <class T, int D>
__global__ void row_terms_kernel(float* __restrict__ dvec, const T* __restrict__ dout, const T* __restrict__ o,
                                 std::int64_t rows) {
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (row >= rows) return;  // whole warps
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) s += to_float(dout[row * D + d]) * to_float(o[row * D + d]);
  s = detail::warp_sum(s);
  if (lane == 0) dvec[row] = s;
}

// dQ: block (head x, query tile y), warp w owns 16 query rows; over 64-key tiles in 16-key
// steps: S and dP recomputed, dS = P ∘ (dP ∘ keep − dvec), dQ += scale · dS K (the scale
// applied once to the sum, or to dS in fp16).
template <class T, int D, int S, int C>
__global__ void __launch_bounds__(kThreads) sdpa_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout,
                                                          const T* __restrict__ q, const T* __restrict__ k,
                                                          const T* __restrict__ v, const float* __restrict__ lse,
                                                          const float* __restrict__ dvec, const T* __restrict__ mask,
                                                          Args args) {
  constexpr int LD = kLd<T, D>, CLD = kCLd<T>, NT = D / 8, KS = D / 16, NC = C / 8;
  static_assert(C == kChunk || (kTensor<T> && C == 2 * kChunk), "steps of 16, or 32 on the tensor cores");
  extern __shared__ __align__(16) unsigned char smem[];
  float* mask_s = reinterpret_cast<float*>(smem);  // [S][kTile]
  T* qs = reinterpret_cast<T*>(smem + S * kTile * sizeof(float));
  T* dos = qs + kTile * LD;
  T* kvs = dos + kTile * LD;  // [S][K, V]
  [[maybe_unused]] T* dsw = kvs + 2 * S * kTile * LD + (threadIdx.x >> 5) * 16 * CLD;  // fp32 path: this warp's dS
  const int warp = static_cast<int>(threadIdx.x >> 5), g = lane_g(), t = lane_t();
  const int T_ = static_cast<int>(args.T);
  const std::int64_t bh = blockIdx.x, b = bh / args.H;
  const int q0 = tile_of_block(true, args.causal) * kTile;
  const std::int64_t head = bh * args.T * D;
  const bool has_mask = mask != nullptr;
  // bf16 and fp32 apply the scale once to the sums; fp16 keeps it in dS, whose range it
  // needs (unscaled, dS is 1/scale larger and would overflow 65504 sooner).
  const float ds_scale = DsScaled<T> ? args.scale : 1.0f, sum_scale = DsScaled<T> ? 1.0f : args.scale;
  auto issue = [&](int kb) { issue_kv<T, D, S>(kvs, mask_s, k, v, mask, head, b, kb, args); };
  const int key_end = args.causal ? min(q0 + kTile, T_) : T_;
  const int tiles = (key_end + kTile - 1) / kTile;
  issue(0);
  load_tile<T, D>(qs, q + head, q0, T_, args.vec);
  load_tile<T, D>(dos, dout + head, q0, T_, args.vec);
  __syncthreads();
  [[maybe_unused]] std::uint32_t qf[kTensor<T> ? KS : 1][4], dof[kTensor<T> ? KS : 1][4];
  if constexpr (kTensor<T>) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      frag_a(qf[kk], qs + (warp * 16) * LD + kk * 16, LD);
      frag_a(dof[kk], dos + (warp * 16) * LD + kk * 16, LD);
    }
  }
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float L[2], Dv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = rows[r] < T_ ? lse[bh * args.T + rows[r]] : 0.0f;
    Dv[r] = rows[r] < T_ ? dvec[bh * args.T + rows[r]] : 0.0f;
  }
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  for (int kb = 0; kb < tiles; ++kb) {
    const int k0 = kb * kTile;
    next_tile<S>(kb, 0, tiles, issue);
    __syncthreads();
    const T* ks = kvs + (kb % S) * 2 * kTile * LD;
    const T* vs = ks + kTile * LD;
    const float* mk = mask_s + (kb % S) * kTile;
    const bool edge = (args.causal && k0 + kTile > q0) || k0 + kTile > T_;
    for (int kc = 0; kc < kTile; kc += C) {
      if (args.causal && k0 + kc > q0 + warp * 16 + 15) continue;  // the whole step is above the diagonal
      float s[NC][4], dp[NC][4];
#pragma unroll
      for (int nt = 0; nt < NC; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        if constexpr (kTensor<T>) {
#pragma unroll
          for (int nt = 0; nt < NC; nt += 2) {
            mma2<T, true>(s[nt], s[nt + 1], qf[kk], ks + (kc + nt * 8) * LD + kk * 16, LD);
            mma2<T, true>(dp[nt], dp[nt + 1], dof[kk], vs + (kc + nt * 8) * LD + kk * 16, LD);
          }
        } else {
#pragma unroll
          for (int nt = 0; nt < NC; ++nt) {
            fma_tile<true>(s[nt], qs + (warp * 16) * LD + kk * 16, LD, ks + (kc + nt * 8) * LD + kk * 16, LD);
            fma_tile<true>(dp[nt], dos + (warp * 16) * LD + kk * 16, LD, vs + (kc + nt * 8) * LD + kk * 16, LD);
          }
        }
      }
      // Scores (−inf where masked out), then dS in place of S.
      float unused[2] = {-INFINITY, -INFINITY};
      scores(s, edge, has_mask, mk, kc, args.scale, k0, rows, T_, args.causal, unused);
      if (args.p > 0.0f) {
#pragma unroll
        for (int kg = 0; kg < NC / 2; ++kg) {  // the step's 16-key groups: n-tiles 2kg, 2kg + 1
          const philox::Block blk = ad::block(args.seed, args.offset, bh, args.T, ad::group(rows[0]),
                                              ad::group(k0 + kc + kg * 16 + 2 * t), ad::place(rows[0]) & 1u);
#pragma unroll
          for (int n2 = 0; n2 < 2; ++n2)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int nt = 2 * kg + n2, j = k0 + kc + nt * 8 + 2 * t + (e & 1);
              const float P = exp_fast(s[nt][e] - L[e >> 1]);
              const float kf = keep_factor(blk, ad::place(rows[e >> 1]), ad::place(j), args.thresh, args.drop_scale);
              s[nt][e] = P * (dp[nt][e] * kf - Dv[e >> 1]) * ds_scale;
            }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < NC; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[nt][e] = exp_fast(s[nt][e] - L[e >> 1]) * (dp[nt][e] - Dv[e >> 1]) * ds_scale;
      }
      if constexpr (kTensor<T>) {
#pragma unroll
        for (int kg = 0; kg < NC / 2; ++kg) {  // dQ += dS K, one 16-key k-step per group
          std::uint32_t da[4];
          c_to_a<T>(da, s[2 * kg], s[2 * kg + 1]);
#pragma unroll
          for (int nt = 0; nt < NT; nt += 2) {
            mma2<T, false>(acc[nt], acc[nt + 1], da, ks + (kc + kg * 16) * LD + nt * 8, LD);
          }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < NC; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dsw[(g + 8 * (e >> 1)) * CLD + nt * 8 + 2 * t + (e & 1)] = s[nt][e];
        __syncwarp();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) fma_tile<false>(acc[nt], dsw, CLD, ks + kc * LD + nt * 8, LD);
        __syncwarp();
      }
    }
    __syncthreads();  // buffer kb % S is free for tile kb + S
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = rows[half];
    if (i >= T_) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        T* dst = dq + head + static_cast<std::int64_t>(i) * D + nt * 8 + 2 * t + e2;
        *dst = from_float<T>((args.add_q ? to_float(*dst) : 0.0f) + sum_scale * acc[nt][2 * half + e2]);
      }
  }
}

// dK, dV: block (head x, key tile y), warp w owns 16 key rows; over 64-query tiles in
// 16-query steps: Sᵀ and dPᵀ recomputed with the keys as rows, dV += (P ∘ keep)ᵀ dO,
// dK += scale · dSᵀ Q (the scale applied once to the sum, or to dS in fp16).
// KvRegs: the block's K and V as A fragments in registers (16-bit, D <= 64: 168 registers a
// thread at D = 64, so three blocks a multiprocessor); else read from shared memory at each
// step, in 128 registers so that four blocks fit where shared memory does (the same products
// in the same order: the same bits).
template <class T, int D, int S, int C, bool OnePass, bool KvRegs>
__global__ void __launch_bounds__(kThreads, KvRegs ? 1 : 4) sdpa_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv,
                                                            const T* __restrict__ dout, const T* __restrict__ q,
                                                            const T* __restrict__ k, const T* __restrict__ v,
                                                            const float* __restrict__ lse,
                                                            const float* __restrict__ dvec,
                                                            const T* __restrict__ mask, Args args,
                                                            float* __restrict__ dq_acc, unsigned* __restrict__ sem) {
  constexpr int LD = kLd<T, D>, CLD = kCLd<T>, NT = D / 8, KS = D / 16, NC = C / 8, DLD = kDsLd<T>;
  static_assert(C == kChunk || (kTensor<T> && C == 2 * kChunk), "steps of 16, or 32 on the tensor cores");
  static_assert(!OnePass || (kTensor<T> && D <= 64), "one pass: 16-bit, head dims up to 64");
  // The block's own K and V as A fragments in registers, where registers allow and KvRegs asks.
  constexpr bool kCache = kTensor<T> && D <= 64 && KvRegs;
  extern __shared__ __align__(16) unsigned char smem[];
  float* rowf = reinterpret_cast<float*>(smem);  // [S][logsumexp, dvec][kTile]
  T* ks = reinterpret_cast<T*>(smem + 2 * S * kTile * sizeof(float));
  T* vs = ks + kTile * LD;
  T* qdos = vs + kTile * LD;  // [S][Q, dO]
  [[maybe_unused]] T* ptw = qdos + 2 * S * kTile * LD + (threadIdx.x >> 5) * 2 * 16 * CLD;  // fp32 path: Pᵀ, dSᵀ
  [[maybe_unused]] T* dstw = ptw + 16 * CLD;
  [[maybe_unused]] T* dsts = qdos + 2 * S * kTile * LD;  // one pass: the tile's dSᵀ [key][query]
  const int warp = static_cast<int>(threadIdx.x >> 5), g = lane_g(), t = lane_t();
  const int T_ = static_cast<int>(args.T);
  const std::int64_t bh = blockIdx.x, b = bh / args.H;
  const int k0 = tile_of_block(false, args.causal) * kTile;
  const std::int64_t head = bh * args.T * D;
  // bf16 and fp32 apply the scale once to the sums; fp16 keeps it in dS, whose range it
  // needs (unscaled, dS is 1/scale larger and would overflow 65504 sooner).
  const float ds_scale = DsScaled<T> ? args.scale : 1.0f, sum_scale = DsScaled<T> ? 1.0f : args.scale;
  auto issue = [&](int qb) {  // Q, dO, logsumexp and dvec of query tile qb into buffer qb % S
    const int q0 = qb * kTile;
    T* qs = qdos + (qb % S) * 2 * kTile * LD;
    load_tile_async<T, D>(qs, q + head, q0, T_, args.vec);
    load_tile_async<T, D>(qs + kTile * LD, dout + head, q0, T_, args.vec);
    cp_async_commit();
    float* f = rowf + (qb % S) * 2 * kTile;
    for (int c = static_cast<int>(threadIdx.x); c < kTile; c += static_cast<int>(blockDim.x)) {
      f[c] = q0 + c < T_ ? lse[bh * args.T + q0 + c] : 0.0f;
      f[kTile + c] = q0 + c < T_ ? dvec[bh * args.T + q0 + c] : 0.0f;
    }
  };
  const int first = args.causal ? k0 / kTile : 0;
  const int tiles = (T_ + kTile - 1) / kTile;
  issue(first);
  load_tile<T, D>(ks, k + head, k0, T_, args.vec);
  load_tile<T, D>(vs, v + head, k0, T_, args.vec);
  __syncthreads();
  [[maybe_unused]] std::uint32_t kf[kCache ? KS : 1][4], vf[kCache ? KS : 1][4];
  if constexpr (kCache) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      frag_a(kf[kk], ks + (warp * 16) * LD + kk * 16, LD);
      frag_a(vf[kk], vs + (warp * 16) * LD + kk * 16, LD);
    }
  }
  const int keys[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  float mk[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) mk[r] = mask != nullptr && keys[r] < T_ ? to_float(mask[b * args.T + keys[r]]) : 0.0f;
  float dk_acc[NT][4], dv_acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[nt][e] = dv_acc[nt][e] = 0.0f;
  for (int qb = first; qb < tiles; ++qb) {
    const int q0 = qb * kTile;
    next_tile<S>(qb, first, tiles, issue);
    __syncthreads();
    const T* qs = qdos + (qb % S) * 2 * kTile * LD;
    const T* dos = qs + kTile * LD;
    const float* ls = rowf + (qb % S) * 2 * kTile;
    const float* dvs = ls + kTile;
    // Only a tile on the diagonal or at the sequence's end checks positions.
    const bool edge = (args.causal && q0 < k0 + kTile) || q0 + kTile > T_ || k0 + kTile > T_;
    for (int qc = 0; qc < kTile; qc += C) {
      if (args.causal && k0 + warp * 16 > q0 + qc + C - 1) {  // every key after every query of the step
        if constexpr (OnePass)  // dSᵀ is 0 there
          for (int w = static_cast<int>(threadIdx.x & 31); w < 16 * C / 2; w += 32)
            *reinterpret_cast<std::uint32_t*>(dsts + (warp * 16 + w / (C / 2)) * DLD + qc + 2 * (w % (C / 2))) = 0u;
        continue;
      }
      float st[NC][4], dpt[NC][4];
#pragma unroll
      for (int nt = 0; nt < NC; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        if constexpr (kTensor<T>) {
          std::uint32_t ka[4], va[4];
          if constexpr (kCache) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              ka[r] = kf[kk][r];
              va[r] = vf[kk][r];
            }
          } else {
            frag_a(ka, ks + (warp * 16) * LD + kk * 16, LD);
            frag_a(va, vs + (warp * 16) * LD + kk * 16, LD);
          }
#pragma unroll
          for (int nt = 0; nt < NC; nt += 2) {
            mma2<T, true>(st[nt], st[nt + 1], ka, qs + (qc + nt * 8) * LD + kk * 16, LD);
            mma2<T, true>(dpt[nt], dpt[nt + 1], va, dos + (qc + nt * 8) * LD + kk * 16, LD);
          }
        } else {
#pragma unroll
          for (int nt = 0; nt < NC; ++nt) {
            fma_tile<true>(st[nt], ks + (warp * 16) * LD + kk * 16, LD, qs + (qc + nt * 8) * LD + kk * 16, LD);
            fma_tile<true>(dpt[nt], vs + (warp * 16) * LD + kk * 16, LD, dos + (qc + nt * 8) * LD + kk * 16, LD);
          }
        }
      }
      // Pᵀ ∘ keep in place of Sᵀ, dSᵀ in place of dPᵀ, per 16-query group of the step. The
      // block of the group's queries of this lane's key parity, and (from the partner lane)
      // the other parity's.
#pragma unroll
      for (int qg = 0; qg < NC / 2; ++qg) {
        philox::Block par[2]{};  // the blocks of the even and the odd query places
        if (args.p > 0.0f) {
          const philox::Block own = ad::block(args.seed, args.offset, bh, args.T, ad::group(q0 + qc + qg * 16 + 2 * t),
                                              ad::group(keys[0]), static_cast<std::uint32_t>(g & 1));
          const philox::Block other = partner_block(own);
          const bool odd = (g & 1) != 0;
#pragma unroll
          for (int w = 0; w < 4; ++w) {  // word by word: a run-time pick of a whole Block goes to local memory
            par[0].w[w] = odd ? other.w[w] : own.w[w];
            par[1].w[w] = odd ? own.w[w] : other.w[w];
          }
        }
#pragma unroll
        for (int n2 = 0; n2 < 2; ++n2)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int nt = 2 * qg + n2, half = e >> 1, cl = qc + nt * 8 + 2 * t + (e & 1);
            const int j = keys[half], i = q0 + cl;
            // Outside the sequence or the causal triangle P is 0, not exp(x − lse): a row
            // whose every key is masked by −inf has lse −inf.
            const bool outside = edge && (i >= T_ || j >= T_ || (args.causal && j > i));
            const float P = outside ? 0.0f : exp_fast(st[nt][e] * args.scale + mk[half] - ls[cl]);
            float kf1 = 1.0f;
            if (args.p > 0.0f)
              kf1 = keep_factor(par[e & 1], ad::place(i), ad::place(j), args.thresh,  // i's parity is e's
                                args.drop_scale);
            st[nt][e] = P * kf1;
            dpt[nt][e] = P * (dpt[nt][e] * kf1 - dvs[cl]) * ds_scale;
          }
      }
      if constexpr (kTensor<T>) {
#pragma unroll
        for (int qg = 0; qg < NC / 2; ++qg) {  // one 16-query k-step per group
          std::uint32_t pa[4], da[4];
          c_to_a<T>(pa, st[2 * qg], st[2 * qg + 1]);
          c_to_a<T>(da, dpt[2 * qg], dpt[2 * qg + 1]);
#pragma unroll
          for (int nt = 0; nt < NT; nt += 2) {
            mma2<T, false>(dv_acc[nt], dv_acc[nt + 1], pa, dos + (qc + qg * 16) * LD + nt * 8, LD);
            mma2<T, false>(dk_acc[nt], dk_acc[nt + 1], da, qs + (qc + qg * 16) * LD + nt * 8, LD);
          }
          if constexpr (OnePass) {  // dSᵀ as the A fragment holds it: keys g, g + 8; queries 2t, 2t + 8
            T* at = dsts + (warp * 16 + g) * DLD + qc + qg * 16 + 2 * t;
            *reinterpret_cast<std::uint32_t*>(at) = da[0];
            *reinterpret_cast<std::uint32_t*>(at + 8 * DLD) = da[1];
            *reinterpret_cast<std::uint32_t*>(at + 8) = da[2];
            *reinterpret_cast<std::uint32_t*>(at + 8 * DLD + 8) = da[3];
          }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < NC; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int at = (g + 8 * (e >> 1)) * CLD + nt * 8 + 2 * t + (e & 1);
            ptw[at] = st[nt][e];
            dstw[at] = dpt[nt][e];
          }
        __syncwarp();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          fma_tile<false>(dv_acc[nt], ptw, CLD, dos + qc * LD + nt * 8, LD);
          fma_tile<false>(dk_acc[nt], dstw, CLD, qs + qc * LD + nt * 8, LD);
        }
        __syncwarp();
      }
    }
    if constexpr (OnePass) {
      // dQ of this query tile from every warp's dSᵀ: warp w the queries q0 + 16w .. + 15, over
      // the tile's 64 keys, added to the fp32 sum in the key tiles' order (this block is
      // contributor k0 / 64 of query tile qb: tile 0 writes, the others wait their turn), or
      // by atomic adds into sums the launcher zeroed (args.atomic_dq). At D = 64 in two halves
      // of D, to hold half the accumulators.
      __syncthreads();
      const unsigned turn = static_cast<unsigned>(k0 / kTile);
      unsigned* counter = args.atomic_dq ? nullptr : sem + bh * tiles + qb;
      if (!args.atomic_dq) {
        if (threadIdx.x == 0) {
          while (*static_cast<volatile unsigned*>(counter) != turn) __nanosleep(64);
          __threadfence();
        }
        __syncthreads();
      }
      constexpr int NH = NT / 2 > 2 ? NT / 2 : NT;  // n-tiles per half (whole pairs)
#pragma unroll
      for (int n0 = 0; n0 < NT; n0 += NH) {
        float qacc[NH][4];
#pragma unroll
        for (int nt = 0; nt < NH; ++nt) qacc[nt][0] = qacc[nt][1] = qacc[nt][2] = qacc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          std::uint32_t a[4];
          frag_a_trans(a, dsts + (kk * 16) * DLD + warp * 16, DLD);
#pragma unroll
          for (int nt = 0; nt < NH; nt += 2)
            mma2<T, false>(qacc[nt], qacc[nt + 1], a, ks + (kk * 16) * LD + (n0 + nt) * 8, LD);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = q0 + warp * 16 + g + 8 * half;
          if (i >= T_) continue;
#pragma unroll
          for (int nt = 0; nt < NH; ++nt) {
            auto* at = reinterpret_cast<float2*>(dq_acc + (bh * args.T + i) * D + (n0 + nt) * 8 + 2 * t);
            float2 v = make_float2(qacc[nt][2 * half], qacc[nt][2 * half + 1]);
            if (args.atomic_dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
              atomicAdd(at, v);  // one 8-byte reduction in L2
#else
              atomicAdd(&at->x, v.x);
              atomicAdd(&at->y, v.y);
#endif
              continue;
            }
            if (turn != 0) {  // from L2, not this SM's L1: another block wrote it
              const float2 o = __ldcg(at);
              v = make_float2(o.x + v.x, o.y + v.y);
            }
            __stcg(at, v);
          }
        }
      }
      if (!args.atomic_dq) {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd(counter, 1u);
      }
    }
    __syncthreads();  // buffer qb % S is free for tile qb + S
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = keys[half];
    if (j >= T_) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const std::int64_t at = head + static_cast<std::int64_t>(j) * D + nt * 8 + 2 * t + e2;
        dk[at] = from_float<T>((args.add_k ? to_float(dk[at]) : 0.0f) + sum_scale * dk_acc[nt][2 * half + e2]);
        dv[at] = from_float<T>((args.add_v ? to_float(dv[at]) : 0.0f) + dv_acc[nt][2 * half + e2]);
      }
  }
}

// The one-pass backward's last step: dq += (scale ·) the fp32 dQ sums, rounded once.
template <class T>
__global__ void dq_finish_kernel(T* __restrict__ dq, const float* __restrict__ acc, std::int64_t n, float scale,
                                 bool add) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dq[i] = from_float<T>((add ? to_float(dq[i]) : 0.0f) + scale * acc[i]);
}

// ------------------------------------------------------------------ launch
template <class F>
void dispatch_head_dim(std::int64_t D, F&& f) {
  switch (D) {
    case 16: f(std::integral_constant<int, 16>{}); return;
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    default: break;
  }
  throw std::invalid_argument("sdpa: head dimension " + std::to_string(D) + " is not one of 16, 32, 64, 128");
}

template <class K>
void allow_smem(K kernel, std::size_t bytes) {
  ZP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Shared memory a block may opt into on the current device, or less: ZEROPLAN_SDPA_SMEM_LIMIT
// (bytes) stands in for a GPU with less (the tests run the one-buffer kernels on Hopper so).
std::size_t smem_optin() {
  int dev = 0, bytes = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  auto limit = static_cast<std::size_t>(bytes);
  if (const char* cap = std::getenv("ZEROPLAN_SDPA_SMEM_LIMIT"); cap != nullptr && *cap != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(cap, &end, 10);
    if (*end != '\0') throw std::invalid_argument(std::string("ZEROPLAN_SDPA_SMEM_LIMIT is '") + cap + "', not a byte count");
    limit = std::min<std::size_t>(limit, static_cast<std::size_t>(v));
  }
  return limit;
}

// Shared memory one multiprocessor of the current device holds (228 KB on Hopper and
// Blackwell, 164 KB on the A100, 100 KB on sm_86/89/120).
std::size_t smem_per_sm() {
  int dev = 0, bytes = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  return static_cast<std::size_t>(bytes);
}

// f(std::integral_constant<int, S>) with two tile buffers where their `double_bytes` of shared
// memory fit a block on any GPU (99 KB: sm_86, sm_89, sm_120) or on this one; else one.
constexpr std::size_t kSmemAnyGpu = 99 * 1024;
template <std::size_t double_bytes, class F>
void with_stages(F&& f) {
  if constexpr (double_bytes <= kSmemAnyGpu) {
    f(std::integral_constant<int, 2>{});
  } else {
    if (double_bytes <= smem_optin()) f(std::integral_constant<int, 2>{});
    else f(std::integral_constant<int, 1>{});
  }
}

Args make_args(std::int64_t H, std::int64_t T, bool causal, float scale, float p, std::uint64_t seed,
               std::uint64_t offset, bool vec) {
  Args a{};
  a.H = H;
  a.T = T;
  a.causal = causal;
  a.vec = vec;
  a.scale = scale;
  a.p = p;
  a.thresh = 1.0f - p;
  a.drop_scale = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
  a.seed = seed;
  a.offset = offset;
  a.add_q = a.add_k = a.add_v = true;
  return a;
}

// The grid is (B·H, tiles of 64 positions): at most 2^31 − 1 (batch, head) pairs and 65535
// tiles, so sequences up to 65535·64 positions.
constexpr std::int64_t kMaxT = std::int64_t{65535} * kTile;
void check_shape(std::int64_t B, std::int64_t H, std::int64_t T, const char* what) {
  if (B * H > std::int64_t{0x7fffffff})
    throw std::invalid_argument(std::string(what) + ": more than 2^31 - 1 (batch, head) pairs in one call");
  if (T > kMaxT)
    throw std::invalid_argument(std::string(what) + ": sequence of " + std::to_string(T) + " positions, longer than " +
                                std::to_string(kMaxT));
}

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) return false;
  return true;
}

}  // namespace

bool sdpa_supports(std::int64_t D) { return sdpa_head_dim_supported(D); }

void sdpa_forward(void* o, float* lse, const void* q, const void* k, const void* v, const void* mask, std::int64_t B,
                  std::int64_t H, std::int64_t T, std::int64_t D, bool causal, float scale, float p,
                  std::uint64_t seed, std::uint64_t offset, DType dt, cudaStream_t stream) {
  require_float(dt, "sdpa_forward");
  check_shape(B, H, T, "sdpa_forward");
  if (B * H * T <= 0) return;
  const Args args = make_args(H, T, causal, scale, p, seed, offset, all_aligned({o, q, k, v}));
  detail::dispatch(dt, "sdpa_forward", [&](auto tag) {
    using E = decltype(tag);
    dispatch_head_dim(D, [&](auto dim) {
      constexpr int Dc = decltype(dim)::value;
      const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>((T + kTile - 1) / kTile));
      with_stages<kForwardSmem<E, Dc, 2>>([&](auto stages) {
        constexpr int S = decltype(stages)::value;
        const std::size_t bytes = kForwardSmem<E, Dc, S>;
        allow_smem(sdpa_forward_kernel<E, Dc, S>, bytes);
        sdpa_forward_kernel<E, Dc, S><<<grid, kThreads, bytes, stream>>>(
            static_cast<E*>(o), lse, static_cast<const E*>(q), static_cast<const E*>(k), static_cast<const E*>(v),
            static_cast<const E*>(mask), args);
        ZP_CUDA_CHECK_LAUNCH("sdpa_forward_kernel");
      });
    });
  });
}

void sdpa_backward(Context& ctx, void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                   const void* v, const void* o, const float* lse, const void* mask, std::int64_t B, std::int64_t H,
                   std::int64_t T, std::int64_t D, bool causal, float scale, float p, std::uint64_t seed,
                   std::uint64_t offset, DType dt, cudaStream_t stream, SdpaAccumulate acc) {
  require_float(dt, "sdpa_backward");
  check_shape(B, H, T, "sdpa_backward");
  if (B * H * T <= 0) return;
  if (!sdpa_supports(D)) dispatch_head_dim(D, [](auto) {});  // throws naming D
  const std::int64_t rows = B * H * T;
  auto* dvec = static_cast<float*>(ctx.scratch(sizeof(float) * static_cast<std::size_t>(rows), "sdpa_backward"));
  Args args = make_args(H, T, causal, scale, p, seed, offset, all_aligned({dq, dk, dv, dout, q, k, v}));
  args.add_q = acc.q;
  args.add_k = acc.k;
  args.add_v = acc.v;
  args.atomic_dq = ctx.sdpa_backward_atomic_dq();
  const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>((T + kTile - 1) / kTile));
  detail::dispatch(dt, "sdpa_backward", [&](auto tag) {
    using E = decltype(tag);
    dispatch_head_dim(D, [&](auto dim) {
      constexpr int Dc = decltype(dim)::value;
      constexpr int kRowBlock = 256;  // 8 rows (warps) per block
      row_terms_kernel<E, Dc><<<static_cast<unsigned>(detail::ceil_div(rows * 32, kRowBlock)), kRowBlock, 0, stream>>>(
          dvec, static_cast<const E*>(dout), static_cast<const E*>(o), rows);
      ZP_CUDA_CHECK_LAUNCH("row_terms_kernel");

      // Backward steps of 16 positions, or 32 on the tensor cores when the Context asks; in one
      // pass (dQ from the dK/dV kernel's dS) when it asks and the kernels have one.
      constexpr std::size_t dq_double = kDqSmem<E, Dc, 2>, dkdv_double = kDkDvSmem<E, Dc, 2>;
      auto dkdv_kernel = [&](auto chunk, auto one_pass, float* dq_acc, unsigned* sem) {
        constexpr int C = decltype(chunk)::value;
        constexpr bool OnePass = decltype(one_pass)::value;
        with_stages<dkdv_double + (OnePass ? kDsSmem<E> : 0)>([&](auto stages) {
          constexpr int S = decltype(stages)::value;
          const std::size_t bytes = kDkDvSmem<E, Dc, S> + (OnePass ? kDsSmem<E> : 0);
          auto launch = [&](auto kernel) {
            allow_smem(kernel, bytes);
            kernel<<<grid, kThreads, bytes, stream>>>(static_cast<E*>(dk), static_cast<E*>(dv),
                                                      static_cast<const E*>(dout), static_cast<const E*>(q),
                                                      static_cast<const E*>(k), static_cast<const E*>(v), lse, dvec,
                                                      static_cast<const E*>(mask), args, dq_acc, sem);
            ZP_CUDA_CHECK_LAUNCH("sdpa_dkdv_kernel");
          };
          // K and V from shared memory, four blocks a multiprocessor (the default): at D = 64
          // (the shape measured), 16-bit, in steps of 16, two passes (one pass's dSᵀ tile leaves
          // shared memory for three blocks only, and steps of 32 need the registers anyway),
          // where the multiprocessor's shared memory holds four blocks (each with the 1 KB the
          // runtime reserves): Hopper and Blackwell, not the A100 or sm_86/89/120, where the
          // register kernel runs as many blocks.
          if constexpr (kTensor<E> && Dc == 64 && C == kChunk && !OnePass) {
            if (!ctx.sdpa_backward_kv_registers() && 4 * (bytes + 1024) <= smem_per_sm()) {
              launch(sdpa_dkdv_kernel<E, Dc, S, C, OnePass, false>);
              return;
            }
          }
          launch(sdpa_dkdv_kernel<E, Dc, S, C, OnePass, true>);
        });
      };
      auto run = [&](auto chunk) {
        constexpr int C = decltype(chunk)::value;
        if constexpr (kTensor<E> && Dc <= 64) {
          if (ctx.sdpa_backward_one_pass()) {
            // The counters (one per (batch, head, query tile)), then the fp32 dQ sums.
            const std::int64_t tiles = (T + kTile - 1) / kTile;
            const std::size_t sem_bytes = static_cast<std::size_t>(detail::ceil_div(B * H * tiles * 4, 256) * 256);
            char* area = static_cast<char*>(ctx.buffer(sem_bytes + static_cast<std::size_t>(B * H * T * Dc) * 4));
            auto* sem = reinterpret_cast<unsigned*>(area);
            auto* dq_acc = reinterpret_cast<float*>(area + sem_bytes);
            // The counters; with atomic adds, the sums themselves (they all add).
            ZP_CUDA_CHECK(cudaMemsetAsync(sem, 0, sem_bytes + (args.atomic_dq ? static_cast<std::size_t>(B * H * T * Dc) * 4 : 0),
                                          stream));
            dkdv_kernel(chunk, std::true_type{}, dq_acc, sem);
            const std::int64_t n = B * H * T * Dc;
            dq_finish_kernel<E><<<detail::grid_for(n, 256), 256, 0, stream>>>(static_cast<E*>(dq), dq_acc, n,
                                                                                DsScaled<E> ? 1.0f : scale, acc.q);
            ZP_CUDA_CHECK_LAUNCH("dq_finish_kernel");
            return;
          }
        }
        with_stages<dq_double>([&](auto stages) {
          constexpr int S = decltype(stages)::value;
          const std::size_t bytes = kDqSmem<E, Dc, S>;
          allow_smem(sdpa_dq_kernel<E, Dc, S, C>, bytes);
          sdpa_dq_kernel<E, Dc, S, C><<<grid, kThreads, bytes, stream>>>(
              static_cast<E*>(dq), static_cast<const E*>(dout), static_cast<const E*>(q), static_cast<const E*>(k),
              static_cast<const E*>(v), lse, dvec, static_cast<const E*>(mask), args);
          ZP_CUDA_CHECK_LAUNCH("sdpa_dq_kernel");
        });
        dkdv_kernel(chunk, std::false_type{}, nullptr, nullptr);
      };
      if constexpr (kTensor<E>) {
        if (ctx.sdpa_backward_chunk() == 2 * kChunk) {
          run(std::integral_constant<int, 2 * kChunk>{});
          return;
        }
      }
      run(std::integral_constant<int, kChunk>{});
    });
  });
}

}  // namespace zp::kernels::cuda
