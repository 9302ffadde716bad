#include "sim/timing.hpp"

#include <algorithm>

namespace zp::sim {

using zero::EventKind;

std::vector<Seconds> event_durations(const zero::Program& p, const ComputeModel& compute,
                                     const CollectiveModel& collectives) {
  std::vector<Seconds> d(p.events.size());
  // Every micro-step repeats the same ops and buckets: price each (op, phase) and each
  // (collective, group, size) once.
  constexpr int kPhases = 7;
  std::vector<double> op_cost;
  struct CollCost {
    int kind;
    zero::GroupId group;
    std::int64_t bytes;
    Seconds time;
  };
  std::vector<CollCost> coll_cost;  // few distinct ones: searched from the last found
  std::size_t last = 0;
  const auto n = p.events.size();
  // (The copies of a repeated block cost what the block costs: Program::repeat.)
  for (std::size_t i = static_cast<std::size_t>(std::max<zero::EventId>(p.step_begin, 0)); i < n; ++i) {
    const zero::Event& e = p.events[i];  // the prologue describes state, not work
    if (i + 8 < n) __builtin_prefetch(&p.events[i + 8].kind);
    auto& out = d[i];
    switch (e.kind) {
      case EventKind::marker: break;
      case EventKind::collective: {
        const Bytes bytes{e.elements * dtype_size(e.dtype)};
        const int kind = static_cast<int>(e.coll);
        auto same = [&](const CollCost& c) { return c.kind == kind && c.group == e.group && c.bytes == bytes.v; };
        if (last >= coll_cost.size() || !same(coll_cost[last])) {
          last = 0;
          while (last < coll_cost.size() && !same(coll_cost[last])) ++last;
          if (last == coll_cost.size())
            coll_cost.push_back(
                {kind, e.group, bytes.v, collectives.cost(e.coll, p.groups[static_cast<std::size_t>(e.group)].ranks, bytes).time});
        }
        out = coll_cost[last].time;
        // A scalar all-reduce's local reduction over the gradients first (the norm, the
        // overflow check).
        if (e.tensors > 0 || e.mem_bytes.v > 0)
          out = Seconds{out.v + compute.local_reduction_cost(e.mem_bytes, e.tensors).v};
        out = Seconds{out.v + compute.loop_kernels_cost(e).v};
        break;
      }
      case EventKind::compute: {
        if (e.op < 0) { out = compute.cost(e); break; }
        // By op, phase and whether DeepSpeed adds the bias apart (Event::unfused_bias).
        const auto k = (static_cast<std::size_t>(e.op) * kPhases + static_cast<std::size_t>(e.phase)) * 2 +
                       (e.unfused_bias ? 1 : 0);
        if (k >= op_cost.size()) op_cost.resize(k + 2 * kPhases, -1.0);
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
  set_iteration(s, s.report.phases.iteration, p, g, compute);
  return s;
}

void set_iteration(TimeSummary& s, Seconds iteration, const zero::Program& p, const models::OpGraph& g,
                   const ComputeModel& compute) {
  s.iteration = iteration;
  s.samples_per_s = s.tokens_per_s = s.tflops = s.mfu = 0;
  const double t = iteration.v;
  if (t <= 0) return;
  const auto& i = p.info;
  const double samples = static_cast<double>(i.micro_batch * i.gas * i.world_size);
  s.samples_per_s = samples / t;
  s.tokens_per_s = s.samples_per_s * static_cast<double>(i.seq_len);
  const double model_flops = (g.fwd_flops().v + g.bwd_flops().v) * static_cast<double>(i.gas);
  s.tflops = model_flops / t / 1e12;
  // MFU against the peak of the arithmetic the model's GEMMs use (TF32 or the fp32 cores for fp32).
  const double peak = compute.profile().gemm_peak(g.opt.act_dtype);
  s.mfu = peak > 0 ? model_flops / t / peak : 0;
}

}  // namespace zp::sim
