#include "zero/lower/context.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace zp::zero::lowering {

std::int32_t Names::op(models::OpId o) {
  if (op_.empty()) op_.assign(g_.ops.size(), -1);
  auto& l = op_[static_cast<std::size_t>(o)];
  if (l < 0) l = b_.add_label(g_.ops[static_cast<std::size_t>(o)].name);
  return l;
}

std::int32_t Names::tensor(models::TensorId t) {
  if (tensor_.empty()) tensor_.assign(g_.tensors.size(), -1);
  auto& l = tensor_[static_cast<std::size_t>(t)];
  if (l < 0) l = b_.add_label(g_.tensors[static_cast<std::size_t>(t)].name);
  return l;
}

std::int32_t Names::tensor_grad(models::TensorId t) {
  if (tensor_grad_.empty()) tensor_grad_.assign(g_.tensors.size(), -1);
  auto& l = tensor_grad_[static_cast<std::size_t>(t)];
  if (l < 0) l = b_.add_label("grad:" + g_.tensors[static_cast<std::size_t>(t)].name);
  return l;
}

std::int32_t Names::param_grad(models::ParamId p) {
  if (param_grad_.empty()) param_grad_.assign(g_.params.size(), -1);
  auto& l = param_grad_[static_cast<std::size_t>(p)];
  if (l < 0) l = b_.add_label("grad:" + g_.params[static_cast<std::size_t>(p)].name);
  return l;
}

Context::Context(const models::OpGraph& graph, const DsConfig& config, const Batch& bt, const LowerOptions& options,
                 Program& program)
    : g(graph), cfg(config), batch(bt), opt(options), p(program), b(program), names(graph, b), f(analyse(graph)),
      layout(flat_layout(graph, options.world_size)) {
  N = opt.world_size;
  stage = cfg.zero.stage;
  md = cfg.model_dtype();
  cd = cfg.communication_data_type();
  overlap = cfg.zero.overlap();
  rbs = cfg.zero.reduce_bucket_size;
  offload_opt = cfg.zero.offload_optimizer.device != OffloadDevice::none && stage >= 1;
  offload_param = cfg.zero.offload_param.device != OffloadDevice::none && stage == 3;
  ckpt = opt.activation_checkpointing;
  hpz = stage == 3 && cfg.zero.zero_hpz_partition_size > 1 ? cfg.zero.zero_hpz_partition_size : 1;
  // engine.py _do_optimizer_sanity_check: stage 1 + bf16 + fp32 gradient accumulation
  // (no CPU offload) runs BF16_Optimizer instead of the ZeRO optimizer.
  bf16_opt = runs_bf16_optimizer(cfg);
}

void Context::describe_program() {
  auto& i = p.info;
  i.model = g.cfg.name;
  i.stage = stage;
  i.world_size = N;
  i.rank = opt.rank;
  i.micro_batch = batch.micro_batch;
  i.seq_len = g.opt.seq_len;
  i.gas = batch.gas;
  i.model_dtype = md;
  i.comm_dtype = cd;
  i.overlap_comm = overlap;
  i.activation_checkpointing = ckpt;
  i.params = layout.params;
  i.padded_params = stage == 1 || stage == 2 ? layout.padded : layout.params;
  i.partition_elements = stage == 3 ? stage3_partition_elements(g, N) : (stage == 0 ? layout.params : layout.partition);
  i.reduce_bucket_elements = rbs;
  i.ipg_buffers = gradient_buckets(cfg).count;
}

void Context::add_groups() {
  Group dp{"dp", {}};
  for (int r = 0; r < N; ++r) dp.ranks.push_back(r);
  p.groups.push_back(dp);
  dp_group = 0;
  if (hpz > 1) {
    // The hpz-rank block this rank belongs to (ranks [base, base + hpz)).
    Group h{"hpz", {}};
    const int base = opt.rank / static_cast<int>(hpz) * static_cast<int>(hpz);
    for (int r = base; r < base + hpz && r < N; ++r) h.ranks.push_back(r);
    p.groups.push_back(h);
    hpz_group = 1;
  }
}

