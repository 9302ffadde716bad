#include "sim/timing.hpp"

namespace zp::sim {

using zero::EventKind;

std::vector<Seconds> event_durations(const zero::Program& p, const ComputeModel& compute,
                                     const CollectiveModel& collectives) {
  std::vector<Seconds> d(p.events.size());
  for (const auto& e : p.events) {
    if (e.id < p.step_begin) continue;  // the prologue describes state, not work
    switch (e.kind) {
      case EventKind::marker: break;
      case EventKind::collective: {
        const auto& ranks = p.groups[static_cast<std::size_t>(e.group)].ranks;
        d[static_cast<std::size_t>(e.id)] =
            collectives.cost(e.coll, ranks, Bytes{e.elements * dtype_size(e.dtype)}).time;
        break;
      }
      default: d[static_cast<std::size_t>(e.id)] = compute.cost(e); break;
    }
  }
  return d;
}

TimeSummary simulate_time(const zero::Program& p, const models::OpGraph& g, const ComputeModel& compute,
                          const CollectiveModel& collectives, const EngineOptions& opt) {
  TimeSummary s;
  const auto d = event_durations(p, compute, collectives);
  s.report = run_events(p, d, opt);
  const double t = s.report.phases.iteration.v;
  if (t <= 0) return s;
  const auto& i = p.info;
  const double samples = static_cast<double>(i.micro_batch * i.gas * i.world_size);
  s.samples_per_s = samples / t;
  s.tokens_per_s = s.samples_per_s * static_cast<double>(i.seq_len);
  const double model_flops = (g.fwd_flops().v + g.bwd_flops().v) * static_cast<double>(i.gas);
  s.tflops = model_flops / t / 1e12;
  const double peak = compute.profile().peak_tensor_flops.v;
  s.mfu = peak > 0 ? model_flops / t / peak : 0;
  return s;
}

}  // namespace zp::sim
