#pragma once
// The parameters calibration can fit: every coefficient the simulator reads from a profile.
// Compute model (sim::DeviceProfile), host costs (sim::HostCosts) and the collective model's
// factors (sim::CollectiveCoefficients), each with a name, a unit, bounds, and what
// measurement determines it (said when the data cannot).
#include <functional>
#include <string>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/compute_model.hpp"

namespace zp::calibration {

// Everything the simulator reads that calibration changes.
struct ModelParams {
  sim::DeviceProfile device;
  sim::CollectiveCoefficients collective;
};

enum class ParamGroup { compute, host, collective };
const char* param_group_name(ParamGroup g);

struct ParamDef {
  std::string name;           // "compute.gemm_max_efficiency", "host.grad_hook_us", "collective.inter.bandwidth"
  ParamGroup group = ParamGroup::compute;
  std::string unit;           // "", "us", "GB/s", "1/s"
  std::string what;           // what it is, one line
  std::string determined_by;  // the measurement that determines it
  double lo = 0, hi = 0;      // bounds in `unit`
  bool log_scale = true;      // fitted in log space (positive, scale-like); else linear over `typical`
  double typical = 1;         // linear parameters: the step scale
  bool coarse = false;        // in the default set of its group
  bool detail = false;        // a collective factor of one algorithm and protocol (collective-detail)
  int stage = 0;              // fitted coarse to fine: 0 scales (efficiencies, bandwidths, host costs),
                              // 1 latencies and the GEMM curve's shape, 2 the rest
  std::function<double(const ModelParams&)> get;   // in `unit`
  std::function<void(ModelParams&, double)> set;   // in `unit`
  std::vector<std::string> fields;  // the coefficients it changes (two parameters may not share one)
};

// Every parameter, in priority order (the order the identifiability screen accepts them in).
const std::vector<ParamDef>& param_registry();
const ParamDef* find_param(const std::string& name);
// The parameter of an op kind's bandwidth factor: "compute.op_efficiency.layernorm[.backward]".
std::string op_factor_name(models::OpKind kind, bool backward);

// `--fit`: comma-separated parameter names and groups ("compute", "host", "collective": their
// default sets; "collective-detail": every collective factor by algorithm and protocol;
// "all"). Unknown names → InputError naming the closest; two parameters that change the
// same coefficient → InputError.
std::vector<const ParamDef*> parse_fit_spec(const std::string& spec);

// The default set for the data: compute parameters for kernels and phases, host costs for
// phases, the coarse collective factors for collectives and multi-rank phases.
std::vector<const ParamDef*> default_fit_set(bool kernels, bool collectives, bool phases, bool multi_rank_phases);

}  // namespace zp::calibration