// CublasHandlePool.cpp: a cuBLAS workspace per (handle, stream), and handles are per
// thread: the one that runs the forward and the autograd engine's device thread (backward)
// each set one on the compute stream at their first GEMM; cuBLASLt's (per handle and
// stream too) is asked for only by the forward's GEMMs with a bias epilogue (addmm).
void Context::library_workspaces() {
  const struct {
    Bytes bytes;
    const char* name;
  } ws[3] = {{opt.cublas_workspace, "cuBLAS workspace (forward thread)"},
             {opt.cublas_workspace, "cuBLAS workspace (autograd thread)"},
             {opt.cublaslt_workspace, "cuBLASLt workspace (forward thread)"}};
  for (int i = 0; i < 3; ++i)
    if (ws[i].bytes.v > 0)
      // (bytes,) u8
      persistent(Category::temporaries, Placement::device, BufferRole::library_workspace, DType::u8, ws[i].bytes.v,
                 ws[i].name, i);
}

std::vector<BufferId> Context::build_model() {
  const DType built = cfg.module_dtype.value_or(DType::fp32);
  std::vector<BufferId> params;
  b.begin(EventKind::marker, Stream::compute, Phase::init, -1, "build_model");
  for (const auto& prm : g.params) {
    // (numel,) the dtype transformers builds the model in
    const BufferId id = b.buffer(Category::params, Placement::device, BufferRole::init_copy, built, prm.numel,
                                 "model param " + prm.name, prm.id);
    b.alloc(id);
    params.push_back(id);
  }
  if (md == built) return params;
  // _cast_module_mixed_precision: param.data = param.data.to(dtype), one param at a time (the
  // copy made, then the old tensor dropped).
  const std::int32_t label = b.label(fmt::format("cast_module_to_{}", dtype_name(md)));
  for (auto& id : params) {
    b.begin(EventKind::marker, Stream::compute, Phase::init, -1, label);
    const Buffer& old = p.buffers[static_cast<std::size_t>(id)];
    const BufferId cast = b.buffer(Category::params, Placement::device, BufferRole::init_copy, md, old.elements,
                                   b.add_label(fmt::format("{} ({})", p.labels[static_cast<std::size_t>(old.name)], dtype_name(md))),
                                   old.ref);
    b.alloc(cast);
    b.free(id);
    id = cast;
  }
  return params;
}

BufferId Context::init_temp(Category c, DType t, std::int64_t elements, std::string name, bool keep) {
  b.begin(EventKind::marker, Stream::compute, Phase::init, -1, name);
  const BufferId id = b.buffer(c, Placement::device, BufferRole::init_copy, t, elements, b.cur().label);
  b.alloc(id);
  if (!keep) b.free(id);
  return id;
}

void Context::free_init(const std::vector<BufferId>& bufs, std::string name) {
  b.begin(EventKind::marker, Stream::compute, Phase::init, -1, std::move(name));
  for (BufferId id : bufs) b.free(id);
}

void Context::empty_cache(std::string name) {
  b.begin(EventKind::marker, Stream::compute, Phase::init, -1, std::move(name));
  b.cur().empty_cache = true;
}

BufferId Context::persistent(Category c, Placement where, BufferRole role, DType t, std::int64_t elements,
                             std::string name, std::int32_t ref) {
  b.begin(EventKind::marker, Stream::compute, Phase::init, -1, name);
  const BufferId id = b.buffer(c, where, role, t, elements, b.cur().label, ref);
  b.alloc(id);
  return id;
}

void Context::optimizer_states(std::int64_t elements, const std::string& name, std::int32_t ref, DType t,
                               bool first_step) {
  const std::int64_t k_state = cfg.optimizer.state_bytes_per_param();
  if (k_state <= 0) return;
  // k_state / 4 tensors of (elements,) in t: Adam's exp_avg and exp_avg_sq (k_state = 8)
  static constexpr const char* kAdam[] = {"exp_avg", "exp_avg_sq"};
  const char* one = "momentum_buffer";
  switch (cfg.optimizer.type) {
    case OptimizerType::adagrad: one = "sum"; break;
    case OptimizerType::lion: one = "exp_avg"; break;
    default: break;
  }
  const std::int64_t n = k_state / 4;
  b.begin(EventKind::marker, Stream::compute, Phase::init, -1, name);
  for (std::int64_t i = 0; i < n; ++i) {
    const BufferId id = b.buffer(Category::optimizer_states, offload_opt ? Placement::host : Placement::device,
                                 offload_opt ? BufferRole::host_optimizer_state : BufferRole::optimizer_state, t,
                                 elements, b.add_label(fmt::format("{}: {}", name, n == 2 ? kAdam[i] : one)), ref);
    b.alloc(id);
    p.buffers[static_cast<std::size_t>(id)].first_step = first_step && !offload_opt;
    (i == 0 ? states.states : states.states2) = id;
  }
}

