#include "calibration/predictor.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "core/error.hpp"
#include "models/model_config.hpp"
#include "sim/compute_model.hpp"
#include "sim/predict.hpp"
#include "sim/timing.hpp"
#include "sim/trace.hpp"

namespace zp::calibration {

namespace {

double union_length(std::vector<std::pair<double, double>>& iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, end = -1e300;
  for (const auto& [a, b] : iv) {
    if (a > end) {
      total += b - a;
      end = b;
    } else if (b > end) {
      total += b - end;
      end = b;
    }
  }
  return total;
}

// The ranks of a group of `ranks` ranks spread as nccl-tests ran them: ranks_per_node on each
// node, in order.
std::vector<int> group_of(const CollectiveSample& c, const sim::ClusterSpec& cl, const std::string& source) {
  if (!c.group.empty()) {
    for (int r : c.group)
      if (r < 0 || r >= cl.world_size())
        throw InputError(source, "", fmt::format("rank {} is outside cluster {} ({} GPUs)", r, cl.name, cl.world_size()));
    return c.group;
  }
  const int per = c.ranks_per_node > 0 ? c.ranks_per_node : c.ranks;
  if (c.nodes > cl.nodes || per > cl.gpus_per_node)
    throw InputError(source, "",
                     fmt::format("{} ranks on {} node{} ({} per node) do not fit cluster {} ({}); give the --cluster "
                                 "(and --nodes) the measurement ran on",
                                 c.ranks, c.nodes, c.nodes == 1 ? "" : "s", per, cl.name, sim::describe_cluster(cl)));
  std::vector<int> out;
  int left = c.ranks;
  for (int node = 0; node < c.nodes && left > 0; ++node)
    for (int l = 0; l < per && left > 0; ++l, --left) out.push_back(node * cl.gpus_per_node + l);
  if (left > 0)
    throw InputError(source, "", fmt::format("{} ranks do not fit {} nodes of {} ranks", c.ranks, c.nodes, per));
  return out;
}

}  // namespace

PhaseName timer_phase(const zero::Event& e) {
  if (e.micro_step < 0) return PhaseName::step;
  switch (e.phase) {
    case zero::Phase::forward: return PhaseName::forward;
    case zero::Phase::backward:
    case zero::Phase::recompute:
    case zero::Phase::reduction: return PhaseName::backward;
    default: return PhaseName::step;
  }
}

PhasePrediction phase_times(const zero::Program& p, const sim::TimeReport& t, const std::vector<std::int32_t>& unmeasured,
                            const sim::ComputeModel* cm, const models::OpGraph* graph) {
  const std::vector<sim::OpTraceInfo> ops =
      cm != nullptr && graph != nullptr ? sim::op_trace_info(*graph, cm) : std::vector<sim::OpTraceInfo>{};
  return phase_times(p, t, ops, unmeasured);
}

PhasePrediction phase_times(const zero::Program& p, const sim::TimeReport& t, std::span<const sim::OpTraceInfo> ops,
                            const std::vector<std::int32_t>& unmeasured) {
  PhasePrediction out;
  auto set = [&](PhaseName ph, Quantity q, double v) {
    out.seconds[static_cast<std::size_t>(ph)][static_cast<std::size_t>(q)] = v;
  };
  const auto& ph = t.phases;
  set(PhaseName::forward, Quantity::wall, ph.forward.v);
  set(PhaseName::backward, Quantity::wall, ph.backward.v);
  set(PhaseName::backward_allreduce, Quantity::wall, ph.backward_allreduce.v);
  set(PhaseName::backward_inner, Quantity::wall, ph.backward.v - ph.backward_allreduce.v);
  set(PhaseName::step, Quantity::wall, ph.step.v);
  set(PhaseName::iteration, Quantity::wall, ph.iteration.v);
  std::array<std::vector<std::pair<double, double>>, kNumPhaseNames> iv;
  std::array<double, kNumPhaseNames> sum{};
  std::vector<std::pair<double, double>> all;
  for (std::size_t i = static_cast<std::size_t>(std::max<zero::EventId>(p.step_begin, 0)); i < p.events.size(); ++i) {
    const zero::Event& e = p.events[i];
    const auto& et = t.events[i];
    if (!(et.end.v > et.start.v) || !sim::on_device(e)) continue;
    const auto b = static_cast<std::size_t>(timer_phase(e));
    iv[b].emplace_back(et.start.v, et.end.v);
    if (std::find(unmeasured.begin(), unmeasured.end(), static_cast<std::int32_t>(i)) == unmeasured.end())
      sum[b] += et.end.v - et.start.v;
    all.emplace_back(et.start.v, et.end.v);
    if (!ops.empty()) {
      // The classes a profiler names the event's kernels by (sim::profiled_split): the fused
      // attention's, the products, everything else (bias kernels among it) bandwidth-bound.
      const auto split = sim::profiled_split(e, et.end.v - et.start.v, ops);
      for (int k = 0; k < sim::kNumProfiledClasses; ++k) {
        const auto c = static_cast<sim::ProfiledClass>(k);
        const Quantity q = c == sim::ProfiledClass::gemm        ? Quantity::gpu_gemm
                           : c == sim::ProfiledClass::attention ? Quantity::gpu_attention
                                                                : Quantity::gpu_other;
        out.seconds[b][static_cast<std::size_t>(q)] += split[static_cast<std::size_t>(k)];
      }
    }
  }
  auto busy = [&](PhaseName b) { return union_length(iv[static_cast<std::size_t>(b)]); };
  const double fwd = busy(PhaseName::forward), bwd = busy(PhaseName::backward), step = busy(PhaseName::step);
  for (PhaseName b : {PhaseName::forward, PhaseName::backward, PhaseName::step})
    set(b, Quantity::events, sum[static_cast<std::size_t>(b)]);
  set(PhaseName::iteration, Quantity::events,
      sum[static_cast<std::size_t>(PhaseName::forward)] + sum[static_cast<std::size_t>(PhaseName::backward)] +
          sum[static_cast<std::size_t>(PhaseName::step)]);
  set(PhaseName::forward, Quantity::gpu_busy, fwd);
  set(PhaseName::backward, Quantity::gpu_busy, bwd);
  set(PhaseName::backward_inner, Quantity::gpu_busy, bwd);
  set(PhaseName::backward_allreduce, Quantity::gpu_busy, 0);
  set(PhaseName::step, Quantity::gpu_busy, step);
  set(PhaseName::iteration, Quantity::gpu_busy, union_length(all));
  return out;
}

Predictor::Predictor(const Dataset& data, const sim::ClusterSpec& cluster)
    : data_(data), cluster_(cluster), device_(&sim::find_device(cluster.gpu)), collectives_(cluster) {
  const std::size_t n = data.obs.size();
  kernel_graph_.assign(n, -1);
  kernel_op_.assign(n, models::kNone);
  groups_.resize(n);
  std::map<std::tuple<DType, bool, bool>, int> graph_of_dtype;  // (dtype, fp32 GEMMs in TF32, cuDNN attention)
  for (std::size_t i = 0; i < n; ++i) {
    const Observation& o = data.obs[i];
    if (o.kind == ObsKind::collective || (o.kind == ObsKind::kernel && o.kernel.cls == KernelClass::collective)) {
      groups_[i] = group_of(o.coll, cluster_, o.source);
      (void)collectives_.cost(o.coll.kind, groups_[i], o.coll.bytes);  // validates the group against the topology
      continue;
    }
    if (o.kind != ObsKind::kernel) continue;
    const KernelSample& k = o.kernel;
    if (k.cls == KernelClass::copy_d2d || k.cls == KernelClass::copy_h2d || k.cls == KernelClass::copy_host ||
        k.cls == KernelClass::reduction)
      continue;
    auto [it, fresh] = graph_of_dtype.emplace(std::tuple{k.dtype, k.tf32, k.cudnn_attention},
                                              static_cast<int>(kernel_graphs_.size()));
    if (fresh) {
      kernel_graphs_.emplace_back();
      kernel_graphs_.back().opt.act_dtype = k.dtype;
      kernel_graph_tf32_.push_back(k.tf32);
      kernel_graph_cudnn_.push_back(k.cudnn_attention);
    }
    kernel_graph_[i] = it->second;
    // An op of its own where its pricing depends on the op: a GEMM's shapes, fused attention
    // (its factors and its dropout), a bandwidth-bound kernel's kind (its factor).
    if (k.gemms.empty() && !k.op_kind) continue;
    models::OpGraph& g = kernel_graphs_[static_cast<std::size_t>(it->second)];
    models::Op op;
    op.id = static_cast<models::OpId>(g.ops.size());
    op.name = k.name;
    op.kind = k.gemms.empty() ? *k.op_kind : models::OpKind::linear;
    if (k.cls == KernelClass::attention) {
      op.fn = models::Fn::sdpa;  // priced with the attention factors
      op.alpha = k.dropout;
    } else if (k.staged) {
      op.fn = models::Fn::linear;  // an nn.Linear the CUDA device stages where its width is odd
    }
    op.gemms = k.gemms;
    op.fwd_flops = k.flops;
    op.fwd_bytes = k.bytes;
    if (k.padded_rows) {  // an output with padded rows: the compute model prices it as aligned
      models::Tensor out;
      out.id = static_cast<models::TensorId>(g.tensors.size());
      out.name = k.name + ".out";
      out.dtype = k.dtype;
      out.row_pitch = 1;
      op.outputs = {out.id};
      g.tensors.push_back(std::move(out));
    }
    kernel_op_[i] = op.id;
    g.ops.push_back(std::move(op));
  }
  // Runs: lowered once; only their pricing and timing depend on the parameters.
  runs_.resize(data.runs.size());
  for (std::size_t r = 0; r < data.runs.size(); ++r) {
    const RunConfig& rc = data.runs[r];
    if (rc.world_size > cluster_.world_size())
      throw InputError(rc.source, "world_size",
                       fmt::format("{} ranks do not fit cluster {} ({} GPUs)", rc.world_size, cluster_.name, cluster_.world_size()));
    const models::ModelConfig mc = rc.model_config ? *rc.model_config : models::load_model(rc.model);
    const zero::Batch batch = zero::resolve_batch(rc.cfg, rc.world_size);
    sim::Target t;
    t.device = device_;
    t.world_size = rc.world_size;
    t.rank = rc.rank;
    t.activation_checkpointing = rc.activation_checkpointing || rc.cfg.activation_checkpointing_present;
    t.keep_output = rc.keep_output;
    models::GraphOptions go = sim::graph_options(rc.cfg, batch, rc.seq_len, rc.attention, models::kDefaultTransformers, t);
    go.variants = rc.variants;
    runs_[r].graph = models::build_graph(mc, go);
    runs_[r].program = sim::predict(runs_[r].graph, rc.cfg, batch, t, false).program;
    t.deepspeed = !rc.zeroplan_executor;
    runs_[r].free_running = sim::free_running_program(runs_[r].graph, rc.cfg, batch, t);
  }
  for (std::size_t i = 0; i < n; ++i)
    if (data.obs[i].kind == ObsKind::phase) {
      const int r = data.obs[i].phase.run;
      if (r < 0 || static_cast<std::size_t>(r) >= runs_.size())
        throw std::logic_error("calibration: a phase observation names no run");
      runs_[static_cast<std::size_t>(r)].obs.push_back(i);
    }
}

void Predictor::predict(const ModelParams& m, const std::vector<char>& want, std::vector<double>& out) const {
  const std::size_t n = data_.obs.size();
  out.resize(n, 0.0);
  auto wanted = [&](std::size_t i) { return want.empty() || want[i] != 0; };
  const sim::CollectiveModel coll = collectives_.with_coefficients(m.collective);
  std::vector<sim::ComputeModel> compute;
  compute.reserve(kernel_graphs_.size());
  // The kernels' own TF32 setting (measured with it on or off), not the profile's, which
  // says what the planned stack does.
  for (std::size_t gi = 0; gi < kernel_graphs_.size(); ++gi) {
    sim::DeviceProfile prof = m.device;
    prof.fp32_gemm_tf32 = kernel_graph_tf32_[gi];
    compute.emplace_back(prof, kernel_graphs_[gi]);
    compute.back().deepspeed = false;  // calibrate --device cuda times zeroplan's own kernels
    compute.back().cudnn_attention = kernel_graph_cudnn_[gi];
  }
  // Copies and reductions of the kernel observations: zeroplan's own (train --out's events,
  // calibrate --device cuda's cases), whose norm sums every tensor in one kernel.
  std::optional<sim::ComputeModel> copies;
  auto copy_model = [&]() -> const sim::ComputeModel& {
    if (!copies) {
      copies.emplace(m.device, empty_graph_);
      copies->deepspeed = false;
    }
    return *copies;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (!wanted(i)) continue;
    const Observation& o = data_.obs[i];
    if (o.kind == ObsKind::collective) {
      out[i] = coll.cost(o.coll.kind, groups_[i], o.coll.bytes).time.v;
      continue;
    }
    if (o.kind != ObsKind::kernel) continue;
    const KernelSample& k = o.kernel;
    switch (k.cls) {
      case KernelClass::collective:
        out[i] = coll.cost(o.coll.kind, groups_[i], o.coll.bytes).time.v;
        if (k.bytes.v > 0) out[i] += copy_model().local_reduction_cost(k.bytes, k.pieces).v;  // a scalar all-reduce's local reduction first
        break;
      case KernelClass::reduction:
        out[i] = copy_model().local_reduction_cost(k.bytes, k.pieces).v;
        break;
      case KernelClass::copy_d2d:
      case KernelClass::copy_h2d:
      case KernelClass::copy_host: {
        const sim::ComputeModel& cp = copy_model();
        const auto src = k.cls == KernelClass::copy_d2d ? zero::Placement::device : zero::Placement::host;
        const auto dst = k.cls == KernelClass::copy_host ? zero::Placement::host : zero::Placement::device;
        out[i] = cp.copy_cost(k.bytes, src, dst, k.pieces, k.copy_kernel, k.host_bound).v;
        break;
      }
      default: {
        const auto& cm = compute[static_cast<std::size_t>(kernel_graph_[i])];
        out[i] = k.optimizer ? cm.optimizer_cost(k.flops, k.bytes).v
                             : cm.compute_cost(kernel_op_[i], k.backward ? zero::Phase::backward : zero::Phase::forward,
                                               k.flops, k.bytes)
                                   .v;
        if (k.reduce_bytes.v > 0) out[i] += cm.local_reduction_cost(k.reduce_bytes, k.pieces).v;
        break;
      }
    }
  }
  for (std::size_t r = 0; r < runs_.size(); ++r) {
    const Run& run = runs_[r];
    if (std::none_of(run.obs.begin(), run.obs.end(), wanted)) continue;
    sim::DeviceProfile prof = m.device;
    // The host's optimizer throughput is shared by the node's ranks (as cli::load_inputs does).
    const RunConfig& rc = data_.runs[r];
    prof.cpu_adam_params_per_second /= std::max(1, std::min(rc.world_size, cluster_.gpus_per_node));
    // The host's costs at the probe the run was timed at (the profile's are at its own).
    prof.host = sim::host_costs_at_probe(prof.host, rc.host_probe_us);
    sim::ComputeModel cm(prof, run.graph);
    cm.deepspeed = !rc.zeroplan_executor;
    cm.cudnn_attention = rc.cudnn_attention;
    cm.stages_products = rc.cuda;
    sim::EngineOptions eo;
    eo.interference = prof.comm_compute_interference;
    const sim::TimeSummary ts = sim::simulate_time(run.program, run.graph, cm, coll, eo);
    PhasePrediction pp = phase_times(run.program, ts.report, rc.unmeasured_events, &cm, &run.graph);
    if (run.free_running &&
        std::any_of(run.obs.begin(), run.obs.end(), [&](std::size_t i) {
          return wanted(i) && data_.obs[i].phase.phase == PhaseName::iteration && data_.obs[i].phase.quantity == Quantity::wall;
        }))
      pp.seconds[static_cast<std::size_t>(PhaseName::iteration)][static_cast<std::size_t>(Quantity::wall)] =
          sim::simulate_time(*run.free_running, run.graph, cm, coll, eo).report.phases.iteration.v;
    for (std::size_t i : run.obs) {
      const PhaseSample& s = data_.obs[i].phase;
      out[i] = pp.seconds[static_cast<std::size_t>(s.phase)][static_cast<std::size_t>(s.quantity)];
    }
  }
}

std::vector<double> Predictor::predict(const ModelParams& m) const {
  std::vector<double> out;
  predict(m, {}, out);
  return out;
}

}  // namespace zp::calibration
