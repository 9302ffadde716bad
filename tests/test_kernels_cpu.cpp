// CPU kernels: every backward against central finite differences of its forward (or, for
// linear maps, the adjoint identity <L x, y> = <x, L^T y>), the accumulate=true contract,
// and golden values (activations, softmax, layernorm, cross entropy, optimizers, 16-bit
// conversions, Philox).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/common/gemm_pieces.hpp"
#include "kernels/common/philox.hpp"
#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/bmm.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/dropout.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/layout.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cpu/rng.hpp"
#include "kernels/cpu/sdpa.hpp"

namespace kc = zp::kernels::cpu;

namespace {

using Vec = std::vector<float>;

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

// Uniform values in [lo, hi), reproducible from the seed.
Vec rand_vec(std::int64_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Vec v(sz(n));
  kc::uniform_fill(v.data(), n, seed, 0);
  for (float& x : v) x = lo + (hi - lo) * x;
  return v;
}

// Uniform magnitudes in [lo, hi) with a random sign (keeps inputs away from kinks at 0).
Vec rand_away_from_zero(std::int64_t n, std::uint64_t seed, float lo, float hi) {
  Vec v = rand_vec(n, seed, lo, hi);
  for (std::size_t i = 0; i < v.size(); ++i)
    if (kc::uniform(seed + 1000, i) < 0.5f) v[i] = -v[i];
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// Worst |analytic - fd| / (1 + |fd|) over the elements of x, with fd the central finite
// difference of f (a scalar function of the current contents of x).
double max_fd_error(Vec& x, const Vec& analytic, const std::function<double()>& f, float eps = 1e-2f) {
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + eps;
    const float xp = x[i];
    const double fp = f();
    x[i] = x0 - eps;
    const float xm = x[i];
    const double fm = f();
    x[i] = x0;
    const double fd = (fp - fm) / (static_cast<double>(xp) - static_cast<double>(xm));
    worst = std::max(worst, std::abs(fd - static_cast<double>(analytic[i])) / (1.0 + std::abs(fd)));
  }
  return worst;
}

constexpr double kFdTol = 1e-3;  // observed worst ~1e-4 at these sizes

// The accumulate contract of a backward call `bwd(accumulate)` writing `outs`: with
// accumulate=false every output is overwritten (they start as NaN); with accumulate=true
// each output becomes its previous contents plus that result. Returns the accumulate=false
// gradients.
std::vector<Vec> check_accumulate(const std::vector<Vec*>& outs, const std::function<void(bool)>& bwd) {
  for (Vec* o : outs) std::fill(o->begin(), o->end(), std::numeric_limits<float>::quiet_NaN());
  bwd(false);
  std::vector<Vec> fresh;
  for (Vec* o : outs) {
    CHECK(std::all_of(o->begin(), o->end(), [](float v) { return std::isfinite(v); }));
    fresh.push_back(*o);
  }
  std::vector<Vec> base;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    base.push_back(rand_vec(static_cast<std::int64_t>(outs[k]->size()), 900 + k));
    *outs[k] = base.back();
  }
  bwd(true);
  double worst = 0.0;
  for (std::size_t k = 0; k < outs.size(); ++k)
    for (std::size_t i = 0; i < outs[k]->size(); ++i) {
      const double want = static_cast<double>(base[k][i]) + static_cast<double>(fresh[k][i]);
      worst = std::max(worst, std::abs(static_cast<double>((*outs[k])[i]) - want) / (1.0 + std::abs(want)));
    }
  CHECK(worst < 1e-5);
  return fresh;
}

// A pointwise op y = f(x) with backward from the saved x (or y): FD and accumulate checks.
void check_pointwise(void (*fwd)(float*, const float*, std::int64_t),
                     void (*bwd)(float*, const float*, const float*, std::int64_t, bool), bool from_output, Vec x) {
  const auto n = static_cast<std::int64_t>(x.size());
  const Vec w = rand_vec(n, 77);
  Vec y(x.size()), dx(x.size());
  fwd(y.data(), x.data(), n);
  const Vec saved = from_output ? y : x;
  const auto g = check_accumulate({&dx}, [&](bool acc) { bwd(dx.data(), saved.data(), w.data(), n, acc); });
  Vec tmp(x.size());
  CHECK(max_fd_error(x, g[0], [&] {
          fwd(tmp.data(), x.data(), n);
          return dot(tmp, w);
        }) < kFdTol);
}

}  // namespace

// ------------------------------------------------------------------------------------
// GEMMs
// ------------------------------------------------------------------------------------

TEST_CASE("linear: forward against a naive loop, backward against finite differences") {
  const std::int64_t M = 3, K = 4, N = 5;
  Vec x = rand_vec(M * K, 1), w = rand_vec(N * K, 2), b = rand_vec(N, 3);
  const Vec dy = rand_vec(M * N, 4);
  Vec y(sz(M * N));
  kc::linear_forward(y.data(), x.data(), w.data(), b.data(), M, N, K);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = b[sz(j)];
      for (std::int64_t p = 0; p < K; ++p) s += static_cast<double>(x[sz(i * K + p)]) * w[sz(j * K + p)];
      CHECK(y[sz(i * N + j)] == zp::test::approx(s).epsilon(1e-5));
    }
  Vec dx(sz(M * K)), dw(sz(N * K)), db(sz(N));
  const auto g = check_accumulate({&dx, &dw, &db}, [&](bool acc) {
    kc::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), M, N, K, acc);
  });
  const auto loss = [&] {
    kc::linear_forward(y.data(), x.data(), w.data(), b.data(), M, N, K);
    return dot(y, dy);
  };
  CHECK(max_fd_error(x, g[0], loss) < kFdTol);
  CHECK(max_fd_error(w, g[1], loss) < kFdTol);
  CHECK(max_fd_error(b, g[2], loss) < kFdTol);

  // No bias, gradients skipped with nullptr.
  kc::linear_forward(y.data(), x.data(), w.data(), nullptr, M, N, K);
  Vec dx2(sz(M * K));
  kc::linear_backward(dx2.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), M, N, K, false);
  for (std::size_t i = 0; i < dx2.size(); ++i) CHECK(dx2[i] == zp::test::approx(g[0][i]).epsilon(1e-6));
}

TEST_CASE("conv1d (weight (in, out)): equals linear with the transposed weight; gradients") {
  const std::int64_t M = 4, K = 3, N = 6;
  Vec x = rand_vec(M * K, 11), w = rand_vec(K * N, 12), b = rand_vec(N, 13);
  const Vec dy = rand_vec(M * N, 14);
  Vec wt(sz(N * K));
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n) wt[sz(n * K + k)] = w[sz(k * N + n)];
  Vec y(sz(M * N)), y2(sz(M * N));
  kc::conv1d_forward(y.data(), x.data(), w.data(), b.data(), M, N, K);
  kc::linear_forward(y2.data(), x.data(), wt.data(), b.data(), M, N, K);
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == zp::test::approx(y2[i]).epsilon(1e-6));
  Vec dx(sz(M * K)), dw(sz(K * N)), db(sz(N));
  const auto g = check_accumulate({&dx, &dw, &db}, [&](bool acc) {
    kc::conv1d_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), M, N, K, acc);
  });
  const auto loss = [&] {
    kc::conv1d_forward(y.data(), x.data(), w.data(), b.data(), M, N, K);
    return dot(y, dy);
  };
  CHECK(max_fd_error(x, g[0], loss) < kFdTol);
  CHECK(max_fd_error(w, g[1], loss) < kFdTol);
  CHECK(max_fd_error(b, g[2], loss) < kFdTol);
}

// Each GEMM variant this binary carries and this CPU runs (kernels/cpu/isa.hpp), on shapes
// that exercise Eigen's packing edges (odd sizes, k below and above its block), against a
// double-precision reference. fp32 products summed over k carry at most about k·eps·Σ|a||b|
// of rounding whatever the order or fused multiply-adds; the bound checked is that, with
// eps = 2^-23. A variant must also give the same bits twice.
TEST_CASE("gemm: every instruction-set variant agrees with the double reference within fp32 rounding") {
  const auto variants = kc::built_isas();
  REQUIRE(!variants.empty());
  int ran = 0;
  for (const kc::Isa isa : variants) {
    if (!kc::cpu_supports(isa)) continue;
    ++ran;
    const kc::GemmFn gemm = kc::gemm_fn(isa);
    for (const auto [m, n, k] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 5}, {33, 17, 300}, {64, 96, 129}}) {
      for (int t = 0; t < 8; ++t) {
        const bool ta = (t & 1) != 0, tb = (t & 2) != 0, acc = (t & 4) != 0;
        CAPTURE(kc::isa_name(isa));
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(t);
        const Vec a = rand_vec(m * k, 31), b = rand_vec(k * n, 32), c0 = rand_vec(m * n, 33);
        Vec c = c0, again = c0;
        gemm(c.data(), a.data(), b.data(), m, n, k, ta, tb, acc);
        gemm(again.data(), a.data(), b.data(), m, n, k, ta, tb, acc);
        CHECK(std::memcmp(c.data(), again.data(), c.size() * sizeof(float)) == 0);
        double worst = 0.0;
        for (std::int64_t r = 0; r < m; ++r)
          for (std::int64_t col = 0; col < n; ++col) {
            double s = acc ? c0[sz(r * n + col)] : 0.0, mag = std::abs(s);
            for (std::int64_t p = 0; p < k; ++p) {
              const double av = ta ? a[sz(p * m + r)] : a[sz(r * k + p)];
              const double bv = tb ? b[sz(col * k + p)] : b[sz(p * n + col)];
              s += av * bv;
              mag += std::abs(av * bv);
            }
            const double bound = static_cast<double>(k + 2) * std::ldexp(1.0, -23) * mag;
            worst = std::max(worst, std::abs(c[sz(r * n + col)] - s) / bound);
          }
        CHECK(worst <= 1.0);
      }
    }
  }
  CHECK(ran >= 1);
  // The variant the kernels use is one of them.
  const kc::Isa used = kc::gemm_isa();
  CHECK(std::find(variants.begin(), variants.end(), used) != variants.end());
  CHECK(kc::cpu_supports(used));
}

TEST_CASE("gemm: the variants are different code (each keeps its own Eigen instantiations)") {
  // The baseline variant multiplies and adds apart; AVX2 and AVX-512 fuse them (FMA) and block
  // differently, so over a long dot product their bits differ somewhere. Were the variants to
  // share one copy of Eigen's product kernels (the linker keeps one copy of a template
  // instantiation unless each variant keeps its own), they would agree bit for bit.
  const auto variants = kc::built_isas();
  if (std::find(variants.begin(), variants.end(), kc::Isa::baseline) == variants.end()) {
    MESSAGE("one GEMM variant only (ZEROPLAN_NATIVE=ON): nothing to compare");
    return;
  }
  const std::int64_t m = 16, n = 16, k = 1000;
  const Vec a = rand_vec(m * k, 41), b = rand_vec(k * n, 42);
  Vec base(sz(m * n));
  kc::gemm_fn(kc::Isa::baseline)(base.data(), a.data(), b.data(), m, n, k, false, false, false);
  int compared = 0;
  for (const kc::Isa isa : variants) {
    if (isa == kc::Isa::baseline || !kc::cpu_supports(isa)) continue;
    CAPTURE(kc::isa_name(isa));
    Vec c(sz(m * n));
    kc::gemm_fn(isa)(c.data(), a.data(), b.data(), m, n, k, false, false, false);
    CHECK(std::memcmp(c.data(), base.data(), c.size() * sizeof(float)) != 0);
    ++compared;
  }
  MESSAGE(compared << " variant(s) beside the baseline on this CPU");
}