Event& Context::collective(Stream s, Phase ph, int micro, std::int32_t label, CollKind kind, ReduceOp op, Trigger why,
                           GroupId group, std::int64_t elements, DType t, std::int32_t bucket) {
  Event& c = b.begin(EventKind::collective, s, ph, micro, label);
  // One communicator runs its operations one at a time in the order they were issued,
  // whichever stream issued them: PyTorch queues every collective of a process group on
  // that group's one NCCL stream. A collective on another stream than the group's previous
  // one waits for it (on the same stream the order is the stream's).
  const auto last = at.last_collective.try_emplace(group, -1).first;
  if (last->second >= 0 && p.events[static_cast<std::size_t>(last->second)].stream != s) b.dep(last->second);
  last->second = c.id;
  c.coll = kind;
  c.reduce_op = op;
  c.trigger = why;
  c.group = group;
  c.elements = elements;
  c.dtype = t;
  c.bucket = bucket;
  return c;
}

HostWork& Context::host_event(Phase ph, bool full) {
  if (at.issued_micro != at.micro) {
    // The micro-step lowered before stands for micro-step micro - 1 (where repeated ones are
    // stored once, the copy it stands for).
    at.has_prev_micro = at.issued_micro >= 0 && at.issued_micro < at.micro;
    at.prev_micro_first = at.micro_first;
    at.micro_first = at.issued.size();
    at.issued_micro = at.micro;
  }
  // Recomputation is dispatched like the forward it repeats, and priced the same way.
  if (at.host < 0 || at.host_micro != at.micro || at.host_phase != ph || full) {
    const std::int32_t lbl = b.label(ph == Phase::backward ? "host.backward" : "host.dispatch");
    Event& h = b.begin(EventKind::host, Stream::host, ph, at.micro, lbl);
    at.host = h.id;
    at.host_micro = at.micro;
    at.host_phase = ph;
    at.host_ops = 0;
    // The launch queue: the host waits while kLaunchQueueOps ops are pending.
    const std::size_t n = at.issued.size();
    std::optional<std::size_t> wait;
    if (n >= kLaunchQueueOps) wait = n - kLaunchQueueOps;
    if (at.micro >= 1 && at.has_prev_micro)
      wait = std::max(wait.value_or(0), at.prev_micro_first);
    if (wait && *wait < n) b.dep(at.issued[*wait]);
  }
  return p.events[static_cast<std::size_t>(at.host)].host;
}

void Context::dispatch(Phase ph) {
  if (!opt.host_work) return;
  HostWork& h = host_event(ph, at.host_ops >= kHostGroupOps);
  ++h.ops;
  ++at.host_ops;
  b.next_waits_for(at.host);
  at.issued.push_back(static_cast<EventId>(p.events.size()));  // the op's event, begun next
}

namespace {
// The launches a device event stands for in CUDA's queue: none for a marker or the host's
// own work, one a kernel or collective, none for a view (a copy of no bytes that converts
// nothing), and a copy of k tensors k (one each: Event::tensors, which the copies of the
// reduced gradients into grads_in_partition set to the parameters they copy).
std::int32_t launches_of(const Event& e) {
  if (e.stream == Stream::host || e.kind == EventKind::marker) return 0;
  if (e.kind != EventKind::copy) return 1;
  if (e.mem_bytes.v == 0 && e.copy_kernel == CopyKernel::memcpy) return 0;
  return std::max<std::int32_t>(1, e.tensors);
}
}  // namespace

void Context::launched(EventId e, std::int32_t launches) {
  if (!opt.host_work || launches <= 0) return;
  at.issued.insert(at.issued.end(), static_cast<std::size_t>(launches), e);
}

