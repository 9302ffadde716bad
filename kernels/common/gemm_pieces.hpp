#pragma once
// Pieces of a large product whose rows are not 16-byte aligned, staged through a scratch
// area with padded rows (kernels/cuda/bmm.cu runs them; tests/test_kernels_cpu.cpp runs the
// same plan on the CPU and checks it gives the product).
//
// cuBLASLt's fastest tensor-core kernels load whole 16-byte vectors, so an operand whose row
// stride is not a multiple of 16 bytes sends it to slower kernels: GPT-2's LM head (logits
// of 50257 columns) ran 5-8x slower than the same product with 50304 columns on an H200,
// in bf16, in PyTorch as in zeroplan (13.3 ms against 1.8 for the forward). The plan cuts
// the product into pieces along m (rows of C), never along k, so every output element stays
// one fp32 sum over the whole k with one rounding, as in the product run whole:
//   C's rows misaligned (n):      each piece is computed into scratch, then copied to C
//                                 (C's old rows copied in first when accumulating);
//   A (m,k) misaligned (k):       each piece of A's rows is copied into scratch first;
//   A stored (k,m) misaligned:    each piece of A's columns is copied into scratch first.
// B is never staged: a product whose B has misaligned rows, or whose A and C both do, is
// not planned (it runs as it is).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zp::kernels {

// The buffers a piece reads or writes.
enum class GemmBuffer { a, c, scratch };

// Rows [0, rows) of `width` elements: from src + src_offset (src_ld elements apart) to
// dst + dst_offset (dst_ld apart). Offsets and strides in elements.
struct RowCopy {
  GemmBuffer src = GemmBuffer::a, dst = GemmBuffer::scratch;
  std::int64_t src_offset = 0, src_ld = 0, dst_offset = 0, dst_ld = 0, width = 0, rows = 0;
};

// One product of `m` rows of C: op(A) read from a_buffer + a_offset with row stride lda, C
// written to c_buffer + c_offset with row stride ldc; B and k as in the whole product.
struct GemmPiece {
  std::vector<RowCopy> before;  // run before the product
  std::int64_t m = 0;
  GemmBuffer a_buffer = GemmBuffer::a, c_buffer = GemmBuffer::c;
  std::int64_t a_offset = 0, lda = 0, c_offset = 0, ldc = 0;
  std::vector<RowCopy> after;  // run after it
};

// Whether rows of `ld` elements of `elem` bytes keep every row 16-byte aligned, and the
// smallest such stride at least ld.
inline bool aligned_rows(std::int64_t ld, std::int64_t elem) { return (ld * elem) % 16 == 0; }
inline std::int64_t padded_rows(std::int64_t ld, std::int64_t elem) { return (ld * elem + 15) / 16 * 16 / elem; }

inline constexpr std::int64_t kMinGemmPiece = 16;  // rows (or columns) of a piece, at least

// Rows (or columns) per piece from what fits: a multiple of 128 (whole tiles of cuBLASLt's
// large kernels) when at least 128 fit, else of 16, so a piece's offset into A (by columns
// when A is stored (k,m)) keeps its 16-byte alignment; 0 when fewer than kMinGemmPiece fit.
inline std::int64_t gemm_piece_size(std::int64_t fits) {
  return fits >= 128 ? fits / 128 * 128 : fits / kMinGemmPiece * kMinGemmPiece;
}

// The pieces of C(m,n) (=|+=) op(A) · op(B), every operand packed, each element `elem` bytes,
// with `scratch_bytes` of scratch; empty when the product's rows are aligned, when it cannot
// be staged (B misaligned, A and C both misaligned), or when the scratch holds fewer than
// kMinGemmPiece rows of a piece. A (m,k) is stored (k,m) when trans_a; B (k,n) is (n,k) when
// trans_b.
inline std::vector<GemmPiece> plan_gemm_pieces(std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
                                               bool trans_b, bool accumulate, std::int64_t elem,
                                               std::size_t scratch_bytes) {
  std::vector<GemmPiece> pieces;
  if (m <= 0 || n <= 0 || k <= 0 || elem <= 0) return pieces;
  const std::int64_t ld_a = trans_a ? m : k, ld_b = trans_b ? k : n;
  const bool a_ok = aligned_rows(ld_a, elem), b_ok = aligned_rows(ld_b, elem), c_ok = aligned_rows(n, elem);
  if (!b_ok || (a_ok && c_ok) || (!a_ok && !c_ok)) return pieces;
  const auto room = static_cast<std::int64_t>(scratch_bytes);
  if (!c_ok) {  // C's rows, padded in scratch
    const std::int64_t ldc = padded_rows(n, elem), piece = gemm_piece_size(room / (ldc * elem));
    if (piece < kMinGemmPiece) return pieces;
    for (std::int64_t r0 = 0; r0 < m; r0 += piece) {
      GemmPiece p;
      p.m = std::min(piece, m - r0);
      p.a_offset = trans_a ? r0 : r0 * k;
      p.lda = ld_a;
      p.c_buffer = GemmBuffer::scratch;
      p.ldc = ldc;
      const RowCopy out{GemmBuffer::scratch, GemmBuffer::c, 0, ldc, r0 * n, n, n, p.m};
      if (accumulate) p.before.push_back({GemmBuffer::c, GemmBuffer::scratch, r0 * n, n, 0, ldc, n, p.m});
      p.after.push_back(out);
      pieces.push_back(p);
    }
    return pieces;
  }
  // A staged: pieces of its rows (A (m,k): each row padded to lda), or of its columns (A stored
  // (k,m): the piece's columns are the rows of op(A), each of A's k rows padded to the width).
  const std::int64_t per_row = trans_a ? k : padded_rows(k, elem);  // elements of scratch per row of op(A)
  const std::int64_t piece = gemm_piece_size(room / (per_row * elem));
  if (piece < kMinGemmPiece) return pieces;
  for (std::int64_t r0 = 0; r0 < m; r0 += piece) {
    GemmPiece p;
    p.m = std::min(piece, m - r0);
    p.lda = trans_a ? padded_rows(p.m, elem) : per_row;
    p.before.push_back(trans_a ? RowCopy{GemmBuffer::a, GemmBuffer::scratch, r0, m, 0, p.lda, p.m, k}
                               : RowCopy{GemmBuffer::a, GemmBuffer::scratch, r0 * k, k, 0, p.lda, k, p.m});
    p.a_buffer = GemmBuffer::scratch;
    p.c_offset = r0 * n;
    p.ldc = n;
    pieces.push_back(p);
  }
  return pieces;
}

}  // namespace zp::kernels
