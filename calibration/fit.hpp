#pragma once
// Fitting: bounded Levenberg-Marquardt through the simulator (numerical Jacobians, Eigen),
// with a screen that refuses parameters the data cannot determine, and the closed forms where
// they exist (a collective's α-β line per size curve, the GEMM efficiency curve).
//
// Residuals are log(predicted / measured) (≈ relative errors) under a Cauchy loss of scale
// `robust_scale`, weighted by 1 / sqrt(spread² + floor²): an observation measured with a large
// step-to-step spread counts less, no observation counts more than a model error of
// `model_floor` allows, and one the model misses by far counts little more than one it
// misses by `robust_scale`. Uncertainties are the
// covariance s²(JᵀJ)⁻¹ with s² the weighted residual variance (so they grow when the model
// fits the data worse than the stated spreads say).
#include <functional>
#include <string>
#include <vector>

#include <Eigen/Dense>

#include "calibration/observation.hpp"
#include "calibration/params.hpp"

namespace zp::calibration {

struct FitOptions {
  std::vector<const ParamDef*> candidates;  // in priority order
  double model_floor = 0.02;                // relative error the model is not expected to beat
  double collinearity = 0.05;               // smallest singular value of the normalised Jacobian
  double insensitive = 1e-3;                // doubling or halving changes no prediction by more: refused
  double max_rel_sd = 0.5;                  // fitted with a larger relative standard deviation: refused
  // Cauchy loss: residuals well beyond `robust_scale` (a relative error) count as log|r|, so a
  // class of observations the model cannot represent (off by 3x) does not bend the
  // coefficients the others determine; the report names such classes. 0: least squares.
  double robust_scale = 0.1;
  int max_iterations = 60;
  int threads = 0;                          // 0: every core
};

struct FittedParam {
  const ParamDef* def = nullptr;
  double initial = 0, value = 0, sd = 0;    // in def->unit
  bool at_bound = false;
};

struct Refusal {
  std::string name;
  std::string reason;                       // why, and which measurement would determine it
};

struct FitResult {
  ModelParams before, after;
  std::vector<FittedParam> fitted;
  std::vector<Refusal> refused;
  std::vector<std::string> notes;
  std::vector<double> pred_before, pred_after;  // every observation
  int iterations = 0;
  int evaluations = 0;                      // predictions of the fitted observations
  int n_fit = 0, dof = 0;
  double sigma = 0;                         // sqrt(weighted SSR / dof)
  double cost_before = 0, cost_after = 0;   // ½ Σ weighted residual²
  bool converged = false;
  double seconds = 0;
};

// Predicts every observation with want[i] (all when empty) into out[i].
using PredictFn = std::function<void(const ModelParams&, const std::vector<char>& want, std::vector<double>& out)>;

FitResult fit(const PredictFn& predict, const std::vector<Observation>& obs, const ModelParams& start,
              const FitOptions& opt);

// Two passes: first every candidate but `later` on every fitted observation but those
// `is_later` picks, then `later` alone on those observations with the first pass's values
// held. For parameters that only a few observations determine and that trade off against a
// shared curve (a fused attention kernel's own factors against the GEMM curve: with one
// measured attention shape a joint fit bends the GEMM curve to the attention kernel).
FitResult fit_in_two_passes(const PredictFn& predict, const std::vector<Observation>& obs, const ModelParams& start,
                            const FitOptions& opt, const std::function<bool(const Observation&)>& is_later,
                            const std::vector<const ParamDef*>& later);

// log((predicted + floor) / (measured + floor)).
double log_ratio(double predicted, const Observation& o);

// t = α + S / β minimising Σ ((α + S/β − t) / t)² (closed form; α ≥ 0).
struct AlphaBeta {
  double alpha_s = 0, alpha_sd = 0;         // latency
  double beta = 0, beta_rel_sd = 0;         // bytes per second of S (algorithm bandwidth)
  int points = 0;
  double rms_rel = 0;                       // of the line against the points
};
AlphaBeta fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& seconds);

// eff(m, n, k) = A · s(m) s(n) s(k), s(x) = x / (x + h), in log space: A closed form for
// each h, h by golden-section search (sim::gemm_efficiency's curve).
struct GemmCurve {
  double max_efficiency = 0, max_efficiency_rel_sd = 0;
  double half_dim = 0, half_dim_rel_sd = 0;
  int points = 0;
  double rms_rel = 0;
};
GemmCurve fit_gemm_curve(const std::vector<std::array<double, 3>>& mnk, const std::vector<double>& efficiency);

}  // namespace zp::calibration
