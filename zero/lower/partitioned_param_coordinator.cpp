#include "zero/lower/partitioned_param_coordinator.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "zero/lower/offload.hpp"

namespace zp::zero::lowering {

using models::OpId;
using models::ParamId;

ParamCoordinator::ParamCoordinator(Context& c) : c_(c) {
  gathers_ = c.N > 1 || c.offload_param;
  persistent_.assign(c.g.params.size(), 0);
  for (const auto& prm : c.g.params) {
    if (!gathers_) break;
    if (prm.numel <= c.cfg.zero.stage3_param_persistence_threshold &&
        persistent_total_ + prm.numel <= c.cfg.zero.stage3_model_persistence_threshold) {
      persistent_[static_cast<std::size_t>(prm.id)] = 1;
      persistent_total_ += prm.numel;
    }
  }
}

void ParamCoordinator::build_visits() {
  const auto& g = c_.g;
  visits_.clear();
  OpId o = 0;
  const auto nops = static_cast<OpId>(g.ops.size());
  while (o < nops) {
    const auto& op = g.ops[static_cast<std::size_t>(o)];
    if (op.params.empty()) { ++o; continue; }
    Visit v;
    v.first = o;
    const models::ModuleId mod = op.module;
    OpId e = o;
    while (e < nops && g.ops[static_cast<std::size_t>(e)].module == mod && !g.ops[static_cast<std::size_t>(e)].params.empty())
      ++e;
    v.last = e - 1;
    for (OpId k = v.first; k <= v.last; ++k)
      for (ParamId p : g.ops[static_cast<std::size_t>(k)].params)
        if (std::find(v.params.begin(), v.params.end(), p) == v.params.end()) v.params.push_back(p);
    for (ParamId p : v.params) v.numel += c_.numel(p);
    visits_.push_back(std::move(v));
    o = e;
  }
  visit_of_first_op_.assign(g.ops.size(), -1);
  visit_of_last_op_.assign(g.ops.size(), -1);
  for (std::size_t i = 0; i < visits_.size(); ++i) {
    visit_of_first_op_[static_cast<std::size_t>(visits_[i].first)] = static_cast<std::int32_t>(i);
    visit_of_last_op_[static_cast<std::size_t>(visits_[i].last)] = static_cast<std::int32_t>(i);
  }
}

void ParamCoordinator::build_trace() {
  build_visits();
  const auto& f = c_.f;
  // The module trace of one micro-step: forward visits, then backward in reverse, with
  // each checkpointed layer's visits recomputed before its backward.
  trace_.clear();
  for (std::size_t i = 0; i < visits_.size(); ++i) trace_.push_back({static_cast<std::int32_t>(i), Phase::forward});
  std::int32_t done_layer = -1;
  for (auto i = static_cast<std::int32_t>(visits_.size()) - 1; i >= 0; --i) {
    const std::int32_t layer = f.layer_of_op[static_cast<std::size_t>(visits_[static_cast<std::size_t>(i)].first)];
    if (c_.ckpt && layer >= 0 && layer != done_layer) {
      done_layer = layer;
      for (std::size_t k = 0; k < visits_.size(); ++k)
        if (f.layer_of_op[static_cast<std::size_t>(visits_[k].first)] == layer)
          trace_.push_back({static_cast<std::int32_t>(k), Phase::recompute});
    }
    trace_.push_back({i, Phase::backward});
  }
  // Flattened param trace for the prefetcher, the numel prefix over the trace and, per
  // use, the step of the param's next use (for the reuse-distance rule).
  param_trace_.clear();
  trace_prefix_.assign(trace_.size() + 1, 0);
  trace_param_begin_.assign(trace_.size() + 1, 0);
  for (std::size_t t = 0; t < trace_.size(); ++t) {
    trace_param_begin_[t] = param_trace_.size();
    const auto& v = visits_[static_cast<std::size_t>(trace_[t].visit)];
    for (ParamId p : v.params) param_trace_.push_back({static_cast<std::int32_t>(t), p});
    trace_prefix_[t + 1] = trace_prefix_[t] + v.numel;
  }
  trace_param_begin_[trace_.size()] = param_trace_.size();
  next_use_.assign(param_trace_.size(), std::numeric_limits<std::int32_t>::max());
  std::vector<std::int32_t> seen(c_.g.params.size(), std::numeric_limits<std::int32_t>::max());
  for (std::size_t k = param_trace_.size(); k-- > 0;) {
    next_use_[k] = seen[static_cast<std::size_t>(param_trace_[k].param)];
    seen[static_cast<std::size_t>(param_trace_[k].param)] = param_trace_[k].step;
  }
}

std::string ParamCoordinator::module_name(const Visit& v) const {
  const auto m = c_.g.ops[static_cast<std::size_t>(v.first)].module;
  return m >= 0 ? c_.g.modules[static_cast<std::size_t>(m)].name : c_.g.ops[static_cast<std::size_t>(v.first)].name;
}

void ParamCoordinator::begin_pass() {
  trace_pos_ = 0;
  param_q_ = 0;
  gather_seq_ = 0;
  prefetch_seq_ = 0;
  fetched_for_.assign(c_.g.params.size(), -1);
  if (full_.empty()) full_.assign(c_.g.params.size(), -1);
  if (inflight_from_.empty()) inflight_from_.assign(c_.g.params.size(), -1);
}

bool ParamCoordinator::available(ParamId p) const {
  return !gathers_ || persistent_[static_cast<std::size_t>(p)] || full_[static_cast<std::size_t>(p)] >= 0;
}

// A flat buffer of (group × ceil(numel/group)) elements per param (rank-major blocks), the
// collective, a per-param copy out into (numel,) full buffers, the flat buffer freed.
// (The fetch hook's Python is on the visit's host event: before_op; the launch's is not
// separated out.)
template <class What>
EventId ParamCoordinator::gather(const std::vector<ParamId>& params, Trigger why, Phase ph, std::int64_t key,
                                 What&& what) {
  if (params.empty()) return -1;
  Builder& b = c_.b;
  const bool within_hpz = c_.hpz > 1 && ph != Phase::forward;
  const std::int64_t group_n = within_hpz ? c_.hpz : c_.N;
  std::int64_t gathered = 0, full = 0;
  for (ParamId p : params) {
    gathered += group_n * ceil_div(c_.numel(p), group_n);
    full += c_.numel(p);
  }
  const Stream s = c_.overlap ? Stream::allgather : Stream::compute;
  if (c_.offload_param)
    fetch_from_host(c_, s, ph, b.cached(LabelKind::gather_h2d, key, [&] { return fmt::format("h2d.{}", what()); }),
                    Bytes{gathered / group_n * c_.b16()});
  const int seq = gather_seq_++;
  // The hook that issues this gather runs when the host reaches the module, so the gather
  // cannot start before the compute issued ahead of it is under way; tie it to the end of
  // the op before (an upper bound on how far ahead prefetching runs).
  c_.collective(s, ph, c_.at.micro, b.cached(LabelKind::gather, key, [&] { return fmt::format("all_gather.{}", what()); }),
                CollKind::all_gather, ReduceOp::none, why, within_hpz ? c_.hpz_group : c_.dp_group, gathered, c_.md, seq);
  b.dep(c_.at.last_compute);
  // (Σ group × ceil(numel/group),) model dtype
  const BufferId flat = b.buffer(Category::comm_buffers, Placement::device, BufferRole::gather_flat, c_.md, gathered,
                                 b.cached(LabelKind::gather_buf, key, [&] { return fmt::format("all-gather flat buffer {}", what()); }),
                                 seq);
  b.alloc(flat);
  // Within the hpZ group each rank contributes its secondary partition of every param
  // (src_buf names the first; the others follow the slices), else its primary partition.
  BufferId src = c_.states.params;
  if (within_hpz && !params.empty() && !secondary_.empty() && secondary_[static_cast<std::size_t>(params.front())] >= 0)
    src = secondary_[static_cast<std::size_t>(params.front())];
  b.cur().src_buf = src;
  b.cur().dst_buf = flat;
  for (ParamId p : params) b.slice({p, 0, c_.numel(p), -1});
  Event& cp = b.begin(EventKind::copy, s, ph, c_.at.micro,
                      b.cached(LabelKind::gather_copy, key, [&] { return fmt::format("unflatten.{}", what()); }));
  cp.mem_bytes = Bytes{2 * full * c_.b16()};
  cp.copy_op = CopyOp::gather_unflatten;
  cp.group = within_hpz ? c_.hpz_group : c_.dp_group;  // whose blocks the flat buffer holds
  cp.src_buf = flat;
  for (ParamId p : params) b.slice({p, 0, c_.numel(p), -1});
  for (ParamId p : params) {
    if (full_label_.empty()) full_label_.assign(c_.g.params.size(), -1);
    auto& lbl = full_label_[static_cast<std::size_t>(p)];
    if (lbl < 0) lbl = b.add_label("full " + c_.pname(p));
    // (numel,) model dtype
    const BufferId id = b.buffer(Category::params, Placement::device, BufferRole::param_full16, c_.md, c_.numel(p), lbl, p);
    b.alloc(id);
    full_[static_cast<std::size_t>(p)] = id;
    live_ += c_.numel(p);
  }
  b.free(flat);
  // hpZ: the forward gather also leaves a secondary partition for the backward:
  // (ceil(numel/h),) model dtype per param.
  if (c_.hpz > 1 && ph == Phase::forward) {
    if (secondary_.empty()) secondary_.assign(c_.g.params.size(), -1);
    for (ParamId p : params) {
      auto& h = secondary_[static_cast<std::size_t>(p)];
      if (h >= 0) continue;
      h = b.buffer(Category::params, Placement::device, BufferRole::hpz_partition16, c_.md, ceil_div(c_.numel(p), c_.hpz),
                   "hpz secondary " + c_.pname(p), p);
      b.alloc(h);
    }
  }
  const EventId done = b.cur_id();
  for (ParamId p : params) inflight_from_[static_cast<std::size_t>(p)] = done;
  return done;
}

void ParamCoordinator::before_op(OpId o, Phase ph) {
  const std::int32_t vi = ph == Phase::backward ? visit_of_last_op_[static_cast<std::size_t>(o)]
                                                : visit_of_first_op_[static_cast<std::size_t>(o)];
  if (vi < 0) return;
  // The submodule's fetch and release hooks (parameter_offload.py pre/post forward and
  // backward hooks, fetch_sub_module, release_sub_module) run whether or not it gathers.
  const auto& v = visits_[static_cast<std::size_t>(vi)];
  c_.host_module_visit(ph, static_cast<std::int32_t>(v.params.size()));
  // Advance the trace to this visit.
  while (trace_pos_ < trace_.size() && !(trace_[trace_pos_].visit == vi && trace_[trace_pos_].phase == ph)) ++trace_pos_;
  if (trace_pos_ >= trace_.size()) return;
  std::vector<ParamId> need;
  for (ParamId p : v.params)
    if (!available(p)) need.push_back(p);
  const std::int64_t vkey = static_cast<std::int64_t>(vi) * 4 + static_cast<std::int64_t>(ph);
  gather(need, Trigger::module_fetch, ph, vkey, [&] { return module_name(v); });
  prefetch(ph);
}

// Prefetch along the recorded trace (partitioned_param_coordinator.fetch_sub_module).
void ParamCoordinator::prefetch(Phase ph) {
  while (param_q_ < param_trace_.size() && param_trace_[param_q_].step <= static_cast<std::int32_t>(trace_pos_)) ++param_q_;
  const std::int64_t budget =
      std::min(c_.cfg.zero.stage3_prefetch_bucket_size, c_.cfg.zero.stage3_max_live_parameters - live_);
  std::vector<ParamId> pre;
  std::int64_t pre_numel = 0;
  while (param_q_ < param_trace_.size() && pre_numel < budget) {
    const ParamId p = param_trace_[param_q_].param;
    // Every use the prefetcher passes marks the param as fetched for that step, so the
    // release after its current use keeps it (partitioned_param_coordinator's guard).
    auto& ff = fetched_for_[static_cast<std::size_t>(p)];
    ff = std::max(ff, param_trace_[param_q_].step);
    ++param_q_;
    if (available(p) || std::find(pre.begin(), pre.end(), p) != pre.end()) continue;
    pre.push_back(p);
    pre_numel += c_.numel(p);
  }
  const int pseq = prefetch_seq_++;
  gather(pre, Trigger::prefetch, ph, (static_cast<std::int64_t>(visits_.size()) + pseq) * 4,
         [&] { return fmt::format("prefetch{}", pseq); });
}

void ParamCoordinator::wait_for_params(OpId o) {
  for (ParamId p : c_.g.ops[static_cast<std::size_t>(o)].params) {
    const EventId d = inflight_from_[static_cast<std::size_t>(p)];
    if (d >= 0) c_.b.dep(d);
  }
}

// partitioned_param_coordinator.__params_to_release: not persistent, and not used again
// within max_reuse_distance elements of the trace: modules after this one are scanned while
// the numel traversed before them is below max_reuse_distance; a param seen in that window
// stays gathered.
std::vector<ParamId> ParamCoordinator::to_release(std::size_t t) const {
  const std::int64_t limit = trace_prefix_[t + 1] + c_.cfg.zero.stage3_max_reuse_distance;
  const auto window_end = static_cast<std::int32_t>(
      std::lower_bound(trace_prefix_.begin() + static_cast<std::ptrdiff_t>(t + 1),
                       trace_prefix_.begin() + static_cast<std::ptrdiff_t>(trace_.size()), limit) -
      trace_prefix_.begin());
  std::vector<ParamId> rel;
  for (std::size_t k = trace_param_begin_[t]; k < trace_param_begin_[t + 1]; ++k) {
    const ParamId p = param_trace_[k].param;
    if (persistent_[static_cast<std::size_t>(p)] || full_[static_cast<std::size_t>(p)] < 0) continue;
    if (next_use_[k] < window_end) continue;
    if (fetched_for_[static_cast<std::size_t>(p)] > static_cast<std::int32_t>(t)) continue;
    rel.push_back(p);
  }
  return rel;
}

// (The release hook's Python is priced with the visit's fetch: HostCosts::stage3_module_*.)
void ParamCoordinator::after_op(OpId o, Phase ph) {
  const std::int32_t vi = ph == Phase::backward ? visit_of_first_op_[static_cast<std::size_t>(o)]
                                                : visit_of_last_op_[static_cast<std::size_t>(o)];
  if (vi < 0 || trace_pos_ >= trace_.size()) return;
  const auto& v = visits_[static_cast<std::size_t>(vi)];
  const std::vector<ParamId> rel = to_release(trace_pos_);
  if (rel.empty()) return;
  c_.b.begin(EventKind::marker, Stream::compute, ph, c_.at.micro,
             c_.b.cached(LabelKind::release, vi * 4 + static_cast<std::int64_t>(ph), [&] { return "release." + module_name(v); }));
  for (ParamId p : rel) {
    c_.b.free(full_[static_cast<std::size_t>(p)]);
    full_[static_cast<std::size_t>(p)] = -1;
    inflight_from_[static_cast<std::size_t>(p)] = -1;
    live_ -= c_.numel(p);
  }
}

void ParamCoordinator::end_pass() {
  // Anything still gathered at the end of the pass is released (the trace ends here).
  bool any = false;
  for (std::size_t p = 0; p < full_.size(); ++p)
    if (full_[p] >= 0 && !persistent_[p]) {
      if (!any) c_.b.begin(EventKind::marker, Stream::compute, Phase::backward, c_.at.micro, "release.end_of_backward");
      any = true;
      c_.b.free(full_[p]);
      full_[p] = -1;
      inflight_from_[p] = -1;
      live_ -= c_.g.params[p].numel;
    }
}

void ParamCoordinator::release_secondary_partitions() {
  if (secondary_.empty()) return;
  c_.b.begin(EventKind::marker, Stream::compute, Phase::step, -1, "release_hpz_secondary");
  for (auto& h : secondary_)
    if (h >= 0) {
      c_.b.free(h);
      h = -1;
    }
}

}  // namespace zp::zero::lowering
