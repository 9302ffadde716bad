// The Eigen GEMM, compiled once per instruction-set variant (kernels/cpu/isa.hpp): the build
// defines ZP_GEMM_VARIANT (baseline, avx2, avx512 or native) and the flags for it.
#include <cstdint>

#include "kernels/cpu/eigen.hpp"

#ifndef ZP_GEMM_VARIANT
#error "ZP_GEMM_VARIANT must name the instruction-set variant being built"
#endif

namespace zp::kernels::cpu::ZP_GEMM_VARIANT {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat>;
using Map = Eigen::Map<RowMat>;

template <class L, class R>
void product(Map& c, const L& l, const R& r, bool accumulate) {
  if (accumulate)
    c.noalias() += l * r;
  else
    c.noalias() = l * r;
}

}  // namespace

void gemm(float* c, const float* a, const float* b, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
          bool trans_b, bool accumulate) {
  Map cm(c, m, n);  // (m, n)
  if (k == 0) {
    if (!accumulate) cm.setZero();
    return;
  }
  const ConstMap am(a, trans_a ? k : m, trans_a ? m : k);  // (m, k) or (k, m)
  const ConstMap bm(b, trans_b ? n : k, trans_b ? k : n);  // (k, n) or (n, k)
  if (!trans_a && !trans_b)
    product(cm, am, bm, accumulate);
  else if (!trans_a)
    product(cm, am, bm.transpose(), accumulate);
  else if (!trans_b)
    product(cm, am.transpose(), bm, accumulate);
  else
    product(cm, am.transpose(), bm.transpose(), accumulate);
}

}  // namespace zp::kernels::cpu::ZP_GEMM_VARIANT
