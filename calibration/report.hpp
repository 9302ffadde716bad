#pragma once
// What a calibration says: the fitted parameters with their uncertainties and what was
// refused, MAPE before and after per source (fitted and held-out observations apart), and
// with --report each source's fit: measured vs predicted per size (collectives, with the
// α-β line of each curve), per kernel and per phase. And the cluster profile it writes.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/fit.hpp"
#include "calibration/observation.hpp"
#include "calibration/profile.hpp"
#include "sim/cluster.hpp"

namespace zp::calibration {

// Mean absolute percentage error of predictions against the observations selected.
double mape(const std::vector<Observation>& obs, const std::vector<double>& pred, const std::vector<std::size_t>& which);

struct SourceSummary {
  std::string source;                // tag "source": nccl-tests, deepspeed-log, deepspeed-runs, train, device
  std::string what;                  // collective, a kernel class, "phase wall", "phase gpu_busy"
  std::vector<std::size_t> fit, held;
  double fit_before = 0, fit_after = 0, held_before = 0, held_after = 0;  // MAPE, %
};
std::vector<SourceSummary> summarize(const Dataset& data, const FitResult& fit);

// Held-out MAPE per phase and quantity (before, after), over runs none of whose phases were fitted.
struct PhaseSummary {
  std::string phase, quantity;
  int runs = 0;
  double before = 0, after = 0;
};
std::vector<PhaseSummary> held_out_phases(const Dataset& data, const FitResult& fit);

// The α-β line of every measured collective curve (kind, group, file), before and after.
struct CurveFit {
  std::string kind, file;
  int ranks = 0, nodes = 0;
  std::vector<std::size_t> obs;      // by size
  AlphaBeta measured;
  double busbw_gbps = 0;             // nccl-tests busbw of the line's bandwidth
  double mape_before = 0, mape_after = 0, worst_after = 0;
};
std::vector<CurveFit> collective_curves(const Dataset& data, const FitResult& fit);

std::string summary_text(const Dataset& data, const FitResult& fit, const sim::ClusterSpec& cluster);
std::string detail_text(const Dataset& data, const FitResult& fit);
nlohmann::json calibration_json(const Dataset& data, const FitResult& fit, const sim::ClusterSpec& cluster);

// The profile of this calibration: the fitted coefficients, the cluster and environment, the
// uncertainty (from held-out residuals when there are enough, else in-sample), per-source
// summaries, the curves and every observation's residual.
ClusterProfile make_profile(const Dataset& data, const FitResult& fit, const sim::ClusterSpec& cluster, const std::string& created);

}  // namespace zp::calibration