void Context::launched_since(std::size_t first) {
  for (std::size_t e = first; e < p.events.size(); ++e) launched(static_cast<EventId>(e), launches_of(p.events[e]));
}

void Context::host_hook(Phase ph, bool to_bucket) {
  if (!opt.host_work) return;
  HostWork& h = host_event(ph, false);
  ++(stage == 3 ? h.stage3_grad_hooks : h.grad_hooks);
  if (to_bucket && stage != 3) ++h.bucket_hooks;
}

void Context::host_module_visit(Phase ph, std::int32_t params) {
  if (!opt.host_work) return;
  HostWork& h = host_event(ph, false);
  ++h.module_visits;
  h.stage3_params += params;
}

void Context::host_extra_op(Phase ph, EventId e) {
  if (!opt.host_work) return;
  // The op's own host event, which dispatch() opened or kept for it: the event `e` stays valid.
  const EventId host = at.host;
  ++host_event(ph, false).ops;
  if (at.host != host) throw std::logic_error("host_extra_op: the op's host event is not the current one");
  launched(e);
}

void Context::host_linear_function(Phase ph) {
  if (!opt.host_work) return;
  ++host_event(ph, false).linear_functions;
}

namespace {
// The ZeRO step's per-tensor host cost (fitted where both loops run) is shared between its
// overflow test and its norm as their launches are.
float overflow_loop_share() {
  return float(kOverflowKernelsPerGradient) / (kOverflowKernelsPerGradient + kNormKernelsPerGradient);
}
float norm_loop_share() { return float(kNormKernelsPerGradient) / (kOverflowKernelsPerGradient + kNormKernelsPerGradient); }
// Tensors per host event of an unsynchronised step's loop: the launch queue is looked at
// that often (8 tensors' overflow loop: 104 launches, about 1.2 ms of the H200 machines' host,
// 0.6 ms of the H100's).
constexpr std::int32_t kQueuedLoopTensors = 8;
}  // namespace

bool Context::checks_overflow() const {
  // stage_1_and_2.py tests for overflow when fp16 is enabled, and bf16 unless its
  // check_grad_overflow is off (engine.py; not for a 16-bit module trained without either);
  // stage3.py when its params are fp16.
  return stage == 3 ? md == DType::fp16
                    : cfg.precision == Precision::fp16 || (cfg.precision == Precision::bf16 && cfg.bf16_check_grad_overflow);
}

void Context::queued_step_loops(std::int32_t tensors, bool overflow) {
  // What the device has queued when the backward's host work ends: the launches issued (the
  // ops and what the hooks issued beside them), then the device events after the last of them
  // (the boundary's bucket copies and reductions; a copy of k tensors is k launches).
  std::vector<EventId> queue(at.issued.begin(), at.issued.end());
  for (auto e = static_cast<std::size_t>(queue.empty() ? 0 : queue.back() + 1); e < p.events.size(); ++e) {
    const Event& ev = p.events[e];
    queue.insert(queue.end(), static_cast<std::size_t>(launches_of(ev)), ev.id);
  }
  // The loop before the first read-back (the overflow flag's, or none without the check) in
  // pieces; each piece's first launch waits until the queue has room for it: for the launch
  // kLaunchQueueOps before it to end.
  const int launches = overflow ? kOverflowKernelsPerGradient : kNormKernelsPerGradient;
  const float share = overflow ? overflow_loop_share() : norm_loop_share();
  const auto n = static_cast<std::int64_t>(queue.size());
  for (std::int32_t t = 0; t < tensors; t += kQueuedLoopTensors) {
    step_loop_event(std::min(kQueuedLoopTensors, tensors - t), share);
    std::int64_t waits = n + static_cast<std::int64_t>(t) * launches - static_cast<std::int64_t>(kLaunchQueueOps);
    // Where micro-steps are stored once (Program::repeat), an id in the block stands for its last
    // copy, and one before the block for a fixed event: not before the block's first op.
    if (p.repeat.copies > 0 && at.has_prev_micro) waits = std::max(waits, static_cast<std::int64_t>(at.prev_micro_first));
    if (waits >= 0 && waits < n) b.dep(queue[static_cast<std::size_t>(waits)]);
  }
  at.loop_after_check = overflow ? norm_loop_share() : 0.0f;
}

