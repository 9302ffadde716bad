#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/gelu_epilogue.hpp"
#include "kernels/common/gemm_pieces.hpp"
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/bmm.cuh"
#include "kernels/cuda/detail.cuh"

namespace zp::kernels::cuda {

namespace {

using detail::ceil_div;

// The split-K reductions allowed: none, or fp32 partial sums (see make_plan).
constexpr std::uint32_t kReductionSchemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The largest power of two (at most 256) dividing the address of every batch item.
int alignment(const void* p, std::int64_t stride_bytes, std::int64_t batch) {
  std::uintptr_t v = reinterpret_cast<std::uintptr_t>(p) | std::uintptr_t{256};
  if (batch > 1) v |= static_cast<std::uintptr_t>(stride_bytes);
  return static_cast<int>(v & (~v + 1));
}

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}
template <class T>
void set_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& value) {
  ZP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &value, sizeof(value)));
}
template <class T>
void set_attr(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
}

// y[i, j] += bias[j] (an empty product: C = bias).
template <class T>
__global__ void add_bias_kernel(T* __restrict__ c, const T* __restrict__ bias, std::int64_t rows, std::int64_t n,
                                std::int64_t ldc) {
  const std::int64_t total = rows * n;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T& e = c[i / n * ldc + i % n];
    e = detail::from_float<T>(detail::to_float(e) + detail::to_float(bias[i % n]));
  }
}

void add_bias(const Matmul& mm, cudaStream_t stream) {
  detail::dispatch(mm.dt, "linear bias", [&](auto tag) {
    using T = decltype(tag);
    add_bias_kernel<T><<<detail::grid_for(mm.m * mm.n, 256), 256, 0, stream>>>(
        static_cast<T*>(mm.c), static_cast<const T*>(mm.bias), mm.m, mm.n, mm.ldc != 0 ? mm.ldc : mm.n);
    ZP_CUDA_CHECK_LAUNCH("add_bias_kernel");
  });
}

void destroy_plan(MatmulPlan& plan) {
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.op != nullptr) cublasLtMatmulDescDestroy(plan.op);
  plan = MatmulPlan{};
}

