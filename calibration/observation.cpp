#include "calibration/observation.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace zp::calibration {

const char* obs_kind_name(ObsKind k) {
  switch (k) {
    case ObsKind::collective: return "collective";
    case ObsKind::kernel: return "kernel";
    case ObsKind::phase: return "phase";
  }
  return "?";
}

const char* kernel_class_name(KernelClass k) {
  switch (k) {
    case KernelClass::gemm: return "gemm";
    case KernelClass::memory: return "memory";
    case KernelClass::attention: return "attention";
    case KernelClass::copy_d2d: return "copy_d2d";
    case KernelClass::copy_h2d: return "copy_h2d";
    case KernelClass::copy_host: return "copy_host";
    case KernelClass::collective: return "collective";
    case KernelClass::reduction: return "reduction";
  }
  return "?";
}

const char* phase_label(PhaseName p) {
  switch (p) {
    case PhaseName::forward: return "forward";
    case PhaseName::backward: return "backward";
    case PhaseName::backward_inner: return "backward_inner";
    case PhaseName::backward_allreduce: return "backward_allreduce";
    case PhaseName::step: return "step";
    case PhaseName::iteration: return "iteration";
  }
  return "?";
}

const char* quantity_name(Quantity q) {
  switch (q) {
    case Quantity::wall: return "wall";
    case Quantity::gpu_busy: return "gpu_busy";
    case Quantity::events: return "events";
    case Quantity::gpu_gemm: return "gpu_gemm";
    case Quantity::gpu_attention: return "gpu_attention";
    case Quantity::gpu_other: return "gpu_other";
  }
  return "?";
}

DriverSummary summarize(const std::vector<DriverFigures>& runs) {
  DriverSummary r;
  r.runs = static_cast<int>(runs.size());
  // The median and the spread of one figure over the runs that have it (v >= 0).
  auto stat = [&](std::int64_t DriverFigures::*m, std::int64_t& median, std::int64_t& spread) {
    std::vector<std::int64_t> v;
    for (const auto& d : runs)
      if (d.*m >= 0) v.push_back(d.*m);
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    median = v[v.size() / 2];
    spread = v.back() - v.front();
  };
  stat(&DriverFigures::context, r.context, r.context_spread);
  stat(&DriverFigures::libraries, r.libraries, r.libraries_spread);
  stat(&DriverFigures::nccl, r.nccl, r.nccl_spread);
  stat(&DriverFigures::cudnn, r.cudnn, r.cudnn_spread);
  return r;
}

void merge(Dataset& into, Dataset from) {
  const int offset = static_cast<int>(into.runs.size());
  for (auto& r : from.runs) into.runs.push_back(std::move(r));
  for (auto& o : from.obs) {
    if (o.kind == ObsKind::phase) o.phase.run += offset;
    if (o.kind == ObsKind::kernel && o.kernel.run >= 0) o.kernel.run += offset;
    into.obs.push_back(std::move(o));
  }
  for (auto& d : from.driver) into.driver.push_back(std::move(d));
  for (auto& w : from.warnings) into.warnings.push_back(std::move(w));
  for (auto& f : from.files) into.files.push_back(std::move(f));
  // Environment: fill what is unknown; warn where two sources disagree.
  auto field = [&](std::string Environment::*m, const char* name) {
    const std::string& a = into.env.*m;
    const std::string& b = from.env.*m;
    if (b.empty()) return;
    if (a.empty()) {
      into.env.*m = b;
      into.env.origin[name] = from.env.origin.count(name) ? from.env.origin.at(name) : "";
    } else if (a != b) {
      into.warnings.push_back(fmt::format("the sources disagree on the {}: {} ({}) and {} ({})", name, a,
                                          into.env.origin.count(name) ? into.env.origin.at(name) : "?", b,
                                          from.env.origin.count(name) ? from.env.origin.at(name) : "?"));
    }
  };
  field(&Environment::gpu_name, "gpu_name");
  field(&Environment::driver, "driver");
  field(&Environment::cuda, "cuda");
  field(&Environment::nccl, "nccl");
  field(&Environment::deepspeed, "deepspeed");
  field(&Environment::torch, "torch");
  field(&Environment::host, "host");
  field(&Environment::date, "date");
  into.env.gpu_count = std::max(into.env.gpu_count, from.env.gpu_count);
  into.env.nodes = std::max(into.env.nodes, from.env.nodes);
}

}  // namespace zp::calibration
