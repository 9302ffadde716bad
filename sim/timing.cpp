#include "sim/timing.hpp"

#include <map>
#include <tuple>

namespace zp::sim {

using zero::EventKind;

std::vector<Seconds> event_durations(const zero::Program& p, const ComputeModel& compute,
                                     const CollectiveModel& collectives) {
  std::vector<Seconds> d(p.events.size());
  // Every micro-step repeats the same ops and buckets: price each (op, phase) and each
  // (collective, group, size) once.
  constexpr int kPhases = 7;
  std::vector<double> op_cost;
  std::map<std::tuple<int, int, std::int64_t>, Seconds> coll_cost;
  for (const auto& e : p.events) {
    if (e.id < p.step_begin) continue;  // the prologue describes state, not work
    auto& out = d[static_cast<std::size_t>(e.id)];
    switch (e.kind) {
      case EventKind::marker: break;
      case EventKind::collective: {
        const Bytes bytes{e.elements * dtype_size(e.dtype)};
        const auto key = std::make_tuple(static_cast<int>(e.coll), e.group, bytes.v);
        auto it = coll_cost.find(key);
        if (it == coll_cost.end())
          it = coll_cost.emplace(key, collectives.cost(e.coll, p.groups[static_cast<std::size_t>(e.group)].ranks, bytes).time).first;
        out = it->second;
        break;
      }
      case EventKind::compute: {
        if (e.op < 0) { out = compute.cost(e); break; }
        const auto k = static_cast<std::size_t>(e.op) * kPhases + static_cast<std::size_t>(e.phase);
        if (k >= op_cost.size()) op_cost.resize(k + kPhases, -1.0);
        if (op_cost[k] < 0) op_cost[k] = compute.cost(e).v;
        out = Seconds{op_cost[k]};
        break;
      }
      default: out = compute.cost(e); break;
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
  // MFU against the peak of the arithmetic the model uses (fp32 runs without tensor cores).
  const double peak = g.opt.act_dtype == DType::fp32 ? compute.profile().peak_fp32_flops.v
                                                     : compute.profile().peak_tensor_flops.v;
  s.mfu = peak > 0 ? model_flops / t / peak : 0;
  return s;
}

}  // namespace zp::sim