void fill_plan(MatmulPlan& plan, Context::Impl& s, const Matmul& mm, Epilogue epilogue, int align_a, int align_b,
               int align_c) {
  const cudaDataType_t type = cuda_type(mm.dt);
  const cublasComputeType_t compute =
      mm.dt == DType::fp32 && s.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  ZP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, compute, CUDA_R_32F));
  // Row-major C (m,n) is column-major C^T (n,m) = op(B)^T op(A)^T: cuBLASLt's A is our B.
  set_attr(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (epilogue == Epilogue::bias) {
    set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
  } else if (is_bias_grad(epilogue)) {
    // cuBLASLt's A is our B: the sum of our op(A) over k is its BGRADB (a value per column of
    // its D, our row), of our op(B) its BGRADA. Written in fp32, or in the product's type.
    const bool of_a = epilogue == Epilogue::bias_grad_a || epilogue == Epilogue::bias_grad_a_in_dt;
    const bool fp32 = epilogue == Epilogue::bias_grad_a || epilogue == Epilogue::bias_grad_b;
    set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, of_a ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA);
    set_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, fp32 ? CUDA_R_32F : type);
  } else if (is_gelu(epilogue)) {
    // The auxiliary matrix (the pre-activation) has C's layout and type: cuBLASLt's (n, m), ld n.
    if (epilogue == Epilogue::gelu_aux_bias) {
      set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
      set_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
    } else {
      set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DGELU);
    }
    set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<std::int64_t>(mm.ldc > 0 ? mm.ldc : mm.n));
  }
  // Column-major views of the row-major operands (rows, cols, leading dimension).
  const std::uint64_t la_rows = static_cast<std::uint64_t>(mm.trans_b ? mm.k : mm.n);
  const std::uint64_t la_cols = static_cast<std::uint64_t>(mm.trans_b ? mm.n : mm.k);
  const std::uint64_t lb_rows = static_cast<std::uint64_t>(mm.trans_a ? mm.m : mm.k);
  const std::uint64_t lb_cols = static_cast<std::uint64_t>(mm.trans_a ? mm.k : mm.m);
  ZP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, type, la_rows, la_cols,
                                             mm.ldb > 0 ? mm.ldb : static_cast<std::int64_t>(la_rows)));
  ZP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, type, lb_rows, lb_cols,
                                             mm.lda > 0 ? mm.lda : static_cast<std::int64_t>(lb_rows)));
  ZP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, mm.c_fp32 ? CUDA_R_32F : type, static_cast<std::uint64_t>(mm.n),
                                             static_cast<std::uint64_t>(mm.m), mm.ldc > 0 ? mm.ldc : mm.n));
  if (mm.batch > 1) {
    const auto count = static_cast<std::int32_t>(mm.batch);
    set_attr(plan.a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
    set_attr(plan.b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
    set_attr(plan.c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
    set_attr(plan.a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, mm.stride_b);
    set_attr(plan.b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, mm.stride_a);
    set_attr(plan.c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, mm.stride_c);
  }
  cublasLtMatmulPreference_t pref = nullptr;
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  try {
    set_attr(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(s.workspace_bytes));
    set_attr(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(align_b));
    set_attr(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(align_a));
    set_attr(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(align_c));
    set_attr(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(align_c));
    // Split-K partial sums stay in fp32. By default cuBLASLt may add the parts of a split
    // product in the output type (in place, or through the workspace): one 16-bit rounding
    // per part at the part's magnitude, so an output whose parts cancel keeps an error of
    // their ulp, not its own. With a large workspace its heuristic picks such algorithms for
    // small aligned shapes: on the H200, 16-bit outputs of a 64x128x96 product were up to 16
    // bf16 ulps off and their relative L2 error was 1.5 times that of one rounding, while
    // the ragged shapes (other algorithms) were right. (PyTorch allows it unless
    // torch.backends.cuda.matmul.allow_{bf16,fp16}_reduced_precision_reduction is False.)
    // Allowed here: no split, or fp32 parts reduced in the workspace; the output is then
    // rounded once, as the CPU twin's fp32 product rounded to the storage dtype.
    set_attr(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, kReductionSchemes);
    ZP_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(s.lt, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found));
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0)
    throw CudaError("cuBLASLt has no algorithm for a " + std::string(dtype_name(mm.dt)) + " GEMM" +
                    (epilogue == Epilogue::gelu_aux_bias ? std::string(" with the GELU_AUX_BIAS epilogue")
                     : epilogue == Epilogue::dgelu      ? std::string(" with the DGELU epilogue")
                                                        : std::string()) +
                    " of batch " +
                    std::to_string(mm.batch) + ", m " + std::to_string(mm.m) + ", n " + std::to_string(mm.n) +
                    ", k " + std::to_string(mm.k));
  plan.algo = result.algo;
  plan.workspace = result.workspaceSize;
  // The mask is a preference: an algorithm that still reduces in the output type is refused.
  std::int32_t splits = 1;
  std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  std::size_t written = 0;
  ZP_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                       sizeof(splits), &written));
  ZP_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                       sizeof(scheme), &written));
  if (splits > 1 && (scheme & ~kReductionSchemes) != 0)
    throw CudaError("cuBLASLt chose a split-K reduction in " + std::string(dtype_name(mm.dt)) + " (scheme " +
                    std::to_string(scheme) + ", " + std::to_string(splits) + " parts) for a GEMM of batch " +
                    std::to_string(mm.batch) + ", m " + std::to_string(mm.m) + ", n " + std::to_string(mm.n) +
                    ", k " + std::to_string(mm.k));
}

