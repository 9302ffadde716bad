#include "kernels/cpu/reduce.hpp"

namespace zp::kernels::cpu {

namespace {

constexpr std::int64_t kBlock = 256;

template <class F>
double pairwise(const float* x, std::int64_t n, F term) {
  if (n <= kBlock) {
    double s = 0.0;
    for (std::int64_t i = 0; i < n; ++i) s += term(static_cast<double>(x[i]));
    return s;
  }
  // Split at a block boundary so each leaf is a whole block (except the last).
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::int64_t left = (blocks / 2) * kBlock;
  return pairwise(x, left, term) + pairwise(x + left, n - left, term);
}

}  // namespace

double sum_squares(const float* x, std::int64_t n) {
  return pairwise(x, n, [](double v) { return v * v; });
}

double sum(const float* x, std::int64_t n) {
  return pairwise(x, n, [](double v) { return v; });
}

}  // namespace zp::kernels::cpu