TEST_CASE("bmm: every transpose combination, forward and both operand gradients") {
  const std::int64_t batch = 2, m = 3, n = 4, k = 5;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      Vec a = rand_vec(batch * m * k, 21), b = rand_vec(batch * k * n, 22);
      const Vec dc = rand_vec(batch * m * n, 23);
      Vec c(sz(batch * m * n));
      kc::bmm_forward(c.data(), a.data(), b.data(), batch, m, n, k, ta != 0, tb != 0);
      for (std::int64_t i = 0; i < batch; ++i)
        for (std::int64_t r = 0; r < m; ++r)
          for (std::int64_t col = 0; col < n; ++col) {
            double s = 0.0;
            for (std::int64_t p = 0; p < k; ++p) {
              const float av = ta ? a[sz(i * m * k + p * m + r)] : a[sz(i * m * k + r * k + p)];
              const float bv = tb ? b[sz(i * k * n + col * k + p)] : b[sz(i * k * n + p * n + col)];
              s += static_cast<double>(av) * bv;
            }
            CHECK(c[sz((i * m + r) * n + col)] == zp::test::approx(s).epsilon(1e-5));
          }
      Vec da(a.size()), db(b.size());
      const auto g = check_accumulate({&da, &db}, [&](bool acc) {
        kc::bmm_backward(da.data(), db.data(), dc.data(), a.data(), b.data(), batch, m, n, k, ta != 0, tb != 0, acc);
      });
      const auto loss = [&] {
        kc::bmm_forward(c.data(), a.data(), b.data(), batch, m, n, k, ta != 0, tb != 0);
        return dot(c, dc);
      };
      CHECK(max_fd_error(a, g[0], loss) < kFdTol);
      CHECK(max_fd_error(b, g[1], loss) < kFdTol);
    }
}

TEST_CASE("linear: bitwise identical results run after run") {
  const std::int64_t M = 64, K = 96, N = 80;
  const Vec x = rand_vec(M * K, 31), w = rand_vec(N * K, 32), dy = rand_vec(M * N, 33);
  Vec y1(sz(M * N)), y2(sz(M * N)), dw1(sz(N * K)), dw2(sz(N * K));
  kc::linear_forward(y1.data(), x.data(), w.data(), nullptr, M, N, K);
  kc::linear_forward(y2.data(), x.data(), w.data(), nullptr, M, N, K);
  kc::linear_backward(nullptr, dw1.data(), nullptr, dy.data(), x.data(), w.data(), M, N, K, false);
  kc::linear_backward(nullptr, dw2.data(), nullptr, dy.data(), x.data(), w.data(), M, N, K, false);
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(dw1.data(), dw2.data(), dw1.size() * sizeof(float)) == 0);
}

// ------------------------------------------------------------------------------------
// Softmax, masks, rope
// ------------------------------------------------------------------------------------

TEST_CASE("softmax: rows sum to 1, masked entries are exactly 0, gradient") {
  const std::int64_t rows = 4, n = 7;
  Vec x = rand_vec(rows * n, 41, -3.0f, 3.0f);
  x[2] = kc::kMaskValue;                               // finfo.min entry
  x[n + 5] = -std::numeric_limits<float>::infinity();  // -inf entry
  Vec y(x.size());
  kc::softmax_forward(y.data(), x.data(), rows, n);
  for (std::int64_t i = 0; i < rows; ++i) {
    double s = 0.0;
    for (std::int64_t j = 0; j < n; ++j) s += y[sz(i * n + j)];
    CHECK(s == zp::test::approx(1.0).epsilon(1e-6));
  }
  CHECK(y[2] == 0.0f);
  CHECK(y[sz(n + 5)] == 0.0f);

  // Fully -inf row: zeros (not NaN); fully finfo.min row: uniform (as HF).
  Vec inf_row(sz(n), -std::numeric_limits<float>::infinity()), min_row(sz(n), kc::kMaskValue), out(sz(n));
  kc::softmax_forward(out.data(), inf_row.data(), 1, n);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
  kc::softmax_forward(out.data(), min_row.data(), 1, n);
  for (float v : out) CHECK(v == zp::test::approx(1.0 / static_cast<double>(n)));

  Vec xs = rand_vec(rows * n, 42, -2.0f, 2.0f);
  const Vec w = rand_vec(rows * n, 43);
  kc::softmax_forward(y.data(), xs.data(), rows, n);
  Vec dx(x.size());
  const auto g =
      check_accumulate({&dx}, [&](bool acc) { kc::softmax_backward(dx.data(), y.data(), w.data(), rows, n, acc); });
  Vec tmp(x.size());
  CHECK(max_fd_error(xs, g[0], [&] {
          kc::softmax_forward(tmp.data(), xs.data(), rows, n);
          return dot(tmp, w);
        }) < kFdTol);
  // Through a temporary, as PyTorch's CUDA kernel: tmp = dy * y, then dx = tmp - y * Σ tmp.
  Vec scratch(x.size()), dxt(x.size());
  const auto gt = check_accumulate(
      {&dxt}, [&](bool acc) { kc::softmax_backward(dxt.data(), y.data(), w.data(), scratch.data(), rows, n, acc); });
  for (std::size_t i = 0; i < scratch.size(); ++i) CHECK(scratch[i] == w[i] * y[i]);
  for (std::size_t i = 0; i < dxt.size(); ++i) CHECK(gt[0][i] == zp::test::approx(g[0][i]).epsilon(1e-5));
}

TEST_CASE("masks: causal and padding builders, causal_where") {
  const std::int64_t T = 4;
  Vec m(sz(T * T));
  kc::causal_mask(m.data(), T);
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < T; ++j) CHECK(m[sz(i * T + j)] == (j > i ? kc::kMaskValue : 0.0f));
  const std::vector<std::int64_t> am{1, 1, 0, 0, 1, 0, 1, 1};
  Vec pm(am.size());
  kc::padding_mask(pm.data(), am.data(), 2, T);
  for (std::size_t i = 0; i < am.size(); ++i) CHECK(pm[i] == (am[i] != 0 ? 0.0f : kc::kMaskValue));

  // Scores + causal mask (1,1,T,T) through softmax: exactly 0 above the diagonal.
  const std::int64_t B = 2, H = 3;
  const Vec s = rand_vec(B * H * T * T, 44, -5.0f, 5.0f);
  Vec sm(s.size()), p(s.size()), pw(s.size());
  kc::add_broadcast_forward(sm.data(), s.data(), m.data(), {B, H, T, T}, {1, 1, T, T});
  kc::softmax_forward(p.data(), sm.data(), B * H * T, T);
  kc::causal_where_forward(pw.data(), s.data(), B * H, T);
  Vec p2(s.size());
  kc::softmax_forward(p2.data(), pw.data(), B * H * T, T);
  for (std::int64_t r = 0; r < B * H * T; ++r)
    for (std::int64_t j = 0; j < T; ++j) {
      const auto idx = sz(r * T + j);
      if (j > r % T) {
        CHECK(p[idx] == 0.0f);
        CHECK(p2[idx] == 0.0f);
      }
      CHECK(p[idx] == zp::test::approx(p2[idx]).epsilon(1e-6));
    }

  // causal_where's backward is its adjoint (a linear map where it passes x through).
  const Vec dy = rand_vec(static_cast<std::int64_t>(s.size()), 45);
  Vec dx(s.size());
  const auto g =
      check_accumulate({&dx}, [&](bool acc) { kc::causal_where_backward(dx.data(), dy.data(), B * H, T, acc); });
  kc::causal_where_forward(pw.data(), s.data(), B * H, T, 0.0f);
  CHECK(dot(pw, dy) == zp::test::approx(dot(s, g[0])).epsilon(1e-9));
}

TEST_CASE("rope: HF tables, rotate_half convention, norm preserving, adjoint backward") {
  const std::int64_t B = 2, H = 2, T = 3, D = 4;
  Vec cs(sz(T * D)), sn(sz(T * D));
  kc::rope_tables(cs.data(), sn.data(), T, D, 10000.0f);
  // inv_freq = {1, 1/100}; position 2: freqs {2, 0.02}, emb = cat(freqs, freqs).
  CHECK(cs[sz(2 * D + 0)] == zp::test::approx(std::cos(2.0)).epsilon(1e-6));
  CHECK(cs[sz(2 * D + 2)] == zp::test::approx(std::cos(2.0)).epsilon(1e-6));
  CHECK(sn[sz(2 * D + 1)] == zp::test::approx(std::sin(0.02)).epsilon(1e-6));
  CHECK(sn[sz(2 * D + 3)] == zp::test::approx(std::sin(0.02)).epsilon(1e-6));
  CHECK(cs[0] == 1.0f);
  CHECK(sn[0] == 0.0f);

  // One row by hand: y = x*cos + cat(-x[2:], x[:2])*sin.
  const Vec x1{1.0f, 2.0f, 3.0f, 4.0f};
  Vec y1(4);
  kc::rope_forward(y1.data(), x1.data(), cs.data() + D, sn.data() + D, 1, 1, 1, D);
  const float* c = cs.data() + D;
  const float* s = sn.data() + D;
  CHECK(y1[0] == zp::test::approx(1.0 * c[0] - 3.0 * s[0]));
  CHECK(y1[1] == zp::test::approx(2.0 * c[1] - 4.0 * s[1]));
  CHECK(y1[2] == zp::test::approx(3.0 * c[2] + 1.0 * s[2]));
  CHECK(y1[3] == zp::test::approx(4.0 * c[3] + 2.0 * s[3]));

  const Vec x = rand_vec(B * H * T * D, 51);
  Vec y(x.size());
  kc::rope_forward(y.data(), x.data(), cs.data(), sn.data(), B, H, T, D);
  CHECK(dot(y, y) == zp::test::approx(dot(x, x)).epsilon(1e-6));
  const Vec dy = rand_vec(B * H * T * D, 52);
  Vec dx(x.size());
  const auto g = check_accumulate(
      {&dx}, [&](bool acc) { kc::rope_backward(dx.data(), dy.data(), cs.data(), sn.data(), B, H, T, D, acc); });
  CHECK(dot(y, dy) == zp::test::approx(dot(x, g[0])).epsilon(1e-6));
}

// ------------------------------------------------------------------------------------
// Normalisation
// ------------------------------------------------------------------------------------

TEST_CASE("layernorm: normalised rows (mean 0, var 1), gradients for x, weight, bias") {
  const std::int64_t rows = 3, C = 8;
  const float eps = 1e-5f;
  Vec x = rand_vec(rows * C, 61, -2.0f, 2.0f), w = rand_vec(C, 62, 0.5f, 1.5f), b = rand_vec(C, 63);
  Vec y(x.size()), mean(sz(rows)), rstd(sz(rows));
  kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), nullptr, nullptr, rows, C, eps);
  for (std::int64_t i = 0; i < rows; ++i) {
    double s = 0.0, s2 = 0.0;
    for (std::int64_t j = 0; j < C; ++j) s += y[sz(i * C + j)];
    for (std::int64_t j = 0; j < C; ++j) s2 += static_cast<double>(y[sz(i * C + j)]) * y[sz(i * C + j)];
    CHECK(std::abs(s / C) < 1e-6);
    CHECK(s2 / C == zp::test::approx(1.0).epsilon(1e-4));  // eps shifts it by ~eps/var
  }
  const Vec dy = rand_vec(rows * C, 64);
  kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, eps);
  Vec dx(x.size()), dw(sz(C)), db(sz(C));
  const auto g = check_accumulate({&dx, &dw, &db}, [&](bool acc) {
    kc::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), mean.data(), rstd.data(), w.data(),
                           rows, C, acc);
  });
  Vec m2(sz(rows)), r2(sz(rows));
  const auto loss = [&] {
    kc::layernorm_forward(y.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), rows, C, eps);
    return dot(y, dy);
  };
  CHECK(max_fd_error(x, g[0], loss, 1e-3f) < kFdTol);
  CHECK(max_fd_error(w, g[1], loss, 1e-3f) < kFdTol);
  CHECK(max_fd_error(b, g[2], loss, 1e-3f) < kFdTol);

  // Without affine parameters.
  kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), nullptr, nullptr, rows, C, eps);
  const auto g2 = check_accumulate({&dx}, [&](bool acc) {
    kc::layernorm_backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), mean.data(), rstd.data(), nullptr, rows, C,
                           acc);
  });
  CHECK(max_fd_error(
            x, g2[0],
            [&] {
              kc::layernorm_forward(y.data(), m2.data(), r2.data(), x.data(), nullptr, nullptr, rows, C, eps);
              return dot(y, dy);
            },
            1e-3f) < kFdTol);
}