// Descriptors and algorithm for one shape; nothing is left allocated when it throws.
MatmulPlan make_plan(Context::Impl& s, const Matmul& mm, Epilogue epilogue, int align_a, int align_b, int align_c) {
  MatmulPlan plan;
  try {
    fill_plan(plan, s, mm, epilogue, align_a, align_b, align_c);
  } catch (const CudaError&) {
    destroy_plan(plan);
    // The optional epilogues fall back to a plain product: no algorithm is remembered as such.
    if (!is_bias_grad(epilogue)) throw;
    plan.unsupported = true;
  } catch (...) {
    destroy_plan(plan);
    throw;
  }
  return plan;
}

// One cuBLASLt call for mm (bias already 16-byte aligned, or nullptr; with a bias-gradient
// epilogue, `bias` is its output, in fp32 or in mm.dt as the epilogue says; with a GELU epilogue,
// `aux` is the pre-activation, written or read): the plan for its shape, strides, alignments and
// epilogue is made once and cached in the Context. Returns false, having run nothing, where
// an optional epilogue has no algorithm.
bool launch(Context& ctx, const Matmul& mm, const void* bias, cudaStream_t stream,
            Epilogue epilogue_grad = Epilogue::none, const void* aux = nullptr) {
  Context::Impl& s = ctx.impl();
  const std::int64_t elem = dtype_size(mm.dt);
  const Epilogue epilogue = epilogue_grad != Epilogue::none ? epilogue_grad
                            : bias != nullptr             ? Epilogue::bias
                                                          : Epilogue::none;
  const int align_a = alignment(mm.a, mm.stride_a * elem, mm.batch);
  const int align_b = alignment(mm.b, mm.stride_b * elem, mm.batch);
  const int align_c = alignment(mm.c, mm.stride_c * elem, mm.batch);
  const MatmulKey key{static_cast<int>(mm.dt),
                      mm.batch,
                      mm.m,
                      mm.n,
                      mm.k,
                      mm.stride_a,
                      mm.stride_b,
                      mm.stride_c,
                      mm.lda,
                      mm.ldb,
                      mm.ldc,
                      mm.trans_a,
                      mm.trans_b,
                      static_cast<int>(epilogue),
                      align_a,
                      align_b,
                      align_c,
                      s.allow_tf32 ? 1 : 0,
                      mm.c_fp32};
  auto it = s.plans.find(key);
  // A new plan's first product loads its kernels (cuBLASLt loads them lazily): the driver's
  // used bytes across it are the library's (Context::driver_growth).
  std::int64_t before = -1;
  if (it == s.plans.end()) {
    before = driver_used_bytes();
    MatmulPlan plan = make_plan(s, mm, epilogue, align_a, align_b, align_c);
    it = s.plans.emplace(key, plan).first;
  }
  const MatmulPlan& plan = it->second;
  if (plan.unsupported) return false;
  if (epilogue != Epilogue::none && epilogue != Epilogue::dgelu)
    set_attr(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (is_gelu(epilogue)) set_attr(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  const float alpha = 1.0f, beta = mm.accumulate ? 1.0f : 0.0f;
  ZP_CUBLAS_CHECK(cublasLtMatmul(s.lt, plan.op, &alpha, mm.b, plan.a, mm.a, plan.b, &beta, mm.c, plan.c, mm.c, plan.c,
                                 &plan.algo, s.workspace, s.workspace_bytes, stream));
  if (before >= 0) ctx.add_driver_growth(Context::Library::cublaslt, driver_used_bytes() - before);
  return true;
}

// Row d of `width` elements written by the block, value(j) at j: each thread stores whole
// 16-byte groups of the row (its few elements before the first 16-byte boundary and after
// the last one singly), whatever d's alignment. The staged GEMMs' copies and finish write
// rows whose pitch is not a multiple of 16 bytes this way. The first copy kernel stored one
// element per thread with blocks of 512 bytes; on the H200 it made GPT-2's staged LM head
// forward 17.6 ms (13.4 ms unstaged, 1.7 ms for the aligned product alone), and
// cudaMemcpy2DAsync before it 15.2 ms.
template <class E, class F>
__device__ __forceinline__ void store_row(E* d, std::int64_t width, F value) {  // d not restrict: value may read it
  constexpr int V = static_cast<int>(16 / sizeof(E));
  const std::int64_t step = blockDim.x;
  const auto misalign = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(d) & 15u);
  const std::int64_t to_boundary = ((16 - misalign) & 15) / static_cast<std::int64_t>(sizeof(E));
  const std::int64_t head = to_boundary < width ? to_boundary : width;
  const std::int64_t groups = (width - head) / V, tail = head + groups * V;
  for (std::int64_t c = threadIdx.x; c < head; c += step) d[c] = value(c);
  for (std::int64_t gi = threadIdx.x; gi < groups; gi += step) {
    const std::int64_t c = head + gi * V;
    E e[V];
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = value(c + k);
    uint4 raw;
    memcpy(&raw, e, 16);
    *reinterpret_cast<uint4*>(d + c) = raw;
  }
  for (std::int64_t c = tail + threadIdx.x; c < width; c += step) d[c] = value(c);
}

// Rows of `width` elements from src (src_ld apart; 0: one row for all) to dst (dst_ld apart),
// a block per row (store_row), gathered from the source by element loads at any alignment (a
// warp's eight loads of one group step touch the same 512 bytes: the first brings them into
// L1, the rest hit it).
template <class E>
__global__ void copy_rows_kernel(E* __restrict__ dst, std::int64_t dst_ld, const E* __restrict__ src,
                                 std::int64_t src_ld, std::int64_t width, std::int64_t rows) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const E* s = src + r * src_ld;
    store_row(dst + r * dst_ld, width, [&](std::int64_t c) { return s[c]; });
  }
}

