#pragma once
// A large product whose rows are not 16-byte aligned, run as aligned products staged
// through a scratch area (kernels/cuda/bmm.cu runs the plan; tests/test_kernels_cpu.cpp runs
// the same plan on the CPU and checks it gives the product).
//
// cuBLASLt's fastest tensor-core kernels load whole 16-byte vectors, so an operand whose row
// stride is not a multiple of 16 bytes sends it to slower kernels, and so does an odd
// dimension even when every stride is aligned: GPT-2's LM head (logits of 50257 columns)
// ran 5-8x slower than the same product with 50304 columns on an H200, in bf16, in PyTorch
// as in zeroplan (13.3 ms against 1.8 for the forward), and padding only the strides left
// it as slow (14.9 ms). So the plan pads strides and cuts the odd dimension into an aligned
// part and a thin remainder:
//   C's rows misaligned (n odd):  pieces of C's rows computed into scratch rows of padded
//                                 stride, as two products: the first n8 columns (n8 the
//                                 largest multiple of 16 bytes) and the remaining few; each
//                                 element is one fp32 sum over the whole k, rounded once
//                                 (with a bias: into fp32 rows, the bias added as they are
//                                 rounded into C, since Hopper's fast kernels round the
//                                 product before adding C when beta is 1);
//   A (m,k) misaligned (k odd):   pieces of A's rows and columns copied into scratch with
//                                 aligned rows, the product's k in aligned parts (and a
//                                 thin remainder) summed in an fp32 accumulator in scratch,
//                                 rounded into C once at the end (with the bias and C's old
//                                 values: one rounding, as the product run whole);
//   A stored (k,m) misaligned:    pieces of A's columns copied into scratch with aligned
//                                 rows; the products run whole over k.
// B is never staged: a product whose B has misaligned rows, or whose A and C both do, is
// not planned (it runs as it is); nor is a bias with A stored (k,m) (no model has one).
//
// A product whose strides are all aligned (an operand stored with a padded row pitch: the
// logits of models::Tensor::row_pitch) is only cut, with no copies: the odd dimension that
// a tensor-core kernel loads along (n of C and of B stored (k,n); k of A stored (m,k) and of
// B stored (n,k); m of A stored (k,m)) into its aligned part and the thin rest, each a
// product on the operands in place. Parts of k are summed in an fp32 accumulator and
// rounded into C once, and so is a product with a bias (added as the sums are rounded).
// Accumulating (beta 1) into 16-bit C rounds the product first on the fast kernels, as
// PyTorch's gradient accumulation does (tests/gpu/harness.hpp's bound allows it).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/row_pitch.hpp"