TEST_CASE("rmsnorm pieces: pow2, rms_rsqrt, mul_rowscale, mul_weight, and their composition") {
  const std::int64_t rows = 3, C = 6;
  const float eps = 1e-6f;
  check_pointwise(kc::pow2_forward, kc::pow2_backward, false, rand_vec(rows * C, 71));

  Vec sq = rand_vec(rows * C, 72, 0.1f, 1.0f);
  const Vec dr = rand_vec(rows, 73);
  Vec r(sz(rows)), dsq(sq.size());
  kc::rms_rsqrt_forward(r.data(), sq.data(), rows, C, eps);
  const auto g = check_accumulate(
      {&dsq}, [&](bool acc) { kc::rms_rsqrt_backward(dsq.data(), dr.data(), r.data(), rows, C, acc); });
  CHECK(max_fd_error(
            sq, g[0],
            [&] {
              kc::rms_rsqrt_forward(r.data(), sq.data(), rows, C, eps);
              return dot(r, dr);
            },
            1e-3f) < kFdTol);

  Vec x = rand_vec(rows * C, 74), rs = rand_vec(rows, 75, 0.5f, 2.0f), w = rand_vec(C, 76, 0.5f, 1.5f);
  const Vec dy = rand_vec(rows * C, 77);
  Vec y(x.size()), dx(x.size()), drs(sz(rows)), dw(sz(C));
  const auto gr = check_accumulate({&dx, &drs}, [&](bool acc) {
    kc::mul_rowscale_backward(dx.data(), drs.data(), dy.data(), x.data(), rs.data(), rows, C, acc);
  });
  const auto loss_r = [&] {
    kc::mul_rowscale_forward(y.data(), x.data(), rs.data(), rows, C);
    return dot(y, dy);
  };
  CHECK(max_fd_error(x, gr[0], loss_r) < kFdTol);
  CHECK(max_fd_error(rs, gr[1], loss_r) < kFdTol);
  const auto gw = check_accumulate({&dx, &dw}, [&](bool acc) {
    kc::mul_weight_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rows, C, acc);
  });
  const auto loss_w = [&] {
    kc::mul_weight_forward(y.data(), x.data(), w.data(), rows, C);
    return dot(y, dy);
  };
  CHECK(max_fd_error(x, gw[0], loss_w) < kFdTol);
  CHECK(max_fd_error(w, gw[1], loss_w) < kFdTol);

  // weight * (x * rsqrt(mean(x^2) + eps)) as LlamaRMSNorm.
  Vec s2(x.size()), r2(sz(rows)), n2(x.size()), out(x.size());
  kc::pow2_forward(s2.data(), x.data(), rows * C);
  kc::rms_rsqrt_forward(r2.data(), s2.data(), rows, C, eps);
  kc::mul_rowscale_forward(n2.data(), x.data(), r2.data(), rows, C);
  kc::mul_weight_forward(out.data(), n2.data(), w.data(), rows, C);
  for (std::int64_t i = 0; i < rows; ++i) {
    double ms = 0.0;
    for (std::int64_t j = 0; j < C; ++j) ms += static_cast<double>(x[sz(i * C + j)]) * x[sz(i * C + j)];
    const double inv = 1.0 / std::sqrt(ms / C + eps);
    for (std::int64_t j = 0; j < C; ++j)
      CHECK(out[sz(i * C + j)] == zp::test::approx(x[sz(i * C + j)] * inv * w[sz(j)]).epsilon(1e-5));
  }
}

// ------------------------------------------------------------------------------------
// Activations and elementwise ops
// ------------------------------------------------------------------------------------

TEST_CASE("activations: golden values") {
  const Vec one{1.0f};
  Vec y(1);
  kc::gelu_forward(y.data(), one.data(), 1);
  CHECK(y[0] == zp::test::approx(0.8413447).epsilon(1e-6));
  kc::gelu_tanh_forward(y.data(), one.data(), 1);
  CHECK(y[0] == zp::test::approx(0.8411920).epsilon(1e-6));
  kc::silu_forward(y.data(), one.data(), 1);
  CHECK(y[0] == zp::test::approx(0.7310586).epsilon(1e-6));
  kc::tanh_forward(y.data(), one.data(), 1);
  CHECK(y[0] == zp::test::approx(0.7615942).epsilon(1e-6));
  const Vec neg{-2.0f};
  kc::relu_forward(y.data(), neg.data(), 1);
  CHECK(y[0] == 0.0f);
  const Vec nan{std::numeric_limits<float>::quiet_NaN()};
  kc::relu_forward(y.data(), nan.data(), 1);
  CHECK(std::isnan(y[0]));
}

TEST_CASE("activations: backward against finite differences") {
  const Vec x = rand_vec(40, 81, -3.0f, 3.0f);
  check_pointwise(kc::gelu_forward, kc::gelu_backward, false, x);
  check_pointwise(kc::gelu_tanh_forward, kc::gelu_tanh_backward, false, x);
  check_pointwise(kc::silu_forward, kc::silu_backward, false, x);
  check_pointwise(kc::tanh_forward, kc::tanh_backward, true, x);
  check_pointwise(kc::relu_forward, kc::relu_backward, true, rand_away_from_zero(40, 82, 0.1f, 2.0f));
  check_pointwise(kc::pow3_forward, kc::pow3_backward, false, x);
}

TEST_CASE("gelu_new as GPT-2 writes it (scale, pow3, add, tanh, add_scalar, mul) matches gelu_tanh") {
  const std::int64_t n = 50;
  const Vec x = rand_vec(n, 83, -4.0f, 4.0f);
  Vec half(sz(n)), cube(sz(n)), c3(sz(n)), inner(sz(n)), arg(sz(n)), th(sz(n)), one_p(sz(n)), y(sz(n)), ref(sz(n));
  kc::scale_forward(half.data(), x.data(), n, 0.5f);
  kc::pow3_forward(cube.data(), x.data(), n);
  kc::scale_forward(c3.data(), cube.data(), n, 0.044715f);
  kc::add_forward(inner.data(), x.data(), c3.data(), n);
  kc::scale_forward(arg.data(), inner.data(), n, static_cast<float>(std::sqrt(2.0 / 3.14159265358979323846)));
  kc::tanh_forward(th.data(), arg.data(), n);
  kc::add_scalar_forward(one_p.data(), th.data(), n, 1.0f);
  kc::mul_forward(y.data(), half.data(), one_p.data(), n);
  kc::gelu_tanh_forward(ref.data(), x.data(), n);
  for (std::int64_t i = 0; i < n; ++i) CHECK(y[sz(i)] == zp::test::approx(ref[sz(i)]).epsilon(1e-5));
}

TEST_CASE("elementwise: add, mul, scale, add_scalar gradients and accumulation") {
  const std::int64_t n = 12;
  Vec a = rand_vec(n, 91), b = rand_vec(n, 92);
  const Vec dy = rand_vec(n, 93);
  Vec y(sz(n)), da(sz(n)), db(sz(n));
  const auto ga =
      check_accumulate({&da, &db}, [&](bool acc) { kc::add_backward(da.data(), db.data(), dy.data(), n, acc); });
  for (std::int64_t i = 0; i < n; ++i) {
    CHECK(ga[0][sz(i)] == dy[sz(i)]);
    CHECK(ga[1][sz(i)] == dy[sz(i)]);
  }
  const auto gm = check_accumulate(
      {&da, &db}, [&](bool acc) { kc::mul_backward(da.data(), db.data(), dy.data(), a.data(), b.data(), n, acc); });
  const auto loss_m = [&] {
    kc::mul_forward(y.data(), a.data(), b.data(), n);
    return dot(y, dy);
  };
  CHECK(max_fd_error(a, gm[0], loss_m) < kFdTol);
  CHECK(max_fd_error(b, gm[1], loss_m) < kFdTol);
  const auto gs = check_accumulate({&da}, [&](bool acc) { kc::scale_backward(da.data(), dy.data(), n, -0.25f, acc); });
  CHECK(max_fd_error(a, gs[0], [&] {
          kc::scale_forward(y.data(), a.data(), n, -0.25f);
          return dot(y, dy);
        }) < kFdTol);
  const auto gc = check_accumulate({&da}, [&](bool acc) { kc::add_scalar_backward(da.data(), dy.data(), n, acc); });
  CHECK(max_fd_error(a, gc[0], [&] {
          kc::add_scalar_forward(y.data(), a.data(), n, 3.0f);
          return dot(y, dy);
        }) < kFdTol);
  kc::add_scalar_forward(y.data(), a.data(), n, 3.0f);
  CHECK(y[0] == a[0] + 3.0f);
}

TEST_CASE("add_broadcast: attention masks and position embeddings, gradient summed over broadcast dims") {
  const std::int64_t B = 2, H = 3, T = 4;
  const std::vector<std::pair<kc::Dims4, kc::Dims4>> cases{
      {{B, H, T, T}, {B, 1, 1, T}},  // BERT's extended mask
      {{B, H, T, T}, {1, 1, T, T}},  // causal mask
      {{1, B, T, 5}, {1, 1, T, 5}},  // (1,T,C) position embeddings over (B,T,C)
      {{B, H, T, T}, {B, H, T, T}},  // no broadcast
  };
  for (const auto& dims_and_b : cases) {
    const kc::Dims4 dims = dims_and_b.first, bd = dims_and_b.second;
    const std::int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    const std::int64_t nb = bd[0] * bd[1] * bd[2] * bd[3];
    Vec a = rand_vec(n, 101), b = rand_vec(nb, 102);
    const Vec dy = rand_vec(n, 103);
    Vec y(sz(n));
    kc::add_broadcast_forward(y.data(), a.data(), b.data(), dims, bd);
    // Element (i0,i1,i2,i3) reads b at the broadcast index.
    std::int64_t idx = 0;
    for (std::int64_t i0 = 0; i0 < dims[0]; ++i0)
      for (std::int64_t i1 = 0; i1 < dims[1]; ++i1)
        for (std::int64_t i2 = 0; i2 < dims[2]; ++i2)
          for (std::int64_t i3 = 0; i3 < dims[3]; ++i3, ++idx) {
            const std::int64_t j0 = bd[0] == 1 ? 0 : i0, j1 = bd[1] == 1 ? 0 : i1, j2 = bd[2] == 1 ? 0 : i2,
                               j3 = bd[3] == 1 ? 0 : i3;
            const std::int64_t bi = ((j0 * bd[1] + j1) * bd[2] + j2) * bd[3] + j3;
            CHECK(y[sz(idx)] == a[sz(idx)] + b[sz(bi)]);
          }
    Vec da(sz(n)), dbv(sz(nb));
    const auto g = check_accumulate(
        {&da, &dbv}, [&](bool acc) { kc::add_broadcast_backward(da.data(), dbv.data(), dy.data(), dims, bd, acc); });
    const auto loss = [&] {
      kc::add_broadcast_forward(y.data(), a.data(), b.data(), dims, bd);
      return dot(y, dy);
    };
    CHECK(max_fd_error(a, g[0], loss) < kFdTol);
    CHECK(max_fd_error(b, g[1], loss) < kFdTol);
  }
}

// ------------------------------------------------------------------------------------
// Layout copies (linear maps: the backward is the adjoint)
// ------------------------------------------------------------------------------------

