#include "cli/explain.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "core/error.hpp"

namespace zp::cli {

using zero::BufferRole;
using zero::Category;

namespace {

struct Side {
  std::string title;
  Inputs in;
  zero::DsConfig cfg;
  StageResult r;
};

const char* role_title(BufferRole r) {
  switch (r) {
    case BufferRole::flat_params16: return "16-bit parameters (flat buffer)";
    case BufferRole::param_partition16: return "16-bit parameter partitions";
    case BufferRole::param_full16: return "gathered / persistent full 16-bit parameters";
    case BufferRole::hpz_partition16: return "hpZ secondary parameter partitions";
    case BufferRole::master_partition: return "fp32 master parameters";
    case BufferRole::optimizer_state: return "optimizer states";
    case BufferRole::param_grad: return "parameter gradients (param.grad)";
    case BufferRole::flat_grads32: return "fp32 flat gradients";
    case BufferRole::grads_in_partition: return "grads_in_partition";
    case BufferRole::grad_partition: return "flat gradient partition";
    case BufferRole::ipg_bucket: return "reduce (ipg) bucket";
    case BufferRole::comm_staging: return "flatten/cast copies around a collective";
    case BufferRole::gather_flat: return "all-gather flat buffers";
    case BufferRole::activation: return "activations saved for backward";
    case BufferRole::activation_grad: return "activation gradients in flight";
    case BufferRole::step_temp: return "optimizer-step temporaries";
    case BufferRole::offload_staging: return "offload staging buffer";
    case BufferRole::host_master: return "host fp32 master";
    case BufferRole::host_grads32: return "host fp32 gradients";
    case BufferRole::host_staging16: return "host 16-bit staging";
    case BufferRole::host_optimizer_state: return "host optimizer states";
    case BufferRole::checkpoint_host: return "host activation checkpoints";
    case BufferRole::library_workspace: return "cuBLAS / cuBLASLt workspaces";
    case BufferRole::op_scratch: return "backward kernels' temporaries";
    case BufferRole::init_copy: return "set-up copies (freed before training)";
  }
  return "?";
}

// One line in plain words: the formula with this configuration's values, the lifetime.
std::string role_formula(BufferRole role, const Side& s) {
  const auto& i = s.r.program.info;
  const auto& z = s.cfg.zero;
  const std::int64_t b = dtype_size(i.model_dtype);
  const std::string md(dtype_name(i.model_dtype));
  const int N = i.world_size;
  switch (role) {
    case BufferRole::flat_params16:
      return fmt::format("Ψ'={} elements × {} B ({}), replicated on every rank; persistent", i.padded_params, b, md);
    case BufferRole::param_partition16:
      return fmt::format("Σ ceil(numel/N) = {} elements × {} B; persistent", i.partition_elements, b);
    case BufferRole::param_full16:
      return fmt::format("params gathered before their module runs and kept while reused within "
                         "stage3_max_reuse_distance={:.3g} elements, plus params with numel <= "
                         "stage3_param_persistence_threshold={:.3g} kept whole",
                         static_cast<double>(z.stage3_max_reuse_distance),
                         static_cast<double>(z.stage3_param_persistence_threshold));
    case BufferRole::master_partition:
      return i.stage == 0 && i.model_dtype == DType::fp16
                 ? fmt::format("Ψ={} × 4 B, unpartitioned at stage 0; persistent", i.params)
                 : fmt::format("Ψ'/N = {} elements × 4 B; persistent", i.partition_elements);
    case BufferRole::optimizer_state:
      return fmt::format("{} B/param × {} elements ({}); persistent (created at the first step)",
                         s.cfg.optimizer.state_bytes_per_param(), i.stage == 0 ? i.params : i.partition_elements,
                         s.cfg.optimizer.type_name);
    case BufferRole::param_grad:
      if (i.stage <= 1)
        return fmt::format("Ψ={} × {} B: every param.grad is accumulated across the {} micro-steps and kept until the "
                           "{} (allocated during micro-step 0's backward)",
                           i.params, b, i.gas, i.stage == 0 ? "step" : "GAS-boundary reduction copies it into the bucket");
      return fmt::format("autograd gradients waiting for their hook; each is copied into the bucket and freed when "
                         "its hook fires, so only the gradients of the module in flight are live");
    case BufferRole::flat_grads32:
      return fmt::format("fp32 copy of the gradients for the optimizer step ({} elements × 4 B), transient",
                         i.stage == 0 ? i.params : i.partition_elements);
    case BufferRole::grads_in_partition:
      if (i.stage == 2 && i.gas > 1)
        return fmt::format("Σ numel of params overlapping rank {}'s partition ({} B each): allocated at the first "
                           "bucket reduction of every micro-step and dropped by its epilogue, while the gradients "
                           "accumulated so far (all_grad_tensors) keep the previous one: two are live during the "
                           "backward of micro-steps after the first",
                           i.rank, b);
      return fmt::format("Σ numel of params overlapping rank {}'s partition ({} B each): allocated at the first "
                         "bucket reduction ({}), kept until the step",
                         i.rank, b, i.stage == 2 ? "every micro-step reduces" : "stage 1 reduces once, at the GAS boundary");
    case BufferRole::grad_partition:
      return fmt::format("Σ ceil(numel/N) = {} elements; persistent", i.partition_elements);
    case BufferRole::ipg_bucket:
      if (i.stage == 3)
        return fmt::format("reduce_bucket_size={:.3g} elements × {} B, allocated once and kept",
                           static_cast<double>(z.reduce_bucket_size), dtype_size(i.comm_dtype));
      return fmt::format("reduce_bucket_size={:.3g} elements × {} B ({}) × {} buffer{} (overlap_comm {}): "
                         "allocated at the first gradient hook of {}, freed at {}",
                         static_cast<double>(z.reduce_bucket_size), b, md, i.ipg_buffers, i.ipg_buffers > 1 ? "s" : "",
                         i.overlap_comm ? "true: double buffering" : "false",
                         i.stage == 2 ? "every backward" : "micro-step 0's backward",
                         i.stage == 2 ? "that backward's reduction epilogue"
                                      : fmt::format("the GAS-boundary reduction after micro-step {} — so it is live "
                                                    "through every forward and backward in between",
                                                    i.gas - 1));
    case BufferRole::comm_staging:
      return "a flat copy of the bucket's gradient slices made to reduce them (plus a cast copy when "
             "communication_data_type differs), freed after the collective";
    case BufferRole::gather_flat:
      return fmt::format("N × partition flat buffer per all-gather (N={}), freed after the per-param copy", N);
    case BufferRole::activation:
      return fmt::format("tensors autograd saves in forward (micro-batch {}, seq-len {}{}), freed by backward",
                         i.micro_batch, i.seq_len, i.activation_checkpointing ? ", per-layer checkpointing" : "");
    case BufferRole::activation_grad:
      return "gradients of activations between backward ops (and the loss's log-probabilities' gradient "
             "inside its backward)";
    case BufferRole::op_scratch:
      return "a temporary one op's backward kernel allocates and frees (softmax's grad × output)";
    case BufferRole::library_workspace:
      return "one cuBLAS workspace per thread that runs GEMMs (the forward's and autograd's) and one cuBLASLt "
             "workspace, allocated through the caching allocator at the first GEMM and kept (sim/devices.json)";
    case BufferRole::step_temp:
      return "flattened 16-bit gradients of the partition/sub-group before the fp32 cast, transient";
    default:
      return "";
  }
}

std::map<BufferRole, Bytes> by_role_at_peak(const StageResult& r) {
  std::map<BufferRole, Bytes> m;
  for (zero::BufferId b : sim::live_at(r.program, r.memory.peak_event)) {
    const auto& buf = r.program.buffers[static_cast<std::size_t>(b)];
    if (buf.placement != zero::Placement::device) continue;
    m[buf.role] += buf.bytes;
  }
  return m;
}

std::map<BufferRole, Bytes> max_by_role(const StageResult& r) {
  std::map<BufferRole, Bytes> live, peak;
  for (const auto& e : r.program.events) {
    for (zero::BufferId b : r.program.allocs(e)) {
      const auto& buf = r.program.buffers[static_cast<std::size_t>(b)];
      if (buf.placement != zero::Placement::device) continue;
      live[buf.role] += buf.bytes;
      peak[buf.role] = std::max(peak[buf.role], live[buf.role]);
    }
    for (zero::BufferId b : r.program.frees(e)) {
      const auto& buf = r.program.buffers[static_cast<std::size_t>(b)];
      if (buf.placement != zero::Placement::device) continue;
      live[buf.role] -= buf.bytes;
    }
  }
  return peak;
}

// "ms3/bwd/x" → "bwd/x": the same point of different micro-steps compares equal.
std::string without_micro_step(const std::string& name) {
  if (name.rfind("ms", 0) != 0) return name;
  const auto slash = name.find('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

std::string signed_bytes(Bytes b) { return b.v > 0 ? fmt::format("+{}", human_bytes(b)) : human_bytes(b); }

}  // namespace

Explanation explain(const ExplainRequest& req) {
  const bool by_stage = req.stage_b >= 0;
  const bool by_config = !req.vs_ds_config.empty();
  if (by_stage == by_config && !req.given)
    throw InputError("explain", "", "give either --stage A --vs-stage B or --ds-config A --vs-ds-config B");
  std::vector<Side> sides(2);
  for (int k = 0; k < 2; ++k) {
    SimRequest r = req.base;
    if (req.given) {
      const auto& g = (*req.given)[static_cast<std::size_t>(k)];
      r.stages.clear();
      r.check_batch = false;
      Side& sd = sides[static_cast<std::size_t>(k)];
      sd.in = load_inputs(r);
      sd.in.activation_checkpointing = g.activation_checkpointing;
      sd.cfg = g.cfg;
      sd.r = simulate_one(sd.in, sd.cfg);
      sd.title = g.title;
      continue;
    }
    if (by_config && k == 1) r.ds_config = req.vs_ds_config;
    r.stages.clear();
    Inputs in = load_inputs(r);
    int stage = in.cfg.zero.stage;
    if (by_stage) stage = k == 0 ? (req.stage_a >= 0 ? req.stage_a : in.cfg.zero.stage) : req.stage_b;
    if (stage < 0 || stage > 3)
      throw InputError(k == 0 ? "--stage" : "--vs-stage", "", fmt::format("must be one of 0, 1, 2, 3, got {}", stage));
    r.stages = {stage};
    sides[static_cast<std::size_t>(k)].cfg = config_for_stage(in, r, stage);
    sides[static_cast<std::size_t>(k)].r = simulate_one(in, sides[static_cast<std::size_t>(k)].cfg);
    sides[static_cast<std::size_t>(k)].title =
        by_stage ? fmt::format("stage {}", stage) : fmt::format("{}", r.ds_config.empty() ? "defaults" : r.ds_config);
    sides[static_cast<std::size_t>(k)].in = std::move(in);
  }
  nlohmann::json time_json;
  const Side& A = sides[0];
  const Side& B = sides[1];
  const auto& ma = A.r.memory;
  const auto& mb = B.r.memory;
  std::string t;
  t += fmt::format("{} on {} x {}, micro-batch {}, seq-len {}, GAS {} ({} vs {})\n", A.in.model.name, A.in.world_size,
                   A.in.device->name, A.r.batch.micro_batch, A.in.seq_len, A.r.batch.gas, A.title, B.title);
  const std::string ta = A.title, tb = B.title;
  t += fmt::format("\n{:<28}{:>14}{:>14}{:>14}\n", "at the peak", ta, tb, "difference");
  for (int c = 0; c < zero::kNumCategories; ++c) {
    const auto ci = static_cast<std::size_t>(c);
    t += fmt::format("  {:<26}{:>14}{:>14}{:>14}\n", zero::category_name(static_cast<Category>(c)),
                     human_bytes(ma.at_peak[ci]), human_bytes(mb.at_peak[ci]), signed_bytes(mb.at_peak[ci] - ma.at_peak[ci]));
  }
  t += fmt::format("  {:<26}{:>14}{:>14}{:>14}\n", "peak allocated", human_bytes(ma.peak_allocated),
                   human_bytes(mb.peak_allocated), signed_bytes(mb.peak_allocated - ma.peak_allocated));
  t += fmt::format("  {:<26}{:>14}{:>14}{:>14}\n", "device used (predicted)", human_bytes(ma.device_used),
                   human_bytes(mb.device_used), signed_bytes(mb.device_used - ma.device_used));
  t += fmt::format("  {:<26}{:>14}{:>14}\n", fmt::format("fits {}", human_bytes(A.in.device->memory)),
                   ma.fits ? "yes" : "NO", mb.fits ? "yes" : "NO");
  t += fmt::format("\npeak event: {}: {}\n            {}: {}\n", ta, A.r.program.event_name(ma.peak_event), tb,
                   B.r.program.event_name(mb.peak_event));

  // Causes: device buffers grouped by what they are, live at each peak.
  const auto ra = by_role_at_peak(A.r), rb = by_role_at_peak(B.r);
  const auto xa = max_by_role(A.r), xb = max_by_role(B.r);
  std::vector<BufferRole> roles;
  for (const auto& [k, v] : xa) roles.push_back(k);
  for (const auto& [k, v] : xb)
    if (!xa.count(k)) roles.push_back(k);
  auto at = [](const std::map<BufferRole, Bytes>& m, BufferRole r) {
    auto it = m.find(r);
    return it == m.end() ? Bytes{0} : it->second;
  };
  std::stable_sort(roles.begin(), roles.end(), [&](BufferRole x, BufferRole y) {
    const auto dx = std::llabs((at(rb, x) - at(ra, x)).v), dy = std::llabs((at(rb, y) - at(ra, y)).v);
    if (dx != dy) return dx > dy;
    return at(ra, x) + at(rb, x) > at(ra, y) + at(rb, y);
  });
  nlohmann::json causes = nlohmann::json::array();
  t += "\nwhy (device buffers live at each peak, largest difference first):\n";
  for (BufferRole role : roles) {
    const Bytes pa = at(ra, role), pb = at(rb, role);
    const Bytes maxa = at(xa, role), maxb = at(xb, role);
    if (pa.v == 0 && pb.v == 0 && maxa.v < (1 << 20) && maxb.v < (1 << 20)) continue;
    t += fmt::format("- {}: {} {}, {} {} ({}).\n", role_title(role), ta, human_bytes(pa), tb, human_bytes(pb),
                     signed_bytes(pb - pa));
    const std::string fa = role_formula(role, A), fb = role_formula(role, B);
    if (maxa.v > 0 && !fa.empty())
      t += fmt::format("    {}: {}; at most {}{}.\n", ta, fa, human_bytes(maxa), pa.v > 0 ? ", live at the peak" : ", not live at the peak");
    if (maxb.v > 0 && !fb.empty() && (fb != fa || maxb != maxa || (pa.v > 0) != (pb.v > 0)))
      t += fmt::format("    {}: {}; at most {}{}.\n", tb, fb, human_bytes(maxb), pb.v > 0 ? ", live at the peak" : ", not live at the peak");
    causes.push_back({{"buffer", role_title(role)},
                      {"a_at_peak_bytes", pa.v},
                      {"b_at_peak_bytes", pb.v},
                      {"a_max_bytes", maxa.v},
                      {"b_max_bytes", maxb.v},
                      {"a_formula", fa},
                      {"b_formula", fb}});
  }

  // Verdict: the net difference, what changed at the peak and what stayed.
  const Bytes d = mb.peak_allocated - ma.peak_allocated;
  t += "\nverdict: ";
  const double pct = 100.0 * static_cast<double>(d.v) / static_cast<double>(ma.peak_allocated.v);
  if (d.v >= 0)
    t += fmt::format("{} does not use less memory than {} here ({}, {:+.1f}%).", tb, ta, signed_bytes(d), pct);
  else if (pct > -10.0)
    t += fmt::format("{} saves only {} at the peak ({:.1f}% of {}).", tb, human_bytes(Bytes{-d.v}), -pct, ta);
  else
    t += fmt::format("{} saves {} at the peak ({:.1f}% of {}).", tb, human_bytes(Bytes{-d.v}), -pct, ta);
  std::vector<std::string> changed, same;
  for (BufferRole role : roles) {
    const Bytes pa = at(ra, role), pb = at(rb, role);
    if (pa == pb) {
      if (pb.v * 20 >= mb.peak_allocated.v) same.push_back(fmt::format("{} {}", role_title(role), human_bytes(pb)));
    } else if (std::llabs((pb - pa).v) * 100 >= ma.peak_allocated.v) {
      changed.push_back(fmt::format("{} {}", role_title(role), signed_bytes(pb - pa)));
    }
  }
  if (without_micro_step(A.r.program.event_name(ma.peak_event)) !=
      without_micro_step(B.r.program.event_name(mb.peak_event)))
    t += fmt::format(" The peak moves from {} to {}.", A.r.program.event_name(ma.peak_event),
                     B.r.program.event_name(mb.peak_event));
  if (!changed.empty()) {
    t += " What changes at the peak: ";
    for (std::size_t k = 0; k < changed.size(); ++k) t += (k ? "; " : "") + changed[k];
    t += ".";
  }
  if (!same.empty()) {
    t += " What does not change (each >= 5% of the peak): ";
    for (std::size_t k = 0; k < same.size(); ++k) t += (k ? "; " : "") + same[k];
    t += ".";
  }
  const Bytes bucket_b = at(rb, BufferRole::ipg_bucket);
  const std::int64_t psi = B.r.program.info.params;
  const std::int64_t grad_bytes = psi * dtype_size(B.r.program.info.model_dtype);
  if (bucket_b.v > 0 && B.cfg.zero.reduce_bucket_size >= psi)
    t += fmt::format(" The reduce bucket holds reduce_bucket_size={:.3g} elements, more than the model's {} "
                     "gradient elements: its {} is allocated whatever the stage, and is larger than the whole "
                     "16-bit gradient (2Ψ = {}) that stage 2 partitions.",
                     static_cast<double>(B.cfg.zero.reduce_bucket_size), psi, human_bytes(bucket_b),
                     human_bytes(Bytes{grad_bytes}));
  if (B.r.program.info.stage <= 2 && at(rb, BufferRole::flat_params16).v > 0)
    t += fmt::format(" The 16-bit parameters ({}) are replicated below stage 3.",
                     human_bytes(at(rb, BufferRole::flat_params16)));
  t += "\n";

  // Time: phases, then the collectives each side issues, where they run and how much of
  // them the compute stream waits for.
  {
    const auto& pa = A.r.time.report.phases;
    const auto& pb = B.r.time.report.phases;
    t += fmt::format("\ntime per optimizer step ({} micro-steps, on {}):\n", A.r.batch.gas, A.in.cluster.name);
    t += fmt::format("  {:<26}{:>14}{:>14}{:>14}\n", "", ta, tb, "difference");
    auto row = [&](const char* name, Seconds a, Seconds b) {
      t += fmt::format("  {:<26}{:>11.1f} ms{:>11.1f} ms{:>+11.1f} ms\n", name, a.ms(), b.ms(), (b - a).ms());
    };
    row("forward", pa.forward, pb.forward);
    row("backward", pa.backward, pb.backward);
    row("  of which exposed comm", pa.backward_allreduce, pb.backward_allreduce);
    row("step", pa.step, pb.step);
    row("iteration", A.r.time.iteration, B.r.time.iteration);
    if (A.r.time.iteration < pa.iteration || B.r.time.iteration < pb.iteration)
      t += fmt::format("  (the phases are timed apart, as wall_clock_breakdown does; in the iteration {:.1f} / {:.1f} ms "
                       "of them overlap)\n",
                       (pa.iteration - A.r.time.iteration).ms(), (pb.iteration - B.r.time.iteration).ms());
    t += fmt::format("  {:<26}{:>14.1f}{:>14.1f}\n", "samples/s", A.r.time.samples_per_s, B.r.time.samples_per_s);
    struct Group {
      int count = 0;
      Bytes bytes{};
      std::int64_t time_ns = 0, on_compute_ns = 0;
      std::set<int> micro;      // micro-steps of its stored events
      int copied_micro = 0;     // more: those of the repeated block's copies (Program::repeat)
      Seconds time() const { return Seconds{static_cast<double>(time_ns) / 1e9}; }
      Seconds on_compute() const { return Seconds{static_cast<double>(on_compute_ns) / 1e9}; }
      std::size_t micro_steps() const { return micro.size() + static_cast<std::size_t>(copied_micro); }
    };
    auto groups = [](const StageResult& r) {
      std::map<std::tuple<int, int, int>, Group> m;  // (kind, trigger, stream)
      const auto& p = r.program;
      for (const auto& e : p.events) {
        if (e.kind != zero::EventKind::collective) continue;
        auto& g = m[{static_cast<int>(e.coll), static_cast<int>(e.trigger), static_cast<int>(e.stream)}];
        // The event and, in the repeated block, its copies: each sends what it sends.
        const std::int64_t n = p.copies_of(e.id);
        const std::int64_t ns = r.time.report.total_duration_ns(e.id);
        g.count += static_cast<int>(n);
        g.bytes += Bytes{p.bytes_sent(e).v * n};
        g.time_ns += ns;
        if (e.stream == zero::Stream::compute) g.on_compute_ns += ns;
        if (e.micro_step >= 0) g.micro.insert(e.micro_step);
        if (e.micro_step >= 0 && n > 1) g.copied_micro = p.repeat.copies;
      }
      return m;
    };
    const auto ga = groups(A.r), gb = groups(B.r);
    std::set<std::tuple<int, int, int>> keys;
    for (const auto& [k, v] : ga) keys.insert(k);
    for (const auto& [k, v] : gb) keys.insert(k);
    t += "\ncollectives (per rank, per optimizer step):\n";
    nlohmann::json tj = nlohmann::json::array();
    for (const auto& k : keys) {
      const auto [kind, trig, stream] = k;
      const Group a = ga.count(k) ? ga.at(k) : Group{};
      const Group b = gb.count(k) ? gb.at(k) : Group{};
      const int gas = static_cast<int>(B.r.batch.gas);
      auto when = [&](const Group& g) -> std::string {
        if (g.micro_steps() == 0) return "at the step";
        if (static_cast<int>(g.micro_steps()) == gas && gas > 1) return "every micro-step";
        if (g.micro_steps() == 1 && *g.micro.begin() == gas - 1) return "at the GAS boundary";
        return fmt::format("in {} of {} micro-steps", g.micro_steps(), gas);
      };
      auto where = [&](const Group& g) -> std::string {
        if (g.count == 0) return "";
        if (stream == static_cast<int>(zero::Stream::compute))
          return fmt::format("on the compute stream, so all {:.1f} ms of it block compute", g.on_compute().ms());
        return fmt::format("on the {} stream, overlapping compute", zero::stream_name(static_cast<zero::Stream>(stream)));
      };
      const std::string what = fmt::format("{} ({})", zero::coll_kind_name(static_cast<zero::CollKind>(kind)),
                                           zero::trigger_name(static_cast<zero::Trigger>(trig)));
      t += fmt::format("- {}: {} {} × {}, {:.1f} ms; {} {} × {}, {:.1f} ms.\n", what, ta, a.count,
                       human_bytes(a.bytes), a.time().ms(), tb, b.count, human_bytes(b.bytes), b.time().ms());
      if (a.count > 0) t += fmt::format("    {}: {}, {}.\n", ta, when(a), where(a));
      if (b.count > 0) t += fmt::format("    {}: {}, {}.\n", tb, when(b), where(b));
      tj.push_back({{"collective", zero::coll_kind_name(static_cast<zero::CollKind>(kind))},
                    {"trigger", zero::trigger_name(static_cast<zero::Trigger>(trig))},
                    {"stream", zero::stream_name(static_cast<zero::Stream>(stream))},
                    {"a_count", a.count}, {"b_count", b.count},
                    {"a_bytes", a.bytes.v}, {"b_bytes", b.bytes.v},
                    {"a_ms", a.time().ms()}, {"b_ms", b.time().ms()},
                    {"a_blocking_ms", a.on_compute().ms()}, {"b_blocking_ms", b.on_compute().ms()}});
    }
    const auto& ca = A.r.time.report.comm;
    const auto& cb = B.r.time.report.comm;
    Seconds ea{}, eb{};
    for (int k = 0; k < zero::kNumCollKinds; ++k) {
      ea += ca.exposed[static_cast<std::size_t>(k)];
      eb += cb.exposed[static_cast<std::size_t>(k)];
    }
    t += fmt::format("exposed communication (the compute stream waiting): {} {:.1f} ms, {} {:.1f} ms.", ta, ea.ms(), tb, eb.ms());
    if (B.r.program.info.stage == 2 && !B.r.program.info.overlap_comm && B.r.batch.gas > 1)
      t += fmt::format(" {} partitions gradients, so every one of the {} micro-steps reduces its gradients; with "
                       "overlap_comm false those reductions run on the compute stream and are not hidden.",
                       tb, B.r.batch.gas);
    t += "\n";
    time_json = {{"a", result_json(A.r)["time"]}, {"b", result_json(B.r)["time"]}, {"collectives", tj}};
  }

  nlohmann::json sugg = nlohmann::json::array();
  if (req.suggest) {
    t += fmt::format("\nwhat would change it (both re-simulated with one change each):\n");
    struct Variant {
      std::string what;
      std::function<void(zero::DsConfig&, Inputs&)> apply;
      bool b_only = false;  // a change of B alone (e.g. moving to stage 3)
    };
    std::vector<Variant> vs;
    const zero::DsConfig& base = B.cfg;
    for (std::int64_t rbs : {std::int64_t{50000000}, std::int64_t{10000000}}) {
      if (base.zero.reduce_bucket_size > rbs && base.zero.stage >= 1)
        vs.push_back({fmt::format("reduce_bucket_size {:.0e}", static_cast<double>(rbs)),
                      [rbs](zero::DsConfig& c, Inputs&) { c.zero.reduce_bucket_size = rbs; }});
    }
    if (base.zero.stage >= 1 && base.zero.stage <= 2 && base.zero.contiguous_gradients)
      vs.push_back({"contiguous_gradients false", [](zero::DsConfig& c, Inputs&) { c.zero.contiguous_gradients = false; }});
    if (base.zero.stage >= 1 && base.zero.stage <= 2 && !base.zero.overlap())
      vs.push_back({"overlap_comm true", [](zero::DsConfig& c, Inputs&) { c.zero.overlap_comm = true; }});
    if (!B.in.activation_checkpointing)
      vs.push_back({"activation checkpointing (per layer)", [](zero::DsConfig&, Inputs& in) { in.activation_checkpointing = true; }});
    if (B.r.batch.micro_batch > 1) {
      const std::int64_t half = B.r.batch.micro_batch / 2;
      vs.push_back({fmt::format("train_micro_batch_size_per_gpu {}", half), [half](zero::DsConfig& c, Inputs&) {
                      c.train_micro_batch_size_per_gpu = half;
                      if (c.train_batch_size) c.gradient_accumulation_steps.reset();
                    }});
    }
    if (base.zero.stage < 3)
      vs.push_back({fmt::format("{} at stage 3 ({} unchanged)", tb, ta), [](zero::DsConfig& c, Inputs&) { c.zero.stage = 3; }, true});
    t += fmt::format("  {:<40}{:>14}{:>14}{:>22}{:>16}\n", "change", ta, tb, fmt::format("{} - {}", tb, ta),
                     fmt::format("{} iter", tb));
    for (auto& v : vs) {
      try {
        Inputs ia = A.in, ib = B.in;
        zero::DsConfig ca = A.cfg, cb = B.cfg;
        if (!v.b_only) v.apply(ca, ia);
        v.apply(cb, ib);
        const StageResult r2a = v.b_only ? A.r : simulate_one(ia, ca);
        const StageResult r2b = simulate_one(ib, cb);
        const Bytes delta = r2b.memory.peak_allocated - r2a.memory.peak_allocated;
        t += fmt::format("  {:<40}{:>14}{:>14}{:>22}{:>13.1f} ms{}\n", v.what, human_bytes(r2a.memory.peak_allocated),
                         human_bytes(r2b.memory.peak_allocated),
                         fmt::format("{} ({:+.1f}%)", signed_bytes(delta),
                                     100.0 * static_cast<double>(delta.v) / static_cast<double>(r2a.memory.peak_allocated.v)),
                         r2b.time.iteration.ms(), r2b.memory.fits ? "" : "  (B does not fit)");
        sugg.push_back({{"change", v.what},
                        {"a_peak_allocated_bytes", r2a.memory.peak_allocated.v},
                        {"b_peak_allocated_bytes", r2b.memory.peak_allocated.v},
                        {"b_device_used_bytes", r2b.memory.device_used.v},
                        {"b_iteration_ms", r2b.time.iteration.ms()},
                        {"b_fits", r2b.memory.fits}});
      } catch (const InputError& e) {
        t += fmt::format("  {:<40} not possible: {}\n", v.what, e.what());
      }
    }
    t += fmt::format("  {:<40}{:>14}{:>14}{:>22}{:>13.1f} ms\n", "(as configured)", human_bytes(ma.peak_allocated),
                     human_bytes(mb.peak_allocated), signed_bytes(d), B.r.time.iteration.ms());
  }

  Explanation ex;
  ex.json_time = time_json;
  for (const auto& side : sides)
    for (const auto& w : side.in.warnings)
      if (std::find(ex.warnings.begin(), ex.warnings.end(), w) == ex.warnings.end()) ex.warnings.push_back(w);
  ex.text = std::move(t);
  ex.json = {{"model", A.in.model.name},
             {"world_size", A.in.world_size},
             {"a", {{"title", ta}, {"result", result_json(A.r)}}},
             {"b", {{"title", tb}, {"result", result_json(B.r)}}},
             {"causes", causes},
             {"time", time_json},
             {"suggestions", sugg}};
  return ex;
}

}  // namespace zp::cli
