#include "kernels/cpu/sdpa.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/philox.hpp"

namespace zp::kernels::cpu {

namespace {

// The scores of row i of head (b, h) into s[0, n): n = i + 1 when causal, T otherwise.
// `kt`: the stride between consecutive tokens of k.
std::int64_t row_scores(double* s, const float* qi, const float* kh, std::int64_t kt, const float* maskb,
                        std::int64_t i, std::int64_t T, std::int64_t D, bool causal, float scale) {
  const std::int64_t n = causal ? i + 1 : T;
  for (std::int64_t j = 0; j < n; ++j) {
    double dot = 0.0;
    const float* kj = kh + j * kt;
    for (std::int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * static_cast<double>(kj[d]);
    s[j] = static_cast<double>(scale) * dot + (maskb ? static_cast<double>(maskb[j]) : 0.0);
  }
  return n;
}

// The dropout factor of probability (bh = b·H + h, i, j): 1/(1 - p) when kept, 0 when
// dropped (kernels/common/philox.hpp, attention_dropout: the CUDA kernels' draws).
double keep_factor(std::uint64_t seed, std::uint64_t offset, std::int64_t bh, std::int64_t T, std::int64_t i,
                   std::int64_t j, float p) {
  if (p <= 0.0f) return 1.0;
  return philox::attention_dropout::uniform(seed, offset, bh, T, i, j) < 1.0f - p
             ? 1.0 / (1.0 - static_cast<double>(p))
             : 0.0;
}

}  // namespace

void attention_forward(float* o, HeadStrides so, float* lse, const float* q, HeadStrides sq, const float* k,
                       HeadStrides sk, const float* v, HeadStrides sv, const float* mask, std::int64_t B,
                       std::int64_t H, std::int64_t K, std::int64_t T, std::int64_t D, bool causal, float scale,
                       float p, std::uint64_t seed, std::uint64_t offset) {
  const std::int64_t group = H / K;  // query heads per kv head
  std::vector<double> s(static_cast<std::size_t>(T)), acc(static_cast<std::size_t>(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t bh = b * H + h, kv = h / group;
      const float* kh = k + b * sk.b + kv * sk.h;
      const float* vh = v + b * sv.b + kv * sv.h;
      const float* maskb = mask ? mask + b * T : nullptr;
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t n = row_scores(s.data(), q + b * sq.b + h * sq.h + i * sq.t, kh, sk.t, maskb, i, T, D,
                                          causal, scale);
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < n; ++j) m = std::max(m, s[static_cast<std::size_t>(j)]);
        double l = 0.0;
        for (std::int64_t j = 0; j < n; ++j) l += std::exp(s[static_cast<std::size_t>(j)] - m);
        const double L = m + std::log(l);
        lse[bh * T + i] = static_cast<float>(L);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t j = 0; j < n; ++j) {
          const double pij = std::exp(s[static_cast<std::size_t>(j)] - L) * keep_factor(seed, offset, bh, T, i, j, p);
          const float* vj = vh + j * sv.t;
          for (std::int64_t d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += pij * static_cast<double>(vj[d]);
        }
        float* oi = o + b * so.b + h * so.h + i * so.t;
        for (std::int64_t d = 0; d < D; ++d) oi[d] = static_cast<float>(acc[static_cast<std::size_t>(d)]);
      }
    }
}

void attention_backward(float* dq, HeadStrides sdq, float* dk, HeadStrides sdk, float* dv, HeadStrides sdv,
                        const float* dout, HeadStrides sdo, const float* q, HeadStrides sq, const float* k,
                        HeadStrides sk, const float* v, HeadStrides sv, const float* lse, const float* mask,
                        std::int64_t B, std::int64_t H, std::int64_t K, std::int64_t T, std::int64_t D, bool causal,
                        float scale, float p, std::uint64_t seed, std::uint64_t offset) {
  const std::int64_t group = H / K;
  std::vector<double> s(static_cast<std::size_t>(T)), P(static_cast<std::size_t>(T)), dP(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t bh = b * H + h, kv = h / group;
      const float* kh = k + b * sk.b + kv * sk.h;
      const float* vh = v + b * sv.b + kv * sv.h;
      float* dkh = dk + b * sdk.b + kv * sdk.h;
      float* dvh = dv + b * sdv.b + kv * sdv.h;
      const float* maskb = mask ? mask + b * T : nullptr;
      for (std::int64_t i = 0; i < T; ++i) {
        const float* qi = q + b * sq.b + h * sq.h + i * sq.t;
        const std::int64_t n = row_scores(s.data(), qi, kh, sk.t, maskb, i, T, D, causal, scale);
        const double L = lse[bh * T + i];
        const float* doi = dout + b * sdo.b + h * sdo.h + i * sdo.t;
        double rowsum = 0.0;
        for (std::int64_t j = 0; j < n; ++j) {
          const auto u = static_cast<std::size_t>(j);
          P[u] = std::exp(s[u] - L);
          const double keep = keep_factor(seed, offset, bh, T, i, j, p);
          // O = (P ∘ keep) V: dV += (P ∘ keep)ᵀ dO; d(P ∘ keep) = dO Vᵀ.
          const float* vj = vh + j * sv.t;
          float* dvj = dvh + j * sdv.t;
          double dpd = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            dvj[d] += static_cast<float>(P[u] * keep * static_cast<double>(doi[d]));
            dpd += static_cast<double>(doi[d]) * static_cast<double>(vj[d]);
          }
          dP[u] = dpd * keep;
          rowsum += P[u] * dP[u];
        }
        float* dqi = dq + b * sdq.b + h * sdq.h + i * sdq.t;
        for (std::int64_t j = 0; j < n; ++j) {
          const auto u = static_cast<std::size_t>(j);
          const double ds = P[u] * (dP[u] - rowsum) * static_cast<double>(scale);
          const float* kj = kh + j * sk.t;
          float* dkj = dkh + j * sdk.t;
          for (std::int64_t d = 0; d < D; ++d) {
            dqi[d] += static_cast<float>(ds * static_cast<double>(kj[d]));
            dkj[d] += static_cast<float>(ds * static_cast<double>(qi[d]));
          }
        }
      }
    }
}

void sdpa_forward(float* o, float* lse, const float* q, const float* k, const float* v, const float* mask,
                  std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, bool causal, float scale, float p,
                  std::uint64_t seed, std::uint64_t offset) {
  const HeadStrides c = bhtd(H, T, D);
  attention_forward(o, c, lse, q, c, k, c, v, c, mask, B, H, H, T, D, causal, scale, p, seed, offset);
}

void sdpa_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                   const float* lse, const float* mask, std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D,
                   bool causal, float scale, float p, std::uint64_t seed, std::uint64_t offset) {
  const HeadStrides c = bhtd(H, T, D);
  attention_backward(dq, c, dk, c, dv, c, dout, c, q, c, k, c, v, c, lse, mask, B, H, H, T, D, causal, scale, p, seed,
                     offset);
}

}  // namespace zp::kernels::cpu