TEST_CASE("split_heads / merge_heads: permutation, GPT-2 qkv split, adjoint backward") {
  const std::int64_t B = 2, T = 3, H = 2, D = 4, C = H * D, W = 3 * C;
  const Vec qkv = rand_vec(B * T * W, 111);
  Vec q(sz(B * H * T * D)), k(q.size()), v(q.size());
  kc::split_heads_forward(q.data(), qkv.data(), B, T, H, D, W, 0);
  kc::split_heads_forward(k.data(), qkv.data(), B, T, H, D, W, C);
  kc::split_heads_forward(v.data(), qkv.data(), B, T, H, D, W, 2 * C);
  CHECK(k[sz(((1 * H + 1) * T + 2) * D + 3)] == qkv[sz((1 * T + 2) * W + C + 1 * D + 3)]);
  CHECK(v[sz(((0 * H + 1) * T + 1) * D + 0)] == qkv[sz((0 * T + 1) * W + 2 * C + 1 * D + 0)]);

  // Backward: three disjoint consumers of qkv, each writing its own columns and no other.
  const Vec dq = rand_vec(static_cast<std::int64_t>(q.size()), 112),
            dk = rand_vec(static_cast<std::int64_t>(q.size()), 113),
            dv = rand_vec(static_cast<std::int64_t>(q.size()), 114);
  Vec dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  kc::split_heads_backward(dqkv.data(), dq.data(), B, T, H, D, W, 0, false);
  kc::split_heads_backward(dqkv.data(), dk.data(), B, T, H, D, W, C, false);
  CHECK(std::isnan(dqkv[sz(2 * C)]));  // v's columns not yet written
  kc::split_heads_backward(dqkv.data(), dv.data(), B, T, H, D, W, 2 * C, false);
  CHECK(dot(q, dq) + dot(k, dk) + dot(v, dv) == zp::test::approx(dot(qkv, dqkv)).epsilon(1e-9));
  // Adding into k's columns adds dk there and leaves q's and v's as they were.
  Vec added = dqkv;
  kc::split_heads_backward(added.data(), dk.data(), B, T, H, D, W, C, true);
  for (std::int64_t r = 0; r < B * T; ++r)
    for (std::int64_t c = 0; c < W; ++c) {
      const auto i = sz(r * W + c);
      if (c < C || c >= 2 * C) CHECK(added[i] == dqkv[i]);
      else CHECK(added[i] == zp::test::approx(2.0 * dqkv[i]).epsilon(1e-6));
    }

  // merge_heads undoes the (B,T,H,D) -> (B,H,T,D) permutation.
  const Vec x = rand_vec(B * T * C, 115);
  Vec heads(x.size()), back(x.size());
  kc::split_heads_forward(heads.data(), x.data(), B, T, H, D, C, 0);
  kc::merge_heads_forward(back.data(), heads.data(), B, T, H, D);
  CHECK(back == x);
  const Vec dy = rand_vec(B * T * C, 116);
  Vec dh(x.size());
  const auto g =
      check_accumulate({&dh}, [&](bool acc) { kc::merge_heads_backward(dh.data(), dy.data(), B, T, H, D, acc); });
  CHECK(dot(back, dy) == zp::test::approx(dot(heads, g[0])).epsilon(1e-9));
}

TEST_CASE("repeat_kv and select_token: adjoint backward") {
  const std::int64_t B = 2, KV = 2, rep = 3, T = 3, D = 2;
  const Vec x = rand_vec(B * KV * T * D, 121);
  Vec y(sz(B * KV * rep * T * D));
  kc::repeat_kv_forward(y.data(), x.data(), B, KV, rep, T, D);
  // head h reads kv group h / rep
  CHECK(y[sz(((1 * KV * rep + 4) * T + 2) * D + 1)] == x[sz(((1 * KV + 1) * T + 2) * D + 1)]);
  const Vec dy = rand_vec(static_cast<std::int64_t>(y.size()), 122);
  Vec dx(x.size());
  const auto g =
      check_accumulate({&dx}, [&](bool acc) { kc::repeat_kv_backward(dx.data(), dy.data(), B, KV, rep, T, D, acc); });
  CHECK(dot(y, dy) == zp::test::approx(dot(x, g[0])).epsilon(1e-6));  // the rep copies are summed in fp32

  const std::int64_t C = 3;
  const Vec h = rand_vec(B * T * C, 123);
  Vec first(sz(B * C));
  kc::select_token_forward(first.data(), h.data(), B, T, C, 0);
  CHECK(first[sz(C + 1)] == h[sz(T * C + 1)]);
  const Vec df = rand_vec(B * C, 124);
  Vec dh(h.size());
  const auto gs =
      check_accumulate({&dh}, [&](bool acc) { kc::select_token_backward(dh.data(), df.data(), B, T, C, 0, acc); });
  CHECK(dot(first, df) == zp::test::approx(dot(h, gs[0])).epsilon(1e-9));
}

// ------------------------------------------------------------------------------------
// Dropout, embedding, loss
// ------------------------------------------------------------------------------------

TEST_CASE("dropout: p = 0 is the identity; the mask is reproducible from (seed, offset)") {
  const std::int64_t n = 100000;
  const Vec x = rand_vec(n, 131);
  Vec y(sz(n)), y2(sz(n));
  std::vector<std::uint8_t> mask(sz(n)), mask2(sz(n));
  kc::dropout_forward(y.data(), mask.data(), x.data(), n, 0.0f, 7, 0);
  CHECK(y == x);
  CHECK(std::all_of(mask.begin(), mask.end(), [](std::uint8_t m) { return m == 1; }));

  const float p = 0.3f;
  kc::dropout_forward(y.data(), mask.data(), x.data(), n, p, 7, 1234);
  kc::dropout_forward(y2.data(), mask2.data(), x.data(), n, p, 7, 1234);
  CHECK(mask == mask2);
  CHECK(y == y2);
  const double kept = static_cast<double>(std::accumulate(mask.begin(), mask.end(), std::int64_t{0})) / n;
  CHECK(kept == zp::test::approx(0.7).epsilon(0.02));
  for (std::int64_t i = 0; i < n; i += 997)
    CHECK(y[sz(i)] == (mask[sz(i)] != 0 ? x[sz(i)] * (1.0f / (1.0f - p)) : 0.0f));
  // A sub-range with the shifted offset draws the same mask (offsets are element indices).
  std::vector<std::uint8_t> part(50);
  Vec yp(50);
  kc::dropout_forward(yp.data(), part.data(), x.data() + 333, 50, p, 7, 1234 + 333);
  CHECK(std::equal(part.begin(), part.end(), mask.begin() + 333));
  kc::dropout_forward(y2.data(), mask2.data(), x.data(), n, p, 8, 1234);
  CHECK(mask != mask2);

  const std::int64_t m = 64;
  const Vec dy = rand_vec(m, 132);
  Vec dx(sz(m));
  const auto g =
      check_accumulate({&dx}, [&](bool acc) { kc::dropout_backward(dx.data(), mask.data(), dy.data(), m, p, acc); });
  for (std::int64_t i = 0; i < m; ++i)
    CHECK(g[0][sz(i)] == (mask[sz(i)] != 0 ? dy[sz(i)] * (1.0f / (1.0f - p)) : 0.0f));
}

TEST_CASE("embedding: gather, deterministic scatter-add, padding_idx, position ids") {
  const std::int64_t V = 5, C = 3, N = 6;
  const Vec w = rand_vec(V * C, 141);
  const std::vector<std::int64_t> ids{4, 1, 4, 0, 2, 4};
  Vec y(sz(N * C));
  kc::embedding_forward(y.data(), ids.data(), w.data(), N, C);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t c = 0; c < C; ++c) CHECK(y[sz(i * C + c)] == w[sz(ids[sz(i)] * C + c)]);
  const Vec dy = rand_vec(N * C, 142);
  Vec dw(sz(V * C));
  const auto g = check_accumulate(
      {&dw}, [&](bool acc) { kc::embedding_backward(dw.data(), ids.data(), dy.data(), N, V, C, -1, acc); });
  for (std::int64_t c = 0; c < C; ++c) {
    CHECK(g[0][sz(4 * C + c)] == (dy[sz(0 * C + c)] + dy[sz(2 * C + c)]) + dy[sz(5 * C + c)]);
    CHECK(g[0][sz(3 * C + c)] == 0.0f);
  }
  kc::embedding_backward(dw.data(), ids.data(), dy.data(), N, V, C, 4, false);
  for (std::int64_t c = 0; c < C; ++c) CHECK(dw[sz(4 * C + c)] == 0.0f);
  // ids == nullptr: rows 0..N-1 (position embeddings).
  Vec pos(sz(3 * C));
  kc::embedding_forward(pos.data(), nullptr, w.data(), 3, C);
  CHECK(std::equal(pos.begin(), pos.end(), w.begin()));
}

TEST_CASE("cross entropy over a vocabulary-long row (vectorised exp) agrees with the double-precision formula") {
  for (const std::int64_t V : {33, 50257}) {
    CAPTURE(V);
    const std::int64_t N = 3;
    Vec logits = rand_vec(N * V, 977, -20.0f, 20.0f), lse(sz(N)), d(sz(N * V));
    logits[sz(V + 5)] = -std::numeric_limits<float>::infinity();  // a masked logit
    std::vector<std::int64_t> t{1, V - 1, V / 2};
    const float loss = kc::cross_entropy_forward(lse.data(), logits.data(), t.data(), N, V);
    kc::cross_entropy_backward(d.data(), logits.data(), lse.data(), t.data(), N, V, 1.0f, false);
    double want = 0.0;
    for (std::int64_t i = 0; i < N; ++i) {
      double mx = -1e300, s = 0.0;
      for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[sz(i * V + j)]));
      for (std::int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(logits[sz(i * V + j)]) - mx);
      const double l = mx + std::log(s);
      CHECK(lse[sz(i)] == zp::test::approx(l).epsilon(1e-6));
      want += l - logits[sz(i * V + t[sz(i)])];
      for (std::int64_t j = 0; j < V; ++j) {
        const double p = std::exp(static_cast<double>(logits[sz(i * V + j)]) - l);
        const double g = (p - (j == t[sz(i)] ? 1.0 : 0.0)) / static_cast<double>(N);
        CHECK(std::abs(d[sz(i * V + j)] - g) <= 1e-9 + 1e-5 * std::abs(g));
      }
    }
    CHECK(loss == zp::test::approx(want / static_cast<double>(N)).epsilon(1e-6));
    // A NaN logit (an fp16 overflow upstream) reaches the loss and the gradient.
    logits[sz(2)] = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(kc::cross_entropy_forward(lse.data(), logits.data(), t.data(), N, V)));
    kc::cross_entropy_backward(d.data(), logits.data(), lse.data(), t.data(), N, V, 1.0f, false);
    CHECK(std::isnan(d[sz(7)]));
    Vec logp(logits.size());
    kc::log_softmax_forward(logp.data(), logits.data(), N, V);
    CHECK(std::isnan(kc::nll_loss_forward(logp.data(), t.data(), N, V)));
    kc::log_softmax_nll_backward(d.data(), logp.data(), t.data(), N, V, 1.0f, false);
    CHECK(std::isnan(d[sz(7)]));
    CHECK_FALSE(std::isnan(d[sz(V + 7)]));  // the other rows stay finite
  }
}