void copy_rows(char* dst, std::int64_t dst_ld, const char* src, std::int64_t src_ld, std::int64_t width,
               std::int64_t rows, std::int64_t elem, cudaStream_t stream) {
  if (width <= 0 || rows <= 0) return;
  constexpr int kBlock = 256;
  const auto grid = static_cast<unsigned>(std::min<std::int64_t>(rows, std::int64_t{1} << 20));
  if (elem == 2) {
    copy_rows_kernel<<<grid, kBlock, 0, stream>>>(reinterpret_cast<std::uint16_t*>(dst), dst_ld,
                                                  reinterpret_cast<const std::uint16_t*>(src), src_ld, width, rows);
  } else if (elem == 4) {
    copy_rows_kernel<<<grid, kBlock, 0, stream>>>(reinterpret_cast<std::uint32_t*>(dst), dst_ld,
                                                  reinterpret_cast<const std::uint32_t*>(src), src_ld, width, rows);
  } else {
    throw std::invalid_argument("copy_rows: elements of " + std::to_string(elem) + " bytes");
  }
  ZP_CUDA_CHECK_LAUNCH("copy_rows_kernel");
}

// Rows of the fp32 accumulator (acc_ld apart) rounded once into C's rows (n columns,
// c_ld apart, at any alignment), a block per row (store_row): C = acc (+ bias[j]) (+ C's old value
// when accumulating; each thread reads the old values of the elements it then stores).
template <class T>
__global__ void finish_rows_kernel(T* __restrict__ c, std::int64_t c_ld, const float* __restrict__ acc,
                                   std::int64_t acc_ld, const T* __restrict__ bias, std::int64_t rows, std::int64_t n,
                                   bool accumulate) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* d = c + r * c_ld;
    const float* s = acc + r * acc_ld;
    store_row(d, n, [&](std::int64_t j) {
      float v = s[j];
      if (bias != nullptr) v += detail::to_float(bias[j]);
      if (accumulate) v += detail::to_float(d[j]);
      return detail::from_float<T>(v);
    });
  }
}