namespace zp::kernels {

// The buffers a step reads or writes: the operands, the scratch (elements of the operands'
// type, after the accumulator), and the fp32 accumulator at the scratch's start.
enum class GemmBuffer { a, b, c, scratch, acc };

// Rows [0, rows) of `width` elements: from src + src_offset (src_ld elements apart) to
// dst + dst_offset (dst_ld apart). Offsets and strides in elements.
struct RowCopy {
  GemmBuffer src = GemmBuffer::a, dst = GemmBuffer::scratch;
  std::int64_t src_offset = 0, src_ld = 0, dst_offset = 0, dst_ld = 0, width = 0, rows = 0;
};

// C' (=|+=) op(A') · op(B'), (m, n, k): A' at a_buffer + a_offset with row stride lda (A' is
// stored (k,m) when the whole product's A is), B' at B + b_offset with B's own stride, C' at
// c_buffer + c_offset with row stride ldc (fp32 when c_buffer is acc); `accumulate`: beta 1.
struct GemmProduct {
  std::int64_t m = 0, n = 0, k = 0;
  GemmBuffer a_buffer = GemmBuffer::a, c_buffer = GemmBuffer::c;
  std::int64_t a_offset = 0, lda = 0, b_offset = 0, c_offset = 0, ldc = 0;
  bool accumulate = false;
};

// Rows [0, rows) of the accumulator (n fp32 columns, rows acc_ld apart, from acc_offset)
// rounded once into C's rows from c_offset (c_ld apart): C = acc (+ bias) (+ C's old value
// when accumulating).
struct GemmFinish {
  std::int64_t acc_offset = 0, acc_ld = 0, c_offset = 0, rows = 0, c_ld = 0;
};

struct GemmStep {
  enum class Kind { copy, product, finish } kind = Kind::copy;
  RowCopy copy;
  GemmProduct product;
  GemmFinish finish;
};

struct GemmPlan {
  std::vector<GemmStep> steps;   // in order, on one stream
  std::int64_t acc_bytes = 0;    // the fp32 accumulator's bytes at the scratch's start
  std::int64_t scratch_elems = 0;  // elements of the scratch used after it
  std::int64_t products = 0;
  bool empty() const { return steps.empty(); }
};

// Whether rows of `ld` elements of `elem` bytes keep every row 16-byte aligned, and the
// smallest such stride at least ld.
inline bool aligned_rows(std::int64_t ld, std::int64_t elem) { return (ld * elem) % 16 == 0; }
inline std::int64_t padded_rows(std::int64_t ld, std::int64_t elem) { return padded_row_elements(ld, elem); }

// The least m·n·k of a product the executor stages (kernels::cuda::ContextOptions::
// staged_min_work's default): smaller ones run as they are.
inline constexpr double kStagedMinWork = 2147483648.0;
// The scratch its plans run through (kernels::cuda::ContextOptions::scratch_bytes' default).
inline constexpr std::size_t kStagedScratchBytes = std::size_t{64} << 20;
inline constexpr std::int64_t kMinGemmPiece = 16;  // rows (or columns) of a piece, at least
inline constexpr std::int64_t kAccumulatorAlign = 256;  // bytes: where the scratch's elements start

// Rows (or columns) per piece from what fits: a multiple of 128 (whole tiles of cuBLASLt's
// large kernels) when at least 128 fit, else of 16, so a piece's offset into A (by columns
// when A is stored (k,m)) keeps its 16-byte alignment; 0 when fewer than kMinGemmPiece fit.
inline std::int64_t gemm_piece_size(std::int64_t fits) {
  return fits >= 128 ? fits / 128 * 128 : fits / kMinGemmPiece * kMinGemmPiece;
}

// `piece` (a multiple of `unit`) made as even as it can be over `total`: the fewest pieces
// of at most `piece`, each rounded up to `unit` (never past `piece`).
inline std::int64_t even_piece(std::int64_t total, std::int64_t piece, std::int64_t unit) {
  if (piece >= total) return total;
  const std::int64_t count = (total + piece - 1) / piece, share = (total + count - 1) / count;
  return std::min(piece, (share + unit - 1) / unit * unit);
}

namespace gemm_plan_detail {

inline GemmStep copy_step(const RowCopy& r) {
  GemmStep s;
  s.kind = GemmStep::Kind::copy;
  s.copy = r;
  return s;
}
// Appends a product to the plan.
inline void add_product(GemmPlan& plan, const GemmProduct& p) {
  GemmStep s;
  s.kind = GemmStep::Kind::product;
  s.product = p;
  plan.steps.push_back(s);
  ++plan.products;
}
inline GemmStep finish_step(const GemmFinish& f) {
  GemmStep s;
  s.kind = GemmStep::Kind::finish;
  s.finish = f;
  return s;
}

// C's rows misaligned (B stored (n,k) with aligned rows, A aligned): pieces of C's rows in
// scratch with a padded stride, each as the aligned columns' product and the rest's; with a
// bias the rows are fp32 in the accumulator and the finish adds the bias as it rounds them.
inline GemmPlan c_rows(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool accumulate, bool bias,
                       std::int64_t elem, std::int64_t room) {
  GemmPlan plan;
  const std::int64_t row_elem = bias ? 4 : elem, ldc = padded_rows(n, row_elem), unit = 16 / elem;
  const std::int64_t n8 = n / unit * unit;
  const std::int64_t piece = gemm_piece_size(room / (ldc * row_elem));
  if (piece < kMinGemmPiece) return plan;
  const std::int64_t rows_per = even_piece(m, piece, piece >= 128 ? 128 : kMinGemmPiece);
  const GemmBuffer rows_in = bias ? GemmBuffer::acc : GemmBuffer::scratch;
  for (std::int64_t r0 = 0; r0 < m; r0 += rows_per) {
    const std::int64_t pm = std::min(rows_per, m - r0);
    if (accumulate) plan.steps.push_back(copy_step({GemmBuffer::c, GemmBuffer::scratch, r0 * n, n, 0, ldc, n, pm}));
    for (const bool rest : {false, true}) {  // the aligned columns, then the rest
      const std::int64_t c0 = rest ? n8 : 0, width = rest ? n - n8 : n8;
      if (width <= 0) continue;
      add_product(plan, {.m = pm, .n = width, .k = k, .a_buffer = GemmBuffer::a, .c_buffer = rows_in,
                         .a_offset = trans_a ? r0 : r0 * k, .lda = trans_a ? m : k,
                         .b_offset = c0 * k,  // B stored (n,k)
                         .c_offset = c0, .ldc = ldc, .accumulate = accumulate});
    }
    if (bias)
      plan.steps.push_back(finish_step({0, ldc, r0 * n, pm, n}));
    else
      plan.steps.push_back(copy_step({GemmBuffer::scratch, GemmBuffer::c, 0, ldc, r0 * n, n, n, pm}));
  }
  if (bias)
    plan.acc_bytes = (std::min(rows_per, m) * ldc * 4 + kAccumulatorAlign - 1) / kAccumulatorAlign * kAccumulatorAlign;
  else
    plan.scratch_elems = std::min(rows_per, m) * ldc;
  return plan;
}

// A (m,k) with misaligned rows (B stored (k,n) with aligned rows, C aligned): blocks of A's
// rows, each summed over k in aligned parts (plus the thin remainder) into an fp32
// accumulator, then rounded into C once.
inline GemmPlan k_parts(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t elem, std::int64_t room) {
  GemmPlan plan;  // (the finish adds the bias and, when accumulating, C's old values)
  const std::int64_t unit = 16 / elem, k8 = k / unit * unit, tail = k - k8;
  // The accumulator takes a quarter of the scratch (half when that is under a piece): rows
  // as many as fit, so the products are tall; the parts of k take the rest.
  std::int64_t fits = room / 4 / (n * 4);
  if (fits < kMinGemmPiece && fits < m) fits = room / 2 / (n * 4);
  std::int64_t rows = fits >= m ? m : gemm_piece_size(fits);
  if (rows < kMinGemmPiece && rows < m) return plan;
  rows = even_piece(m, rows, rows >= 128 ? 128 : kMinGemmPiece);
  plan.acc_bytes = (rows * n * 4 + kAccumulatorAlign - 1) / kAccumulatorAlign * kAccumulatorAlign;
  const std::int64_t left = (room - plan.acc_bytes) / (rows * elem);  // columns of A per part
  std::int64_t part = left >= 64 ? left / 64 * 64 : left / unit * unit;
  if (part < unit) return GemmPlan{};
  if (k8 > 0) part = even_piece(k8, part, unit);
  for (std::int64_t r0 = 0; r0 < m; r0 += rows) {
    const std::int64_t pm = std::min(rows, m - r0);
    bool first = true;
    for (std::int64_t k0 = 0; k0 < k;) {
      const std::int64_t width = k0 < k8 ? std::min(part, k8 - k0) : tail, ld = padded_rows(width, elem);
      plan.steps.push_back(copy_step({GemmBuffer::a, GemmBuffer::scratch, r0 * k + k0, k, 0, ld, width, pm}));
      add_product(plan, {.m = pm, .n = n, .k = width, .a_buffer = GemmBuffer::scratch, .c_buffer = GemmBuffer::acc,
                         .a_offset = 0, .lda = ld,
                         .b_offset = k0 * n,  // B's rows k0.. (stored (k,n))
                         .c_offset = 0, .ldc = n, .accumulate = !first});
      plan.scratch_elems = std::max(plan.scratch_elems, pm * ld);
      first = false;
      k0 += width;
    }
    plan.steps.push_back(finish_step({0, n, r0 * n, pm, n}));
  }
  return plan;
}

// A stored (k,m) with misaligned rows (B and C aligned): pieces of A's columns (the rows of
// op(A)), each of A's k rows padded to the piece's width; the products run whole over k.
inline GemmPlan a_columns(std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate, std::int64_t elem,
                          std::int64_t room) {
  GemmPlan plan;
  const std::int64_t piece = gemm_piece_size(room / (k * elem));
  if (piece < kMinGemmPiece) return plan;
  for (std::int64_t r0 = 0; r0 < m; r0 += piece) {
    const std::int64_t pm = std::min(piece, m - r0), ld = padded_rows(pm, elem);
    plan.steps.push_back(copy_step({GemmBuffer::a, GemmBuffer::scratch, r0, m, 0, ld, pm, k}));
    add_product(plan, {.m = pm, .n = n, .k = k, .a_buffer = GemmBuffer::scratch, .c_buffer = GemmBuffer::c,
                       .a_offset = 0, .lda = ld, .b_offset = 0, .c_offset = r0 * n, .ldc = n,
                       .accumulate = accumulate});
    plan.scratch_elems = std::max(plan.scratch_elems, k * ld);
  }
  return plan;
}

// Every stride aligned (A's lda, B's ldb, C's ldc), some dimension odd: the aligned part and
// the thin rest of each odd dimension a kernel loads along, as products in place; through the
// fp32 accumulator (blocks of C's rows that never straddle m's cut) when k is cut or with a bias.
inline GemmPlan split(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, bool accumulate,
                      bool bias, std::int64_t elem, std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                      std::int64_t room) {
  GemmPlan plan;
  const std::int64_t unit = 16 / elem;
  // A dimension shorter than one 16-byte group has no aligned part to cut off.
  const bool cut_m = trans_a && m % unit != 0 && m > unit, cut_n = n % unit != 0 && n > unit,
             cut_k = (!trans_a || trans_b) && k % unit != 0 && k > unit;
  if (!cut_m && !cut_n && !cut_k) return plan;
  struct Part {
    std::int64_t first, width;
  };
  auto parts = [&](std::int64_t total, bool cut) {
    const std::int64_t aligned = total / unit * unit;
    if (!cut || aligned == 0) return std::vector<Part>{{0, total}};
    return std::vector<Part>{{0, aligned}, {aligned, total - aligned}};
  };
  const std::vector<Part> ms = parts(m, cut_m), ns = parts(n, cut_n), ks = parts(k, cut_k);
  auto product = [&](std::int64_t i0, std::int64_t iw, const Part& j, const Part& p, GemmBuffer c_buffer,
                     std::int64_t c_offset, std::int64_t c_ld, bool acc) {
    add_product(plan, {.m = iw, .n = j.width, .k = p.width, .a_buffer = GemmBuffer::a, .c_buffer = c_buffer,
                       .a_offset = trans_a ? p.first * lda + i0 : i0 * lda + p.first, .lda = lda,
                       .b_offset = trans_b ? j.first * ldb + p.first : p.first * ldb + j.first,
                       .c_offset = c_offset, .ldc = c_ld, .accumulate = acc});
  };
  if (!cut_k && !bias) {  // each element of C from one product, written (or added) in place
    for (const Part& i : ms)
      for (const Part& j : ns) product(i.first, i.width, j, ks.front(), GemmBuffer::c, i.first * ldc + j.first, ldc, accumulate);
    return plan;
  }
  const std::int64_t acc_ld = (n + 3) / 4 * 4;
  const std::int64_t fits = room / (acc_ld * 4);
  std::int64_t rows = fits >= m ? m : gemm_piece_size(fits);
  if (rows < kMinGemmPiece && rows < m) return plan;
  rows = even_piece(m, rows, rows >= 128 ? 128 : kMinGemmPiece);
  plan.acc_bytes = (rows * acc_ld * 4 + kAccumulatorAlign - 1) / kAccumulatorAlign * kAccumulatorAlign;
  if (plan.acc_bytes > room) return GemmPlan{};
  for (const Part& i : ms)
    for (std::int64_t r0 = i.first; r0 < i.first + i.width; r0 += rows) {
      const std::int64_t pm = std::min(rows, i.first + i.width - r0);
      for (const Part& j : ns)
        for (std::size_t q = 0; q < ks.size(); ++q) product(r0, pm, j, ks[q], GemmBuffer::acc, j.first, acc_ld, q > 0);
      plan.steps.push_back(finish_step({0, acc_ld, r0 * ldc, pm, ldc}));
    }
  return plan;
}

}  // namespace gemm_plan_detail

// The plan for C(m,n) (=|+=) op(A) · op(B) (+ a bias row when `bias`; never with
// accumulate), every operand packed, each element `elem` (2 or 4) bytes, with `scratch_bytes`
// of scratch; empty when the product's rows are aligned, when it cannot be staged (B
// misaligned, A and C both misaligned), or when the scratch holds too little. A (m,k) is
// stored (k,m) when trans_a; B (k,n) is (n,k) when trans_b.
inline GemmPlan plan_gemm_pieces(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                                 bool accumulate, bool bias, std::int64_t elem, std::size_t scratch_bytes) {
  if (m <= 0 || n <= 0 || k <= 0 || (elem != 2 && elem != 4) || (bias && accumulate)) return {};
  const std::int64_t ld_a = trans_a ? m : k, ld_b = trans_b ? k : n;
  const bool a_ok = aligned_rows(ld_a, elem), b_ok = aligned_rows(ld_b, elem), c_ok = aligned_rows(n, elem);
  if (!b_ok || (a_ok && c_ok) || (!a_ok && !c_ok)) return {};
  // Whole 256-byte units, so that the accumulator's rounded size stays inside.
  const auto room = static_cast<std::int64_t>(scratch_bytes) / kAccumulatorAlign * kAccumulatorAlign;
  // B aligned while C is not means B is stored (n,k); B aligned while A (m,k) is not means
  // B is stored (k,n): the plans below rely on it.
  if (!c_ok) return gemm_plan_detail::c_rows(m, n, k, trans_a, accumulate, bias, elem, room);
  if (!trans_a) return gemm_plan_detail::k_parts(m, n, k, elem, room);
  if (bias) return {};
  return gemm_plan_detail::a_columns(m, n, k, accumulate, elem, room);
}

// The plan for the same product with explicit row strides (0: packed): when every stride
// keeps its rows 16-byte aligned, the cut of the odd dimensions (gemm_plan_detail::split;
// empty when none is odd or the scratch holds too little); otherwise, for packed operands,
// plan_gemm_pieces; empty for any other.
inline GemmPlan plan_gemm(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                          bool accumulate, bool bias, std::int64_t elem, std::int64_t lda, std::int64_t ldb,
                          std::int64_t ldc, std::size_t scratch_bytes) {
  if (m <= 0 || n <= 0 || k <= 0 || (elem != 2 && elem != 4) || (bias && accumulate)) return {};
  const std::int64_t ld_a = lda != 0 ? lda : (trans_a ? m : k), ld_b = ldb != 0 ? ldb : (trans_b ? k : n),
                     ld_c = ldc != 0 ? ldc : n;
  if (aligned_rows(ld_a, elem) && aligned_rows(ld_b, elem) && aligned_rows(ld_c, elem)) {
    const auto room = static_cast<std::int64_t>(scratch_bytes) / kAccumulatorAlign * kAccumulatorAlign;
    return gemm_plan_detail::split(m, n, k, trans_a, trans_b, accumulate, bias, elem, ld_a, ld_b, ld_c, room);
  }
  if (lda != 0 || ldb != 0 || ldc != 0) return {};
  return plan_gemm_pieces(m, n, k, trans_a, trans_b, accumulate, bias, elem, scratch_bytes);
}

// The bytes a plan moves beyond what the product run whole would: its copies (read and
// written), its products' fp32 accumulator rows in place of C's (written, and read again where
// a part adds into them), and its finishes (the accumulator read, C written). What the time
// model prices the staging at (sim/compute_model.cpp).
inline double staged_extra_bytes(const GemmPlan& plan, std::int64_t elem) {
  double bytes = 0;
  for (const GemmStep& s : plan.steps) {
    switch (s.kind) {
      case GemmStep::Kind::copy:
        bytes += 2.0 * static_cast<double>(s.copy.rows) * static_cast<double>(s.copy.width) * static_cast<double>(elem);
        break;
      case GemmStep::Kind::product:
        if (s.product.c_buffer == GemmBuffer::acc)
          bytes += static_cast<double>(s.product.m) * static_cast<double>(s.product.n) *
                   (s.product.accumulate ? 8.0 : 4.0 - static_cast<double>(elem));
        break;
      case GemmStep::Kind::finish:
        bytes += static_cast<double>(s.finish.rows) * static_cast<double>(s.finish.acc_ld) * (4.0 + static_cast<double>(elem));
        break;
    }
  }
  return bytes;
}

}  // namespace zp::kernels