TEST_CASE("cross entropy: uniform logits give log(V); ignore_index; gradient; log_softmax + nll path") {
  const std::int64_t N = 5, V = 7;
  Vec zeros(sz(N * V), 0.0f);
  std::vector<std::int64_t> t{0, 3, kc::kIgnoreIndex, 6, 2};
  CHECK(kc::cross_entropy_forward(nullptr, zeros.data(), t.data(), N, V) ==
        zp::test::approx(std::log(7.0)).epsilon(1e-6));

  Vec logits = rand_vec(N * V, 151, -3.0f, 3.0f), lse(sz(N));
  const float loss = kc::cross_entropy_forward(lse.data(), logits.data(), t.data(), N, V);
  double want = 0.0;
  for (std::int64_t i = 0; i < N; ++i) {
    if (t[sz(i)] == kc::kIgnoreIndex) continue;
    double s = 0.0;
    for (std::int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(logits[sz(i * V + j)]));
    want += std::log(s) - logits[sz(i * V + t[sz(i)])];
  }
  CHECK(loss == zp::test::approx(want / 4.0).epsilon(1e-6));

  const float dloss = 0.75f;
  Vec dl(logits.size());
  const auto g = check_accumulate({&dl}, [&](bool acc) {
    kc::cross_entropy_backward(dl.data(), logits.data(), lse.data(), t.data(), N, V, dloss, acc);
  });
  for (std::int64_t j = 0; j < V; ++j) CHECK(g[0][sz(2 * V + j)] == 0.0f);  // ignored row
  Vec scaled(g[0].size());
  for (std::size_t i = 0; i < scaled.size(); ++i) scaled[i] = g[0][i] / dloss;
  CHECK(max_fd_error(
            logits, scaled,
            [&] { return static_cast<double>(kc::cross_entropy_forward(nullptr, logits.data(), t.data(), N, V)); },
            1e-2f) < kFdTol);
  // Recomputing lse inside the backward gives the same gradient.
  Vec dl2(logits.size());
  kc::cross_entropy_backward(dl2.data(), logits.data(), nullptr, t.data(), N, V, dloss, false);
  for (std::size_t i = 0; i < dl2.size(); ++i) CHECK(dl2[i] == zp::test::approx(g[0][i]).epsilon(1e-6));

  // log_softmax + nll_loss: the same loss and gradient.
  Vec logp(logits.size()), dl3(logits.size());
  kc::log_softmax_forward(logp.data(), logits.data(), N, V);
  CHECK(kc::nll_loss_forward(logp.data(), t.data(), N, V) == zp::test::approx(loss).epsilon(1e-6));
  const auto g3 = check_accumulate(
      {&dl3}, [&](bool acc) { kc::log_softmax_nll_backward(dl3.data(), logp.data(), t.data(), N, V, dloss, acc); });
  for (std::size_t i = 0; i < dl3.size(); ++i) CHECK(g3[0][i] == zp::test::approx(g[0][i]).epsilon(1e-5));
  // The two steps autograd runs, through the gradient of logp: nll_loss's backward writes
  // -dloss/count at each kept row's target (here count = 4), log_softmax's reads it. The
  // result is the fused backward's, bit for bit (the row sums are exactly -dloss/count).
  Vec glogp(logits.size(), 1.0f), dl4(logits.size());
  kc::nll_loss_backward(glogp.data(), t.data(), N, V, dloss);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t j = 0; j < V; ++j)
      CHECK(glogp[sz(i * V + j)] == (t[sz(i)] != kc::kIgnoreIndex && j == t[sz(i)] ? -dloss / 4.0f : 0.0f));
  const auto g4 = check_accumulate(
      {&dl4}, [&](bool acc) { kc::log_softmax_backward(dl4.data(), logp.data(), glogp.data(), N, V, acc); });
  Vec fused(logits.size());
  kc::log_softmax_nll_backward(fused.data(), logp.data(), t.data(), N, V, dloss, false);
  for (std::size_t i = 0; i < dl4.size(); ++i) CHECK(g4[0][i] == fused[i]);
  // log_softmax's backward for any incoming gradient g: g - exp(logp) · Σ_j g_j per row.
  const Vec gin = rand_vec(N * V, 152, -1.0f, 1.0f);
  Vec dl5(logits.size());
  kc::log_softmax_backward(dl5.data(), logp.data(), gin.data(), N, V, false);
  for (std::int64_t i = 0; i < N; ++i) {
    double rs = 0.0;
    for (std::int64_t j = 0; j < V; ++j) rs += gin[sz(i * V + j)];
    for (std::int64_t j = 0; j < V; ++j) {
      const double want5 = gin[sz(i * V + j)] - std::exp(static_cast<double>(logp[sz(i * V + j)])) * rs;
      CHECK(dl5[sz(i * V + j)] == zp::test::approx(want5).epsilon(1e-5));
    }
  }

  // Huge logits stay finite; all targets ignored: loss 0, gradient 0.
  Vec big(sz(N * V));
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = (i % 3 == 0) ? 1e4f : -1e4f;
  CHECK(std::isfinite(kc::cross_entropy_forward(nullptr, big.data(), t.data(), N, V)));
  std::vector<std::int64_t> none(sz(N), kc::kIgnoreIndex);
  CHECK(kc::cross_entropy_forward(nullptr, logits.data(), none.data(), N, V) == 0.0f);
  kc::cross_entropy_backward(dl.data(), logits.data(), nullptr, none.data(), N, V, 1.0f, false);
  CHECK(std::all_of(dl.begin(), dl.end(), [](float v) { return v == 0.0f; }));
}

// ------------------------------------------------------------------------------------
// Optimizers and reductions
// ------------------------------------------------------------------------------------

TEST_CASE("AdamW / Adam: one step by hand, several steps against a double reference") {
  // torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), p = 1, g = 0.5:
  //   p <- 1 * (1 - 1e-3 * 0.01)                      = 0.99999
  //   m  = 0.1 * 0.5 = 0.05;   v = 0.001 * 0.25       = 2.5e-4
  //   m_hat = 0.05 / 0.1 = 0.5; v_hat = 2.5e-4 / 1e-3 = 0.25; sqrt(v_hat) = 0.5
  //   p <- 0.99999 - 1e-3 * 0.5 / (0.5 + 1e-8)        = 0.99899 (to 1e-11)
  kc::AdamConfig cfg;
  cfg.weight_decay = 0.01;
  cfg.decoupled = true;
  float p = 1.0f, m = 0.0f, v = 0.0f;
  const float g = 0.5f;
  kc::adam_step(&p, &g, &m, &v, 1, 1, cfg);
  CHECK(p == zp::test::approx(0.99899).epsilon(1e-7));
  CHECK(m == zp::test::approx(0.05).epsilon(1e-7));
  CHECK(v == zp::test::approx(2.5e-4).epsilon(1e-6));

  // Adam (L2): g' = 0.5 + 0.01 * 1 = 0.51; m_hat = 0.51, sqrt(v_hat) = 0.51; p = 1 - 1e-3.
  cfg.decoupled = false;
  p = 1.0f;
  m = v = 0.0f;
  kc::adam_step(&p, &g, &m, &v, 1, 1, cfg);
  CHECK(p == zp::test::approx(0.999).epsilon(1e-7));

  for (const bool decoupled : {false, true}) {
    cfg.decoupled = decoupled;
    cfg.lr = 1e-2;
    const std::int64_t n = 16;
    Vec pv = rand_vec(n, 161), mv(sz(n), 0.0f), vv(sz(n), 0.0f);
    std::vector<double> rp(pv.begin(), pv.end()), rm(sz(n), 0.0), rv(sz(n), 0.0);
    for (std::int64_t step = 1; step <= 5; ++step) {
      const Vec gv = rand_vec(n, 170 + static_cast<std::uint64_t>(step));
      kc::adam_step(pv.data(), gv.data(), mv.data(), vv.data(), n, step, cfg);
      for (std::size_t i = 0; i < sz(n); ++i) {
        double gi = gv[i];
        if (decoupled)
          rp[i] *= 1.0 - cfg.lr * cfg.weight_decay;
        else
          gi += cfg.weight_decay * rp[i];
        rm[i] = cfg.beta1 * rm[i] + (1.0 - cfg.beta1) * gi;
        rv[i] = cfg.beta2 * rv[i] + (1.0 - cfg.beta2) * gi * gi;
        const double mh = rm[i] / (1.0 - std::pow(cfg.beta1, static_cast<double>(step)));
        const double vh = rv[i] / (1.0 - std::pow(cfg.beta2, static_cast<double>(step)));
        rp[i] -= cfg.lr * mh / (std::sqrt(vh) + cfg.eps);
      }
    }
    for (std::size_t i = 0; i < sz(n); ++i) CHECK(pv[i] == zp::test::approx(rp[i]).epsilon(1e-5));
  }
}

TEST_CASE("SGD: momentum, nesterov, weight decay (torch.optim.SGD)") {
  const float g = 0.5f;
  kc::SgdConfig cfg;
  cfg.lr = 0.1;
  cfg.momentum = 0.9;
  float p = 1.0f, buf = 123.0f;  // the buffer's old contents are ignored at step 1
  kc::sgd_step(&p, &g, &buf, 1, 1, cfg);
  CHECK(buf == 0.5f);
  CHECK(p == zp::test::approx(0.95));
  kc::sgd_step(&p, &g, &buf, 1, 2, cfg);  // buf = 0.9*0.5 + 0.5 = 0.95; p = 0.95 - 0.095
  CHECK(buf == zp::test::approx(0.95));
  CHECK(p == zp::test::approx(0.855));

  cfg.nesterov = true;
  p = 1.0f;
  kc::sgd_step(&p, &g, &buf, 1, 1, cfg);  // g + 0.9*buf = 0.95
  CHECK(p == zp::test::approx(0.905));
  kc::sgd_step(&p, &g, &buf, 1, 2, cfg);  // buf = 0.95; g + 0.9*0.95 = 1.355
  CHECK(p == zp::test::approx(0.7695));

  kc::SgdConfig plain;
  plain.lr = 0.1;
  plain.weight_decay = 0.1;
  p = 1.0f;
  kc::sgd_step(&p, &g, nullptr, 1, 1, plain);  // g = 0.5 + 0.1 = 0.6
  CHECK(p == zp::test::approx(0.94));
}

