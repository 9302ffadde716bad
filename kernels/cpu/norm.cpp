#include "kernels/cpu/norm.hpp"

#include <cmath>
#include <vector>

#include "kernels/cpu/detail.hpp"

namespace zp::kernels::cpu {

using detail::store;

namespace {

// Mean and biased variance of one row, two passes in double.
void row_moments(const float* x, std::int64_t C, double& mean, double& var) {
  double s = 0.0;
  for (std::int64_t j = 0; j < C; ++j) s += static_cast<double>(x[j]);
  mean = s / static_cast<double>(C);
  double v = 0.0;
  for (std::int64_t j = 0; j < C; ++j) {
    const double d = static_cast<double>(x[j]) - mean;
    v += d * d;
  }
  var = v / static_cast<double>(C);
}

// One row of dx: rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w.
void layernorm_dx_row(float* dx, const float* dy, const float* x, const float* w, float mu, float rs, std::int64_t C,
                      bool accumulate) {
  double sum_g = 0.0, sum_gx = 0.0;
  for (std::int64_t j = 0; j < C; ++j) {
    const float g = w != nullptr ? dy[j] * w[j] : dy[j];
    const float xhat = (x[j] - mu) * rs;
    sum_g += static_cast<double>(g);
    sum_gx += static_cast<double>(g) * static_cast<double>(xhat);
  }
  const float mean_g = static_cast<float>(sum_g / static_cast<double>(C));
  const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(C));
  for (std::int64_t j = 0; j < C; ++j) {
    const float g = w != nullptr ? dy[j] * w[j] : dy[j];
    const float xhat = (x[j] - mu) * rs;
    store(dx + j, rs * (g - mean_g - xhat * mean_gx), accumulate);
  }
}

}  // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       std::int64_t rows, std::int64_t C, float eps) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* xr = x + i * C;
    float* yr = y + i * C;
    double m = 0.0, v = 0.0;
    row_moments(xr, C, m, v);
    const float mu = static_cast<float>(m);
    const float rs = static_cast<float>(1.0 / std::sqrt(v + static_cast<double>(eps)));
    mean[i] = mu;
    rstd[i] = rs;
    for (std::int64_t j = 0; j < C; ++j) {
      float o = (xr[j] - mu) * rs;
      if (w != nullptr) o *= w[j];
      if (b != nullptr) o += b[j];
      yr[j] = o;
    }
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* w, std::int64_t rows, std::int64_t C, bool accumulate) {
  layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, rows, C, accumulate, accumulate);
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* mean,
                        const float* rstd, const float* w, std::int64_t rows, std::int64_t C, bool accumulate_dx,
                        bool accumulate_params) {
  std::vector<double> sw(dw != nullptr ? static_cast<std::size_t>(C) : 0, 0.0);
  std::vector<double> sb(db != nullptr ? static_cast<std::size_t>(C) : 0, 0.0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* dyr = dy + i * C;
    const float* xr = x + i * C;
    if (dx != nullptr) layernorm_dx_row(dx + i * C, dyr, xr, w, mean[i], rstd[i], C, accumulate_dx);
    for (std::int64_t j = 0; j < C; ++j) {
      const auto jj = static_cast<std::size_t>(j);
      if (dw != nullptr) sw[jj] += static_cast<double>(dyr[j]) * static_cast<double>((xr[j] - mean[i]) * rstd[i]);
      if (db != nullptr) sb[jj] += static_cast<double>(dyr[j]);
    }
  }
  if (dw != nullptr) detail::store_all(dw, sw.data(), C, accumulate_params);
  if (db != nullptr) detail::store_all(db, sb.data(), C, accumulate_params);
}

void rms_rsqrt_forward(float* r, const float* sq, std::int64_t rows, std::int64_t C, float eps) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* s = sq + i * C;
    double acc = 0.0;
    for (std::int64_t j = 0; j < C; ++j) acc += static_cast<double>(s[j]);
    const float ms = static_cast<float>(acc / static_cast<double>(C));
    r[i] = 1.0f / std::sqrt(ms + eps);
  }
}

void rms_rsqrt_backward(float* dsq, const float* dr, const float* r, std::int64_t rows, std::int64_t C,
                        bool accumulate) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t i = 0; i < rows; ++i) {
    const float g = dr[i] * -0.5f * r[i] * r[i] * r[i] * inv_c;
    float* d = dsq + i * C;
    for (std::int64_t j = 0; j < C; ++j) store(d + j, g, accumulate);
  }
}

void mul_rowscale_forward(float* y, const float* x, const float* r, std::int64_t rows, std::int64_t C) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < C; ++j) y[i * C + j] = x[i * C + j] * r[i];
}

void mul_rowscale_backward(float* dx, float* dr, const float* dy, const float* x, const float* r, std::int64_t rows,
                           std::int64_t C, bool accumulate) {
  mul_rowscale_backward(dx, dr, dy, x, r, rows, C, accumulate, accumulate);
}

void mul_rowscale_backward(float* dx, float* dr, const float* dy, const float* x, const float* r, std::int64_t rows,
                           std::int64_t C, bool accumulate_dx, bool accumulate_dr) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* dyr = dy + i * C;
    if (dx != nullptr)
      for (std::int64_t j = 0; j < C; ++j) store(dx + i * C + j, dyr[j] * r[i], accumulate_dx);
    if (dr != nullptr) {
      double s = 0.0;
      for (std::int64_t j = 0; j < C; ++j) s += static_cast<double>(dyr[j]) * static_cast<double>(x[i * C + j]);
      store(dr + i, static_cast<float>(s), accumulate_dr);
    }
  }
}

void mul_weight_forward(float* y, const float* x, const float* w, std::int64_t rows, std::int64_t C) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < C; ++j) y[i * C + j] = x[i * C + j] * w[j];
}

void mul_weight_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, std::int64_t rows,
                         std::int64_t C, bool accumulate) {
  mul_weight_backward(dx, dw, dy, x, w, rows, C, accumulate, accumulate);
}

void mul_weight_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, std::int64_t rows,
                         std::int64_t C, bool accumulate_dx, bool accumulate_dw) {
  std::vector<double> sw(dw != nullptr ? static_cast<std::size_t>(C) : 0, 0.0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* dyr = dy + i * C;
    const float* xr = x + i * C;
    for (std::int64_t j = 0; j < C; ++j) {
      if (dx != nullptr) store(dx + i * C + j, dyr[j] * w[j], accumulate_dx);
      if (dw != nullptr) sw[static_cast<std::size_t>(j)] += static_cast<double>(dyr[j]) * static_cast<double>(xr[j]);
    }
  }
  if (dw != nullptr) detail::store_all(dw, sw.data(), C, accumulate_dw);
}

}  // namespace zp::kernels::cpu