Event& Context::step_loop_event(std::int32_t tensors, float share) {
  Event& h = b.begin(EventKind::host, Stream::host, Phase::step, -1, b.label("host.optimizer_step"));
  h.host.step = HostStep::zero_optimizer;
  h.host.tensors = tensors;
  h.host.step_base = false;
  h.host.loop_share = share;
  at.step_loop = at.host = h.id;
  at.host_micro = -1;
  at.host_phase = Phase::step;
  at.host_ops = 0;
  return h;
}

void Context::host_step_after_check(EventId check) {
  if (at.loop_after_check <= 0 || at.step_loop < 0) return;
  // The norm's loop: after the flag's .item(), so after everything queued before it.
  step_loop_event(loop_tensors_, at.loop_after_check);
  b.dep(check);
  at.loop_after_check = 0;
}

void Context::host_step(HostStep kind, std::int32_t tensors) {
  if (!opt.host_work) return;
  if (!opt.phase_syncs && kind == HostStep::zero_optimizer && tensors > 0 && phase_syncs_matter(cfg)) {
    loop_tensors_ = tensors;
    queued_step_loops(tensors, checks_overflow());
    return;
  }
  // A ZeRO step's loops (its overflow and norm checks), priced apart from its fixed part,
  // which follows the overflow flag's read-back (host_step_rest). Without the phases'
  // synchronisations (LowerOptions::phase_syncs) DeepSpeedZeroOptimizer's loops are issued as
  // the launch queue lets them (queued_step_loops). The bare optimizer's per-tensor loop
  // (FusedAdam building its tensor lists) likewise, its fixed part (the engine's bookkeeping
  // after the update's launch: zero_grad, the scheduler, the timers) running beside the update.
  const bool loops_apart =
      !offload_opt && (kind == HostStep::zero_optimizer || kind == HostStep::zero3_optimizer);
  const bool rest_apart = loops_apart || (!offload_opt && kind == HostStep::plain);
  Event& h = b.begin(EventKind::host, Stream::host, Phase::step, -1, b.label("host.optimizer_step"));
  h.host.step = kind;
  h.host.tensors = tensors;
  h.host.step_base = !rest_apart;
  // Without the overflow check the ZeRO step loops over the gradients for their norm alone.
  if (kind == HostStep::zero_optimizer && !checks_overflow()) h.host.loop_share = norm_loop_share();
  // The step starts once the backward's work is done (the epilogue synchronises, or the first
  // .item() of FP16_Optimizer's loop waits): everything the backward and the reductions issued.
  b.dep(at.last_compute);
  b.dep(at.last_reduce);
  at.host = h.id;
  at.host_micro = -1;
  at.host_phase = Phase::step;
  at.host_ops = 0;
  if (rest_apart) at.step_loop = h.id;
  // A ZeRO step's loop kernels run beside its loops (the read-back orders what follows), and so
  // do FP16_Optimizer's: its overflow loop reads a flag back per tensor, but its kernels take a
  // few microseconds each and the host issues them slower than the device runs them, so the
  // device keeps up and the loop takes what the host takes. Its first device event (the loop's
  // kernels) runs beside this one; the next waits for it (FusedOptimizerLowering::step). The
  // bare optimizer's update waits for its lists.
  if (!loops_apart && kind != HostStep::fp16_optimizer) b.next_waits_for(h.id);
}

void Context::host_step_rest() {
  if (at.step_loop < 0) return;
  const HostStep kind = p.events[static_cast<std::size_t>(at.step_loop)].host.step;
  Event& h = b.begin(EventKind::host, Stream::host, Phase::step, -1, b.label("host.optimizer_step.rest"));
  h.host.step = kind;
  b.dep(at.step_loop);
  // What the host reads back first: DeepSpeedZeroOptimizer's overflow flag (its norm stays on the
  // device, clipping included, so without the check nothing), stage 3's norm and flag; nothing
  // for the bare optimizer.
  b.dep(kind == HostStep::zero_optimizer ? at.overflow_check : at.last_check);
  at.overflow_check = -1;
  at.host = h.id;
  at.step_loop = -1;
  b.next_waits_for(h.id);
}

}  // namespace zp::zero::lowering