TEST_CASE("scale_inplace, has_inf_or_nan, sum_squares") {
  Vec x{1.0f, -2.0f, 4.0f};
  kc::scale_inplace(x.data(), 3, 0.5f);
  CHECK(x == Vec{0.5f, -1.0f, 2.0f});
  CHECK_FALSE(kc::has_inf_or_nan(x.data(), 3));
  x[1] = std::numeric_limits<float>::infinity();
  CHECK(kc::has_inf_or_nan(x.data(), 3));
  x[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK(kc::has_inf_or_nan(x.data(), 3));

  const std::int64_t n = 100003;
  const Vec v = rand_vec(n, 181);
  long double ref = 0.0L;
  for (float e : v) ref += static_cast<long double>(e) * static_cast<long double>(e);
  const double s1 = kc::sum_squares(v.data(), n);
  CHECK(s1 == zp::test::approx(static_cast<double>(ref)).epsilon(1e-12));
  const double s2 = kc::sum_squares(v.data(), n);
  CHECK(std::bit_cast<std::uint64_t>(s1) == std::bit_cast<std::uint64_t>(s2));
  const Vec small{3.0f, 4.0f};
  CHECK(kc::sum_squares(small.data(), 2) == 25.0);
  CHECK(kc::sum(small.data(), 2) == 7.0);
  CHECK(kc::sum_squares(nullptr, 0) == 0.0);
}

// ------------------------------------------------------------------------------------
// 16-bit conversions
// ------------------------------------------------------------------------------------

TEST_CASE("bf16 / fp16: every 16-bit pattern round-trips; NaN stays a quiet NaN") {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float fb = kc::bf16_to_float(h);
    if (std::isnan(fb)) {
      REQUIRE(kc::float_to_bf16(fb) == kc::kBf16Nan);
    } else {
      REQUIRE(kc::float_to_bf16(fb) == h);
    }
    const float fh = kc::fp16_to_float(h);
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0) {
      REQUIRE(std::isnan(fh));
      REQUIRE((std::bit_cast<std::uint32_t>(fh) & 0x00400000u) != 0);  // quiet
      REQUIRE((kc::float_to_fp16(fh) & 0x7FFFu) == kc::kFp16Nan);
    } else {
      REQUIRE(kc::float_to_fp16(fh) == h);
    }
  }
  const float snan = std::numeric_limits<float>::signaling_NaN();
  CHECK(kc::float_to_bf16(snan) == 0x7FC0);
  CHECK(kc::float_to_bf16(-std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(std::isnan(kc::fp16_to_float(kc::float_to_fp16(snan))));
}

TEST_CASE("bf16: round to nearest even") {
  CHECK(kc::float_to_bf16(1.0f) == 0x3F80);
  CHECK(kc::float_to_bf16(1.0f + 0x1p-8f) == 0x3F80);             // tie, to even (down)
  CHECK(kc::float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82);         // tie, to even (up)
  CHECK(kc::float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81);  // above the tie
  CHECK(kc::float_to_bf16(-1.0f - 0x1p-8f) == 0xBF80);
  CHECK(kc::float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(kc::float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds up to inf
  CHECK(kc::bf16_to_float(0x3F80) == 1.0f);
}

TEST_CASE("fp16: range limits, subnormals, round to nearest even") {
  CHECK(kc::float_to_fp16(65504.0f) == 0x7BFF);
  CHECK(kc::fp16_to_float(0x7BFF) == 65504.0f);
  CHECK(kc::float_to_fp16(65519.996f) == 0x7BFF);
  CHECK(kc::float_to_fp16(65520.0f) == 0x7C00);  // overflow: +inf
  CHECK(kc::float_to_fp16(-65520.0f) == 0xFC00);
  CHECK(kc::float_to_fp16(1e10f) == 0x7C00);
  CHECK(kc::float_to_fp16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(kc::fp16_to_float(0x0001) == 0x1p-24f);  // smallest subnormal
  CHECK(kc::float_to_fp16(0x1p-24f) == 0x0001);
  CHECK(kc::float_to_fp16(0x1p-25f) == 0x0000);               // tie, to even (zero)
  CHECK(kc::float_to_fp16(0x1p-25f * 1.0000001f) == 0x0001);  // above the tie
  CHECK(kc::float_to_fp16(3 * 0x1p-25f) == 0x0002);           // tie 1.5 ulp, to even
  CHECK(kc::float_to_fp16(-0x1p-26f) == 0x8000);              // signed zero
  CHECK(kc::float_to_fp16(0x1p-14f) == 0x0400);               // smallest normal
  CHECK(kc::float_to_fp16(0x1p-14f - 0x1p-26f) == 0x0400);    // subnormal rounding up into the normals
  CHECK(kc::float_to_fp16(1.0f + 0x1p-11f) == 0x3C00);        // tie, to even (down)
  CHECK(kc::float_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3C02);    // tie, to even (up)
  CHECK(kc::float_to_fp16(1.0f) == 0x3C00);
}

TEST_CASE("fp16 / bf16: every sampled fp32 goes to its nearest 16-bit value (ties to even)") {
  // For |f| inside the finite range, the result's neighbours must not be closer.
  const auto check_nearest = [](float f, std::uint16_t h, double value_of_h, double below, double above) {
    const double d = std::abs(value_of_h - static_cast<double>(f));
    const double dl = std::abs(below - static_cast<double>(f)), du = std::abs(above - static_cast<double>(f));
    const bool ok = d < dl && d < du;
    const bool tie_even = (d == dl || d == du) && d <= dl && d <= du && (h & 1u) == 0;
    return ok || tie_even;
  };
  int bad16 = 0, badb = 0;
  for (std::uint64_t i = 0; i < 400000; ++i) {
    const std::uint32_t bits = kc::random_u32(99, i) & 0x7FFFFFFFu;
    // fp16: magnitudes below 65504 (exponent <= 142).
    const float f16 = std::bit_cast<float>((bits % 0x477FE000u));
    const std::uint16_t h = kc::float_to_fp16(f16);
    const double v = kc::fp16_to_float(h);
    const double lo =
        h == 0 ? -static_cast<double>(kc::fp16_to_float(1)) : kc::fp16_to_float(static_cast<std::uint16_t>(h - 1));
    const double hi = h == 0x7BFF ? 65536.0 : kc::fp16_to_float(static_cast<std::uint16_t>(h + 1));
    bad16 += check_nearest(f16, h, v, lo, hi) ? 0 : 1;
    // bf16: any finite magnitude below the largest bf16.
    const float fb = std::bit_cast<float>(bits % 0x7F7F0000u);
    const std::uint16_t b = kc::float_to_bf16(fb);
    const double vb = kc::bf16_to_float(b);
    const double lob =
        b == 0 ? -static_cast<double>(kc::bf16_to_float(1)) : kc::bf16_to_float(static_cast<std::uint16_t>(b - 1));
    const double hib = kc::bf16_to_float(static_cast<std::uint16_t>(b + 1));
    badb += check_nearest(fb, b, vb, lob, hib) ? 0 : 1;
  }
  CHECK(bad16 == 0);
  CHECK(badb == 0);
}

TEST_CASE("16-bit array conversions match the scalar ones") {
  const Vec x = rand_vec(1000, 191, -70000.0f, 70000.0f);
  std::vector<std::uint16_t> b(x.size()), h(x.size());
  Vec xb(x.size()), xh(x.size());
  kc::float_to_bf16(b.data(), x.data(), 1000);
  kc::float_to_fp16(h.data(), x.data(), 1000);
  kc::bf16_to_float(xb.data(), b.data(), 1000);
  kc::fp16_to_float(xh.data(), h.data(), 1000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(b[i] == kc::float_to_bf16(x[i]));
    CHECK(h[i] == kc::float_to_fp16(x[i]));
    CHECK(xb[i] == kc::bf16_to_float(b[i]));
    CHECK(std::bit_cast<std::uint32_t>(xh[i]) == std::bit_cast<std::uint32_t>(kc::fp16_to_float(h[i])));
  }
}

// ------------------------------------------------------------------------------------
// Philox
// ------------------------------------------------------------------------------------

TEST_CASE("Philox4x32-10: Random123 known answers") {
  CHECK(kc::philox4x32_10({0, 0, 0, 0}, {0, 0}) == kc::PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(kc::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        kc::PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(kc::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        kc::PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("uniform / normal: reproducible, offset-addressed, right moments") {
  CHECK(kc::uniform(42, 7) == kc::uniform(42, 7));
  CHECK(kc::uniform(42, 7) != kc::uniform(42, 8));
  CHECK(kc::uniform(42, 7) != kc::uniform(43, 7));
  int repeats = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) repeats += kc::random_u32(5, i) == kc::random_u32(5, i + 1) ? 1 : 0;
  CHECK(repeats == 0);

  const std::int64_t n = 100000;
  Vec u(sz(n));
  kc::uniform_fill(u.data(), n, 3, 0);
  CHECK(std::all_of(u.begin(), u.end(), [](float v) { return v >= 0.0f && v < 1.0f; }));
  double mean = 0.0;
  for (float v : u) mean += v;
  mean /= static_cast<double>(n);
  CHECK(std::abs(mean - 0.5) < 0.005);

  // Fill from an unaligned offset equals element-wise draws.
  Vec part(37);
  kc::uniform_fill(part.data(), 37, 3, 5);
  for (std::uint64_t i = 0; i < 37; ++i) CHECK(part[i] == kc::uniform(3, 5 + i));
  CHECK(part[0] == u[5]);

  Vec z(sz(n));
  kc::normal_fill(z.data(), n, 11, 0, 0.0f, 1.0f);
  double zm = 0.0, zv = 0.0;
  for (float v : z) zm += v;
  zm /= static_cast<double>(n);
  for (float v : z) zv += (v - zm) * (v - zm);
  zv /= static_cast<double>(n);
  CHECK(std::abs(zm) < 0.02);
  CHECK(std::abs(zv - 1.0) < 0.03);
  CHECK(z[17] == kc::normal(11, 17));
  Vec z2(4);
  kc::normal_fill(z2.data(), 4, 11, 0, 1.0f, 0.02f);
  CHECK(z2[2] == 1.0f + 0.02f * z[2]);
}

TEST_CASE("attention dropout: one draw per probability, one Philox block per thread's 8 of a tile, right keep rate") {
  namespace ad = zp::kernels::philox::attention_dropout;
  // Every (head, query, key) of a few heads, T not a multiple of 16, maps to its own (block,
  // word, half); the draws are the blocks' 16-bit halves.
  for (const std::int64_t T : {5, 16, 37}) {
    CAPTURE(T);
    std::vector<std::uint64_t> where;
    for (std::int64_t bh = 0; bh < 3; ++bh)
      for (std::int64_t i = 0; i < T; ++i)
        for (std::int64_t j = 0; j < T; ++j) {
          const std::uint64_t patch = static_cast<std::uint64_t>((bh * ad::groups(T) + ad::group(i)) * ad::groups(T) +
                                                                 ad::group(j));
          const std::uint32_t qp = ad::place(i), kp = ad::place(j);
          where.push_back(((2 * patch + (qp & 1u)) * 4 + 2 * (qp >> 1) + (kp >> 1)) * 2 + (kp & 1u));
          const zp::kernels::philox::Block b = ad::block(42, 8, bh, T, ad::group(i), ad::group(j), qp & 1u);
          CHECK(ad::uniform(42, 8, bh, T, i, j) == ad::unit(ad::draw(b, qp, kp)));
          CHECK(ad::uniform(42, 8, bh, T, i, j) == ad::unit(ad::draw(zp::kernels::philox::block_at(42, 2 + where.back() / 8, 0u), qp, kp)));
        }
    std::sort(where.begin(), where.end());
    CHECK(std::adjacent_find(where.begin(), where.end()) == where.end());
  }
  // The mma.sync layout's thread (lane g·4 + t) of a 16 x 16 tile holds queries {g, g+8} and
  // keys {2t, 2t+1, 2t+8, 2t+9}: one group each, and the queries one parity, so one block.
  for (std::int64_t base : {0, 48})
    for (std::int64_t g = 0; g < 8; ++g)
      for (std::int64_t t = 0; t < 4; ++t) {
        CHECK(ad::group(base + g) == ad::group(base + g + 8));
        CHECK((ad::place(base + g) & 1u) == (ad::place(base + g + 8) & 1u));
        for (std::int64_t d : {1, 8, 9}) CHECK(ad::group(base + 2 * t + d) == ad::group(base + 2 * t));
      }
  // The keep rate over a 1024 x 1024 causal head.
  const std::int64_t T = 1024;
  std::int64_t kept = 0, total = 0;
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j <= i; ++j, ++total) kept += ad::uniform(7, 1ull << 32, 1, T, i, j) < 0.9f ? 1 : 0;
  CHECK(std::abs(static_cast<double>(kept) / static_cast<double>(total) - 0.9) < 0.002);
}

// ------------------------------------------------------------------------------------
// Fused attention
// ------------------------------------------------------------------------------------
TEST_CASE("sdpa: forward equals the eager chain (scale, mask, softmax, dropout, bmm); backward against finite differences") {
  const std::int64_t B = 2, H = 2, T = 5, D = 4, n = B * H * T * D;
  const float scale = 0.5f;
  for (int variant = 0; variant < 3; ++variant) {
    const bool causal = variant != 1;
    const float p = variant == 2 ? 0.3f : 0.0f;
    CAPTURE(variant);
    Vec q = rand_vec(n, 1), k = rand_vec(n, 2), v = rand_vec(n, 3);
    Vec mask(sz(B * T), 0.0f);
    if (!causal) mask[sz(T - 1)] = kc::kMaskValue;  // batch 0's last key is padding
    const float* mk = causal ? nullptr : mask.data();
    Vec o(sz(n)), lse(sz(B * H * T));
    kc::sdpa_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), mk, B, H, T, D, causal, scale, p, 42, 7);
    // The eager chain, element by element.
    double worst = 0.0;
    for (std::int64_t bh = 0; bh < B * H; ++bh)
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> s(sz(T), -INFINITY);
        double m = -INFINITY;
        for (std::int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          double d = 0;
          for (std::int64_t x = 0; x < D; ++x) d += q[sz((bh * T + i) * D + x)] * k[sz((bh * T + j) * D + x)];
          s[sz(j)] = scale * d + (mk ? mk[sz((bh / H) * T + j)] : 0.0f);
          m = std::max(m, s[sz(j)]);
        }
        double l = 0;
        for (std::int64_t j = 0; j < T; ++j) l += std::isinf(s[sz(j)]) ? 0.0 : std::exp(s[sz(j)] - m);
        for (std::int64_t x = 0; x < D; ++x) {
          double acc = 0;
          for (std::int64_t j = 0; j < T; ++j) {
            if (std::isinf(s[sz(j)])) continue;
            double pr = std::exp(s[sz(j)] - m) / l;
            if (p > 0) pr = zp::kernels::philox::attention_dropout::uniform(42, 7, bh, T, i, j) < 1.0f - p ? pr / (1 - p) : 0.0;
            acc += pr * v[sz((bh * T + j) * D + x)];
          }
          worst = std::max(worst, std::abs(acc - o[sz((bh * T + i) * D + x)]));
        }
        CHECK(lse[sz(bh * T + i)] == zp::test::approx(m + std::log(l)).epsilon(1e-6));
      }
    CHECK(worst < 1e-6);
    // Gradients of sum(w * o) for q, k and v.
    const Vec w = rand_vec(n, 9);
    Vec dq(sz(n), 0.0f), dk(sz(n), 0.0f), dv(sz(n), 0.0f);
    kc::sdpa_backward(dq.data(), dk.data(), dv.data(), w.data(), q.data(), k.data(), v.data(), lse.data(), mk, B, H, T,
                      D, causal, scale, p, 42, 7);
    Vec tmp(sz(n)), tl(sz(B * H * T));
    auto loss = [&] {
      kc::sdpa_forward(tmp.data(), tl.data(), q.data(), k.data(), v.data(), mk, B, H, T, D, causal, scale, p, 42, 7);
      return dot(tmp, w);
    };
    CHECK(max_fd_error(q, dq, loss) < kFdTol);
    CHECK(max_fd_error(k, dk, loss) < kFdTol);
    CHECK(max_fd_error(v, dv, loss) < kFdTol);
  }
}

TEST_CASE("flash layout: strided (B, T, H, D) operands and grouped k, v equal sdpa on repeat_kv'd copies, bit for bit") {
  // q (B, T, H·D) and k, v (B, T, K·D) as projections lay them out, K = 2 kv heads for H = 4;
  // sdpa gets (B, H, T, D) copies with each kv head repeated for its H/K query heads.
  const std::int64_t B = 2, H = 4, K = 2, T = 6, D = 3, G = H / K;
  const float scale = 0.5f;
  for (const bool causal : {true, false})
    for (const float p : {0.0f, 0.25f}) {
      CAPTURE(causal);
      CAPTURE(p);
      const Vec q = rand_vec(B * T * H * D, 1), k = rand_vec(B * T * K * D, 2), v = rand_vec(B * T * K * D, 3);
      const Vec dout = rand_vec(B * T * H * D, 4);
      const kc::HeadStrides sq = kc::bthd(T, H * D, D), skv = kc::bthd(T, K * D, D);
      // The (B, H, T, D) copies.
      const std::int64_t n = B * H * T * D;
      Vec q4(sz(n)), k4(sz(n)), v4(sz(n)), do4(sz(n));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t d = 0; d < D; ++d) {
              const auto to = sz(((b * H + h) * T + t) * D + d);
              q4[to] = q[sz(b * sq.b + h * sq.h + t * sq.t + d)];
              do4[to] = dout[sz(b * sq.b + h * sq.h + t * sq.t + d)];
              k4[to] = k[sz(b * skv.b + (h / G) * skv.h + t * skv.t + d)];
              v4[to] = v[sz(b * skv.b + (h / G) * skv.h + t * skv.t + d)];
            }
      Vec o(sz(n)), lse(sz(B * H * T)), o4(sz(n)), lse4(sz(B * H * T));
      kc::attention_forward(o.data(), sq, lse.data(), q.data(), sq, k.data(), skv, v.data(), skv, nullptr, B, H, K, T, D,
                            causal, scale, p, 42, 7);
      kc::sdpa_forward(o4.data(), lse4.data(), q4.data(), k4.data(), v4.data(), nullptr, B, H, T, D, causal, scale, p, 42, 7);
      CHECK(lse == lse4);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t d = 0; d < D; ++d)
              CHECK(o[sz(b * sq.b + h * sq.h + t * sq.t + d)] == o4[sz(((b * H + h) * T + t) * D + d)]);
      // Backward: dq equal bit for bit; dk, dv equal the sums over each group of query heads.
      Vec dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f), dq4(sz(n), 0.0f), dk4(sz(n), 0.0f), dv4(sz(n), 0.0f);
      kc::attention_backward(dq.data(), sq, dk.data(), skv, dv.data(), skv, dout.data(), sq, q.data(), sq, k.data(), skv,
                             v.data(), skv, lse.data(), nullptr, B, H, K, T, D, causal, scale, p, 42, 7);
      kc::sdpa_backward(dq4.data(), dk4.data(), dv4.data(), do4.data(), q4.data(), k4.data(), v4.data(), lse4.data(),
                        nullptr, B, H, T, D, causal, scale, p, 42, 7);
      double worst = 0.0;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t d = 0; d < D; ++d) {
            for (std::int64_t h = 0; h < H; ++h)
              CHECK(dq[sz(b * sq.b + h * sq.h + t * sq.t + d)] == dq4[sz(((b * H + h) * T + t) * D + d)]);
            for (std::int64_t kv = 0; kv < K; ++kv) {
              double sk = 0.0, sv = 0.0;
              for (std::int64_t g = 0; g < G; ++g) {
                sk += dk4[sz(((b * H + kv * G + g) * T + t) * D + d)];
                sv += dv4[sz(((b * H + kv * G + g) * T + t) * D + d)];
              }
              worst = std::max({worst, std::abs(sk - dk[sz(b * skv.b + kv * skv.h + t * skv.t + d)]),
                                std::abs(sv - dv[sz(b * skv.b + kv * skv.h + t * skv.t + d)])});
            }
          }
      CHECK(worst < 1e-5);
    }
}