// A large product whose rows of A or C are not 16-byte aligned, or whose rows are all
// aligned but a dimension is odd, run as the plan of kernels/common/gemm_pieces.hpp
// (plan_gemm) through the Context's scratch (after the `scratch_used` bytes the bias took).
// Only batch-1 products of at least ContextOptions::staged_min_work m·n·k. Returns whether
// it ran the product.
bool staged(Context& ctx, const Matmul& mm, const void* bias, std::size_t scratch_used, cudaStream_t stream) {
  Context::Impl& s = ctx.impl();
  if (mm.batch != 1 || mm.c_fp32) return false;
  if (static_cast<double>(mm.m) * static_cast<double>(mm.n) * static_cast<double>(mm.k) < s.staged_min_work)
    return false;
  const std::size_t total = ctx.scratch_bytes();
  if (total <= scratch_used) return false;
  const std::int64_t elem = dtype_size(mm.dt);
  const std::int64_t ldb = mm.ldb != 0 ? mm.ldb : (mm.trans_b ? mm.k : mm.n);
  const GemmPlan plan = plan_gemm(mm.m, mm.n, mm.k, mm.trans_a, mm.trans_b, mm.accumulate, bias != nullptr, elem,
                                  mm.lda, mm.ldb, mm.ldc, total - scratch_used);
  if (plan.empty()) return false;
  char* area = static_cast<char*>(ctx.scratch(total, "staged matmul")) + scratch_used;
  auto buffer = [&](GemmBuffer g) -> char* {
    switch (g) {
      case GemmBuffer::a: return const_cast<char*>(static_cast<const char*>(mm.a));
      case GemmBuffer::b: return const_cast<char*>(static_cast<const char*>(mm.b));
      case GemmBuffer::c: return static_cast<char*>(mm.c);
      case GemmBuffer::acc: return area;
      default: return area + plan.acc_bytes;
    }
  };
  // Offsets count elements of the operands' type, or fp32 ones in the accumulator.
  auto at = [&](GemmBuffer g, std::int64_t offset) { return buffer(g) + offset * (g == GemmBuffer::acc ? 4 : elem); };
  for (const GemmStep& step : plan.steps) {
    switch (step.kind) {
      case GemmStep::Kind::copy: {
        const RowCopy& r = step.copy;
        copy_rows(at(r.dst, r.dst_offset), r.dst_ld, at(r.src, r.src_offset), r.src_ld, r.width, r.rows, elem, stream);
        break;
      }
      case GemmStep::Kind::product: {
        // The bias is never the epilogue here, nor C's initial value: the finish adds it to
        // the fp32 sums as it rounds them. On the H200 the bias epilogue of these padded-row
        // bf16 products rounded twice (the BERT-style 700x77x64 check: relative L2 error
        // 2.3e-3, 12% of the elements past the one-rounding bound), and on an H100 so did
        // beta 1 over a C holding the bias once the columns were split into aligned products.
        const GemmProduct& g = step.product;
        Matmul p = mm;
        p.m = g.m;
        p.n = g.n;
        p.k = g.k;
        p.a = at(g.a_buffer, g.a_offset);
        p.lda = g.lda;
        p.b = at(GemmBuffer::b, g.b_offset);
        p.ldb = ldb;
        p.c = at(g.c_buffer, g.c_offset);
        p.ldc = g.ldc;
        p.accumulate = g.accumulate;
        p.c_fp32 = g.c_buffer == GemmBuffer::acc;
        p.bias = nullptr;
        launch(ctx, p, nullptr, stream);
        break;
      }
      case GemmStep::Kind::finish: {
        const GemmFinish& f = step.finish;
        detail::dispatch(mm.dt, "staged matmul", [&](auto tag) {
          using T = decltype(tag);
          const auto grid = static_cast<unsigned>(std::min<std::int64_t>(f.rows, std::int64_t{1} << 20));
          finish_rows_kernel<T><<<grid, 256, 0, stream>>>(
              reinterpret_cast<T*>(at(GemmBuffer::c, f.c_offset)), f.c_ld,
              reinterpret_cast<const float*>(at(GemmBuffer::acc, f.acc_offset)), f.acc_ld,
              static_cast<const T*>(bias), f.rows, mm.n, mm.accumulate);
          ZP_CUDA_CHECK_LAUNCH("finish_rows_kernel");
        });
        break;
      }
    }
  }
  ++s.staged_products;
  return true;
}

}  // namespace

