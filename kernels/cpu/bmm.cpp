#include "kernels/cpu/bmm.hpp"

#include "kernels/cpu/isa.hpp"

namespace zp::kernels::cpu {

void gemm(float* c, const float* a, const float* b, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
          bool trans_b, bool accumulate) {
  static const GemmFn variant = gemm_fn(gemm_isa());  // kernels/cpu/isa.hpp: chosen at the first call
  variant(c, a, b, m, n, k, trans_a, trans_b, accumulate);
}

void bmm_forward(float* c, const float* a, const float* b, std::int64_t batch, std::int64_t m, std::int64_t n,
                 std::int64_t k, bool trans_a, bool trans_b) {
  for (std::int64_t i = 0; i < batch; ++i)
    gemm(c + i * m * n, a + i * m * k, b + i * k * n, m, n, k, trans_a, trans_b, false);
}

void bmm_backward(float* da, float* db, const float* dc, const float* a, const float* b, std::int64_t batch,
                  std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b, bool accumulate) {
  for (std::int64_t i = 0; i < batch; ++i) {
    const float* dci = dc + i * m * n;
    const float* ai = a + i * m * k;
    const float* bi = b + i * k * n;
    // d op(A) = dC · op(B)^T (m,k); d op(B) = op(A)^T · dC (k,n); then back to the stored layout.
    if (da != nullptr) {
      float* dai = da + i * m * k;
      if (!trans_a)
        gemm(dai, dci, bi, m, k, n, false, !trans_b, accumulate);
      else
        gemm(dai, bi, dci, k, m, n, trans_b, true, accumulate);
    }
    if (db != nullptr) {
      float* dbi = db + i * k * n;
      if (!trans_b)
        gemm(dbi, ai, dci, k, n, m, !trans_a, false, accumulate);
      else
        gemm(dbi, dci, ai, n, k, m, true, trans_a, accumulate);
    }
  }
}

}  // namespace zp::kernels::cpu