// What an H200 returned for an accumulating bf16 GEMM (C += A·B through cuBLASLt, beta = 1,
// CUDA 13.0): test_kernels_cuda's 64x128x96 case with its inputs (uniform_fill seeds 101, 102,
// 103, rounded to bf16), elements the GPU test flagged on 2026-12-04. Each is
// bf16(bf16(A·B) + C): the product is rounded to the output type before C is added, not
// bf16(A·B + C) as this CPU twin computes (docs/cuda.md; tests/gpu/harness.hpp's bound).
TEST_CASE("the H200's accumulating bf16 GEMM rounds the product before adding C") {
  const std::int64_t m = 64, n = 128, k = 96;
  auto input = [](std::int64_t count, std::uint64_t seed) {
    Vec v(static_cast<std::size_t>(count));
    kc::uniform_fill(v.data(), count, seed, 0);
    for (float& x : v) x = kc::bf16_to_float(kc::float_to_bf16(-1.0f + 2.0f * x));
    return v;
  };
  const Vec a = input(m * k, 101), b = input(k * n, 102), c = input(m * n, 103);
  auto bf16 = [](double x) { return kc::bf16_to_float(kc::float_to_bf16(static_cast<float>(x))); };
  const std::array<std::pair<int, float>, 8> h200 = {
      {{22, -1.015625f}, {43, 4.75f}, {74, 1.28125f}, {79, -1.046875f}, {113, -3.75f}, {117, 2.109375f},
       {135, 5.0f}, {162, -0.45703125f}}};
  Vec ref(c.begin(), c.end());
  kc::gemm(ref.data(), a.data(), b.data(), m, n, k, false, false, true);
  for (const auto& [i, got] : h200) {
    CAPTURE(i);
    double p = 0;
    for (std::int64_t t = 0; t < k; ++t)
      p += static_cast<double>(a[static_cast<std::size_t>((i / n) * k + t)]) * b[static_cast<std::size_t>(t * n + i % n)];
    const auto ci = static_cast<std::size_t>(i);
    CHECK(bf16(static_cast<double>(bf16(p)) + c[ci]) == got);  // two roundings: what the GPU returned
    CHECK(bf16(p + c[ci]) != got);                              // one rounding would differ
    CHECK(bf16(ref[ci]) == bf16(p + c[ci]));                    // the CPU twin rounds once
  }
}

// ------------------------------------------------------------------------------------
// The staged plan of a product with misaligned rows (kernels/common/gemm_pieces.hpp), run
// here with plain loops. The data are small integers and quarters, so every fp32 sum is
// exact in any order and the plan's result must equal the product run whole bit for bit.
// The plan must also read and write inside the scratch, give every product aligned
// operands and strides, and leave odd only the thin remainders of the odd dimension.
// ------------------------------------------------------------------------------------
namespace {

// C(i, j) (=|+=) sum_p op(A)(i, p) op(B)(p, j), in p's order; A, B, C at offsets with strides.
void strided_gemm(std::vector<float>& c, std::int64_t c_offset, std::int64_t ldc, const std::vector<float>& a,
                  std::int64_t a_offset, std::int64_t lda, const std::vector<float>& b, std::int64_t b_offset,
                  std::int64_t ldb, std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb, bool acc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (std::int64_t p = 0; p < k; ++p)
        sum += a.at(static_cast<std::size_t>(a_offset + (ta ? p * lda + i : i * lda + p))) *
               b.at(static_cast<std::size_t>(b_offset + (tb ? j * ldb + p : p * ldb + j)));
      float& out = c.at(static_cast<std::size_t>(c_offset + i * ldc + j));
      out = acc ? out + sum : sum;
    }
}

using zp::kernels::GemmBuffer;
using zp::kernels::GemmStep;
using zp::kernels::aligned_rows;
using zp::kernels::padded_rows;

// A plan's finish step: the accumulator's rows (+ the bias row) rounded into C's (+ their old
// values when accumulating).
void finish_rows(const zp::kernels::GemmFinish& f, const std::vector<float>& accum, const std::vector<float>& brow,
                 bool bias, bool acc, std::int64_t n, std::vector<float>& c) {
  for (std::int64_t i = 0; i < f.rows; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float v = accum.at(static_cast<std::size_t>(f.acc_offset + i * f.acc_ld + j));
      if (bias) v += brow[static_cast<std::size_t>(j)];
      float& out = c.at(static_cast<std::size_t>(f.c_offset + i * f.c_ld + j));
      out = acc ? v + out : v;
    }
}

// Exact data for a plan's product (small integers and quarters: every fp32 sum exact in any
// order): A's and B's rows `lda`, `ldb` apart (the elements past each row's own left as
// `pad`), C's initial values at `ldc`, the bias row, and the product run whole (+ the bias).
struct PlanData {
  std::vector<float> a, b, c0, brow, whole;
};
PlanData plan_data(std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb, bool acc, bool bias,
                   std::int64_t lda, std::int64_t ldb, std::int64_t ldc, float pad) {
  const std::int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  PlanData d{std::vector<float>(static_cast<std::size_t>(a_rows * lda), pad),
             std::vector<float>(static_cast<std::size_t>(b_rows * ldb), pad),
             std::vector<float>(static_cast<std::size_t>(m * ldc)), std::vector<float>(static_cast<std::size_t>(n)), {}};
  for (std::int64_t i = 0; i < a_rows; ++i)
    for (std::int64_t j = 0; j < a_cols; ++j)
      d.a[static_cast<std::size_t>(i * lda + j)] = static_cast<float>(((i * a_cols + j) * 7919) % 23) - 11.0f;
  for (std::int64_t i = 0; i < b_rows; ++i)
    for (std::int64_t j = 0; j < b_cols; ++j)
      d.b[static_cast<std::size_t>(i * ldb + j)] = static_cast<float>(((i * b_cols + j) * 104729) % 19) * 0.25f - 2.0f;
  for (std::size_t i = 0; i < d.c0.size(); ++i) d.c0[i] = static_cast<float>(i % 13) - 6.0f;
  for (std::size_t i = 0; i < d.brow.size(); ++i) d.brow[i] = static_cast<float>(i % 7) - 3.0f;
  d.whole = d.c0;
  strided_gemm(d.whole, 0, ldc, d.a, 0, lda, d.b, 0, ldb, m, n, k, ta, tb, acc);
  if (bias)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) d.whole[static_cast<std::size_t>(i * ldc + j)] += d.brow[static_cast<std::size_t>(j)];
  return d;
}

}  // namespace