void matmul(Context& ctx, const Matmul& mm, cudaStream_t stream) {
  require_float(mm.dt, "matmul");
  if (mm.m < 0 || mm.n < 0 || mm.k < 0 || mm.batch < 0) throw std::invalid_argument("matmul: negative dimension");
  if (mm.bias != nullptr && (mm.batch != 1 || mm.accumulate))
    throw std::invalid_argument("matmul: a bias needs batch 1 and accumulate == false");
  if (mm.c_fp32) throw std::invalid_argument("matmul: an fp32 C is the staged products' own (staged() sets it)");
  if (mm.m == 0 || mm.n == 0 || mm.batch == 0) return;
  const std::int64_t elem = dtype_size(mm.dt);
  if (mm.k == 0) {  // an empty sum: C = 0 (+ bias), or C unchanged when accumulating
    if (!mm.accumulate) {
      const std::int64_t ldc = mm.ldc != 0 ? mm.ldc : mm.n;
      for (std::int64_t i = 0; i < mm.batch; ++i)
        ZP_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(mm.c) + i * mm.stride_c * elem,
                                        static_cast<std::size_t>(ldc * elem), 0, static_cast<std::size_t>(mm.n * elem),
                                        static_cast<std::size_t>(mm.m), stream));
      if (mm.bias != nullptr) add_bias(mm, stream);
    }
    return;
  }
  // The bias always goes through the epilogue (one rounding, as PyTorch's addmm): a bias
  // that is not 16-byte aligned is copied to the start of the Context's scratch first.
  const void* bias = mm.bias;
  std::size_t scratch_used = 0;
  if (bias != nullptr && !detail::aligned16(bias)) {
    void* aligned = ctx.scratch(static_cast<std::size_t>(mm.n * elem), "linear bias");
    ZP_CUDA_CHECK(cudaMemcpyAsync(aligned, bias, static_cast<std::size_t>(mm.n * elem), cudaMemcpyDeviceToDevice,
                                  stream));
    bias = aligned;
    scratch_used = static_cast<std::size_t>(ceil_div(mm.n * elem, 256) * 256);
  }
  if (!staged(ctx, mm, bias, scratch_used, stream)) launch(ctx, mm, bias, stream);
}

bool matmul_bias_grad(Context& ctx, const Matmul& mm, void* bias_grad, bool of_b, bool sums_fp32, cudaStream_t stream) {
  require_float(mm.dt, "matmul_bias_grad");
  if (bias_grad == nullptr || mm.bias != nullptr || mm.c_fp32 || mm.batch != 1) return false;
  if (mm.m <= 0 || mm.n <= 0 || mm.k <= 0 || mm.m % 8 != 0 || mm.n % 8 != 0 || mm.k % 8 != 0) return false;
  if (mm.lda != 0 || mm.ldb != 0 || mm.ldc != 0) return false;
  if (!detail::aligned16(mm.a) || !detail::aligned16(mm.b) || !detail::aligned16(mm.c) || !detail::aligned16(bias_grad))
    return false;
  const Epilogue e = of_b ? (sums_fp32 ? Epilogue::bias_grad_b : Epilogue::bias_grad_b_in_dt)
                          : (sums_fp32 ? Epilogue::bias_grad_a : Epilogue::bias_grad_a_in_dt);
  if (!launch(ctx, mm, bias_grad, stream, e)) return false;
  ++ctx.impl().bias_grad_epilogues;
  return true;
}