TEST_CASE("gemm pieces: aligned products staged through scratch give the product run whole, bit for bit") {
  struct Case {
    std::int64_t m, n, k;
    bool ta, tb;
    const char* kind;  // C: C's rows staged; K: A's rows, k in parts; A: A's columns; "": not planned
  };
  const Case cases[] = {
      {1000, 77, 96, false, true, "C"},  {1000, 77, 96, true, true, "C"},     {1000, 77, 96, true, false, ""},
      {1000, 96, 45, false, false, "K"}, {300, 64, 1001, false, false, "K"}, {1000, 96, 45, false, true, ""},
      {301, 96, 200, true, false, "A"},  {301, 77, 200, true, true, ""},      {256, 96, 64, false, false, ""},
      {77, 301, 64, false, true, "C"},   {77, 5, 64, false, true, "C"},       {40, 64, 3, false, false, "K"},
  };
  for (std::int64_t elem : {std::int64_t{2}, std::int64_t{4}})
    for (std::size_t scratch_bytes :
         {std::size_t{20} << 10, std::size_t{20000}, std::size_t{64} << 10, std::size_t{1} << 20})
      for (const Case& cs : cases)
        for (bool acc : {false, true})
          for (bool bias : {false, true}) {
            if (acc && bias) {  // a bias never comes with accumulate (matmul refuses it)
              CHECK(zp::kernels::plan_gemm_pieces(cs.m, cs.n, cs.k, cs.ta, cs.tb, acc, bias, elem, scratch_bytes).empty());
              continue;
            }
            CAPTURE(elem);
            CAPTURE(scratch_bytes);
            CAPTURE(cs.m);
            CAPTURE(cs.n);
            CAPTURE(cs.k);
            CAPTURE(cs.ta);
            CAPTURE(cs.tb);
            CAPTURE(acc);
            CAPTURE(bias);
            const std::int64_t m = cs.m, n = cs.n, k = cs.k, unit = 16 / elem;
            const std::int64_t ld_a = cs.ta ? m : k, ld_b = cs.tb ? k : n;
            const auto plan =
                zp::kernels::plan_gemm_pieces(m, n, k, cs.ta, cs.tb, acc, bias, elem, scratch_bytes);
            const std::string kind = cs.kind;
            // The cases' odd sizes are misaligned and the others aligned in both element
            // sizes, so a case's kind holds for both.
            const bool too_small_for_16 = kind == "A" && static_cast<std::int64_t>(scratch_bytes) / 256 * 256 < 16 * k * elem;
            if (kind.empty() || too_small_for_16 || (kind == "A" && bias)) {
              CHECK(plan.empty());
              continue;
            }
            REQUIRE(!plan.empty());
            CHECK(plan.acc_bytes % zp::kernels::kAccumulatorAlign == 0);
            CHECK(plan.acc_bytes + plan.scratch_elems * elem <= static_cast<std::int64_t>(scratch_bytes));
            CHECK((kind == "K" || (kind == "C" && bias)) == (plan.acc_bytes > 0));
            auto [a, b, c0, brow, whole] = plan_data(m, n, k, cs.ta, cs.tb, acc, bias, ld_a, ld_b, n, 0.0f);
            // Every element the plan does not write stays NaN and fails the comparison.
            const float nan = std::numeric_limits<float>::quiet_NaN();
            std::vector<float> staged = acc ? c0 : std::vector<float>(c0.size(), nan);
            std::vector<float> scratch(static_cast<std::size_t>(plan.scratch_elems), nan),
                accum(static_cast<std::size_t>(plan.acc_bytes / 4), nan);
            auto buffer = [&](GemmBuffer g) -> std::vector<float>& {
              switch (g) {
                case GemmBuffer::a: return a;
                case GemmBuffer::b: return b;
                case GemmBuffer::c: return staged;
                case GemmBuffer::acc: return accum;
                default: return scratch;
              }
            };
            std::int64_t products = 0;
            for (const GemmStep& step : plan.steps) {
              if (step.kind == GemmStep::Kind::copy) {
                const auto& r = step.copy;
                CHECK(r.src != r.dst);
                if (r.dst == GemmBuffer::scratch) CHECK(aligned_rows(r.dst_ld, elem));
                std::vector<float>& dst = buffer(r.dst);
                const std::vector<float>& src = buffer(r.src);
                for (std::int64_t i = 0; i < r.rows; ++i)
                  for (std::int64_t j = 0; j < r.width; ++j)
                    dst.at(static_cast<std::size_t>(r.dst_offset + i * r.dst_ld + j)) =
                        src.at(static_cast<std::size_t>(r.src_offset + i * r.src_ld + j));
              } else if (step.kind == GemmStep::Kind::product) {
                const auto& p = step.product;
                ++products;
                const std::int64_t c_elem = p.c_buffer == GemmBuffer::acc ? 4 : elem;
                // aligned operands and strides: A's own, B's as the whole product's, C's
                CHECK(aligned_rows(p.lda, elem));
                CHECK(aligned_rows(p.ldc, c_elem));
                CHECK((p.a_offset * elem) % 16 == 0);
                CHECK((p.b_offset * elem) % 16 == 0);
                CHECK((p.c_offset * c_elem) % 16 == 0);
                CHECK(p.m >= 1);
                CHECK(p.n >= 1);
                CHECK(p.k >= 1);
                if (kind == "C") {  // the odd n only in a thin remainder; k whole
                  CHECK(p.c_buffer == (bias ? GemmBuffer::acc : GemmBuffer::scratch));
                  CHECK((aligned_rows(p.n, elem) || p.n < unit));
                  CHECK(p.k == k);
                } else if (kind == "K") {  // the odd k only in a thin remainder; n whole
                  CHECK(p.c_buffer == GemmBuffer::acc);
                  CHECK(p.a_buffer == GemmBuffer::scratch);
                  CHECK((aligned_rows(p.k, elem) || p.k < unit));
                  CHECK(p.n == n);
                } else {
                  CHECK(p.a_buffer == GemmBuffer::scratch);
                  CHECK(p.c_buffer == GemmBuffer::c);
                  CHECK(p.k == k);
                }
                strided_gemm(buffer(p.c_buffer), p.c_offset, p.ldc, buffer(p.a_buffer), p.a_offset, p.lda, b,
                             p.b_offset, ld_b, p.m, p.n, p.k, cs.ta, cs.tb, p.accumulate);
              } else {
                finish_rows(step.finish, accum, brow, bias, acc, n, staged);
              }
            }
            CHECK(products == plan.products);
            CHECK(staged == whole);
          }
}

TEST_CASE("gemm pieces: operands with padded, aligned rows are cut in place, bit for bit, the padding untouched") {
  struct Case {
    std::int64_t m, n, k;
    bool ta, tb;
    const char* cut;  // the dimensions the plan cuts ("" none: empty plan)
  };
  // GPT-2's head in small: the forward (n odd), dx (k odd), dW (m odd, A stored (k,m)), and mixes.
  const Case cases[] = {
      {300, 77, 96, false, true, "n"},  {300, 96, 77, false, false, "k"}, {77, 96, 300, true, false, "m"},
      {77, 45, 300, true, false, "mn"}, {64, 40, 77, false, true, "k"},   {77, 45, 61, true, true, "mnk"},
      {5, 77, 96, false, true, "n"},    {300, 96, 3, false, false, ""},   {64, 64, 64, false, false, ""},
      {77, 96, 304, false, false, ""},  // m odd with A stored (m,k): no kernel loads along m
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t elem : {std::int64_t{2}, std::int64_t{4}})
    for (std::size_t scratch_bytes : {std::size_t{20} << 10, std::size_t{1} << 20})
      for (const Case& cs : cases)
        for (bool acc : {false, true})
          for (bool bias : {false, true}) {
            if (acc && bias) continue;
            CAPTURE(elem);
            CAPTURE(scratch_bytes);
            CAPTURE(cs.m);
            CAPTURE(cs.n);
            CAPTURE(cs.k);
            CAPTURE(acc);
            CAPTURE(bias);
            const std::int64_t m = cs.m, n = cs.n, k = cs.k, unit = 16 / elem;
            // Every operand stored with rows padded to whole 16 bytes.
            const std::int64_t lda = padded_rows(cs.ta ? m : k, elem), ldb = padded_rows(cs.tb ? k : n, elem),
                               ldc = padded_rows(n, elem);
            const auto plan = zp::kernels::plan_gemm(m, n, k, cs.ta, cs.tb, acc, bias, elem, lda, ldb, ldc, scratch_bytes);
            const std::string cut = cs.cut;
            if (cut.empty()) {
              CHECK(plan.empty());
              continue;
            }
            REQUIRE(!plan.empty());
            const bool through_acc = cut.find('k') != std::string::npos || bias;
            CHECK(through_acc == (plan.acc_bytes > 0));
            CHECK(plan.scratch_elems == 0);  // no copies
            CHECK(plan.acc_bytes <= static_cast<std::int64_t>(scratch_bytes));
            // The padding of A and B is NaN: a read of it shows.
            auto [a, b, c0, brow, whole] = plan_data(m, n, k, cs.ta, cs.tb, acc, bias, lda, ldb, ldc, nan);
            // C's padding keeps c0's values.
            std::vector<float> got = c0;
            if (!acc)
              for (std::int64_t i = 0; i < m; ++i)
                for (std::int64_t j = 0; j < n; ++j) got[static_cast<std::size_t>(i * ldc + j)] = nan;
            std::vector<float> accum(static_cast<std::size_t>(plan.acc_bytes / 4), nan);
            std::vector<std::vector<int>> written(static_cast<std::size_t>(m), std::vector<int>(static_cast<std::size_t>(n), 0));
            std::int64_t products = 0;
            for (const GemmStep& step : plan.steps) {
              REQUIRE(step.kind != GemmStep::Kind::copy);
              if (step.kind == GemmStep::Kind::product) {
                const auto& p = step.product;
                ++products;
                const bool into_acc = p.c_buffer == GemmBuffer::acc;
                CHECK(into_acc == through_acc);
                CHECK(p.a_buffer == GemmBuffer::a);
                CHECK(p.lda == lda);
                CHECK(aligned_rows(p.ldc, into_acc ? 4 : elem));
                CHECK((p.a_offset * elem) % 16 == 0);
                CHECK((p.b_offset * elem) % 16 == 0);
                CHECK((p.c_offset * (into_acc ? 4 : elem)) % 16 == 0);
                // every dimension a kernel loads along whole 16-byte groups, or a thin rest
                CHECK((p.n % unit == 0 || p.n < unit));
                if (cs.ta) CHECK((p.m % unit == 0 || p.m < unit));
                if (!cs.ta || cs.tb) CHECK((p.k % unit == 0 || p.k < unit));
                if (!into_acc) {
                  const std::int64_t r0 = p.c_offset / ldc, c0j = p.c_offset % ldc;
                  for (std::int64_t i = 0; i < p.m; ++i)
                    for (std::int64_t j = 0; j < p.n; ++j) ++written[static_cast<std::size_t>(r0 + i)][static_cast<std::size_t>(c0j + j)];
                }
                strided_gemm(into_acc ? accum : got, p.c_offset, p.ldc, a, p.a_offset, p.lda, b, p.b_offset, ldb, p.m,
                             p.n, p.k, cs.ta, cs.tb, p.accumulate);
              } else {
                const auto& f = step.finish;
                CHECK(f.c_ld == ldc);
                finish_rows(f, accum, brow, bias, acc, n, got);
                for (std::int64_t i = 0; i < f.rows; ++i)
                  for (std::int64_t j = 0; j < n; ++j)
                    ++written[static_cast<std::size_t>(f.c_offset / ldc + i)][static_cast<std::size_t>(j)];
              }
            }
            CHECK(products == plan.products);
            for (const auto& row : written)
              for (int w : row) CHECK(w == 1);  // each element of C written once
            CHECK(got == whole);  // and the padding as it was
          }
}