bool matmul_gelu(Context& ctx, const Matmul& mm, const void* aux, bool derivative, cudaStream_t stream) {
  require_float(mm.dt, "matmul_gelu");
  if (derivative == (mm.bias != nullptr))
    throw std::invalid_argument(derivative ? "matmul_gelu: the derivative's epilogue takes no bias"
                                           : "matmul_gelu: the GELU's epilogue needs the bias");
  if (mm.batch != 1 || mm.accumulate || mm.c_fp32 || mm.lda != 0 || mm.ldb != 0 || mm.ldc != 0) return false;
  if (!gelu_epilogue_takes(mm.m, mm.n, mm.k, {mm.a, mm.b, mm.c, aux})) return false;
  const void* bias = mm.bias;
  if (bias != nullptr && !detail::aligned16(bias)) {
    const auto bytes = static_cast<std::size_t>(mm.n * dtype_size(mm.dt));
    void* aligned = ctx.scratch(bytes, "linear bias");
    ZP_CUDA_CHECK(cudaMemcpyAsync(aligned, bias, bytes, cudaMemcpyDeviceToDevice, stream));
    bias = aligned;
  }
  // No algorithm for a GELU epilogue throws in make_plan (only the bias-gradient ones are optional).
  if (!launch(ctx, mm, bias, stream, derivative ? Epilogue::dgelu : Epilogue::gelu_aux_bias, aux))
    throw std::logic_error("matmul_gelu: a GELU epilogue's plan was marked optional");
  return true;
}

Matmul gemm_operands(void* c, const void* a, const void* b, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
                     bool trans_b, bool accumulate, DType dt, std::int64_t lda) {
  Matmul mm;
  mm.c = c;
  mm.a = a;
  mm.b = b;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.lda = lda == (trans_a ? m : k) ? 0 : lda;
  mm.trans_a = trans_a;
  mm.trans_b = trans_b;
  mm.accumulate = accumulate;
  mm.dt = dt;
  return mm;
}

void gemm(Context& ctx, void* c, const void* a, const void* b, std::int64_t m, std::int64_t n, std::int64_t k,
          bool trans_a, bool trans_b, bool accumulate, DType dt, cudaStream_t stream, std::int64_t lda) {
  matmul(ctx, gemm_operands(c, a, b, m, n, k, trans_a, trans_b, accumulate, dt, lda), stream);
}

namespace {

// One strided-batched product C[i] = op(A[i]) · op(B[i]) with the given batch strides.
void batched(Context& ctx, void* c, std::int64_t sc, const void* a, std::int64_t sa, const void* b, std::int64_t sb,
             std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
             bool accumulate, DType dt, cudaStream_t stream) {
  Matmul mm;
  mm.c = c;
  mm.a = a;
  mm.b = b;
  mm.batch = batch;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.stride_a = sa;
  mm.stride_b = sb;
  mm.stride_c = sc;
  mm.trans_a = trans_a;
  mm.trans_b = trans_b;
  mm.accumulate = accumulate;
  mm.dt = dt;
  matmul(ctx, mm, stream);
}

}  // namespace

void bmm_forward(Context& ctx, void* c, const void* a, const void* b, std::int64_t batch, std::int64_t m,
                 std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, DType dt, cudaStream_t stream) {
  batched(ctx, c, m * n, a, m * k, b, k * n, batch, m, n, k, trans_a, trans_b, false, dt, stream);
}

void bmm_backward(Context& ctx, void* da, void* db, const void* dc, const void* a, const void* b, std::int64_t batch,
                  std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, bool accumulate,
                  DType dt, cudaStream_t stream) {
  // d op(A) = dC · op(B)^T (m,k); d op(B) = op(A)^T · dC (k,n); then the stored layouts.
  if (da != nullptr) {
    if (!trans_a)
      batched(ctx, da, m * k, dc, m * n, b, k * n, batch, m, k, n, false, !trans_b, accumulate, dt, stream);
    else
      batched(ctx, da, m * k, b, k * n, dc, m * n, batch, k, m, n, trans_b, true, accumulate, dt, stream);
  }
  if (db != nullptr) {
    if (!trans_b)
      batched(ctx, db, k * n, a, m * k, dc, m * n, batch, k, n, m, !trans_a, false, accumulate, dt, stream);
    else
      batched(ctx, db, k * n, dc, m * n, a, m * k, batch, n, k, m, true, trans_a, accumulate, dt, stream);
  }
}

}  // namespace zp::kernels::cuda
