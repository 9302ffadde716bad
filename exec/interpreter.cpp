#include "exec/interpreter.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <stdexcept>

#include <fmt/format.h>

#include "exec/device_cpu.hpp"
#include "exec/numeric.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cpu/rng.hpp"
#include "zero/lower.hpp"

namespace zp::exec {

namespace cpu = zp::kernels::cpu;
using models::Fn;
using models::OpId;
using models::ParamId;
using models::TensorId;
using zero::BufferId;
using zero::BufferRole;
using zero::CopyOp;
using zero::Event;
using zero::EventKind;

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::size_t U(std::int64_t i) { return static_cast<std::size_t>(i); }
}  // namespace

std::string unsupported_reason(const models::OpGraph& g, const zero::Program& p, const zero::DsConfig& cfg) {
  (void)p;
  if (cfg.zero.offload_param.device == zero::OffloadDevice::nvme || cfg.zero.offload_optimizer.device == zero::OffloadDevice::nvme)
    return "offload to nvme is not executed on CPU ranks (offload to cpu is)";
  using zero::OptimizerType;
  const auto t = cfg.optimizer.type;
  if (t != OptimizerType::adam && t != OptimizerType::adamw && t != OptimizerType::sgd)
    return fmt::format("optimizer {} is not executed (Adam, AdamW, SGD are)", cfg.optimizer.type_name);
  for (const auto& op : g.ops)
    if (op.fn == Fn::none) return fmt::format("op {} has no executable function", op.name);
  return {};
}

Interpreter::Interpreter(const models::OpGraph& g, const zero::Program& p, const zero::DsConfig& cfg, Comm& comm,
                         TrackingAllocator& mem, std::uint64_t seed, Device* device)
    : own_device_(device ? nullptr : std::make_unique<CpuDevice>()),
      dev_(device ? *device : *own_device_),
      g_(g),
      expanded_(p.repeat.copies > 0 ? std::optional<zero::Program>(zero::expand(p)) : std::nullopt),
      p_(expanded_ ? *expanded_ : p),
      cfg_(cfg), comm_(comm), mem_(mem), seed_(seed), order_(p_) {
  host_ = dev_.host_addressable();
  const char* poison = std::getenv("ZEROPLAN_POISON_FRESH");
  poison_ = poison != nullptr && std::string_view(poison) == "1";
  mem_.defer_gradient_zeroing(true);
  fresh_.assign(p_.buffers.size(), kWritten);
  device_memory_.to_host = [this](void* host, const void* data, std::size_t n) { dev_.download_bytes(host, data, n); };
  device_memory_.from_host = [this](void* data, const void* host, std::size_t n) { dev_.upload_bytes(data, host, n); };
  stage_ = p_.info.stage;
  bf16_opt_ = zero::runs_bf16_optimizer(cfg);
  N_ = p_.info.world_size;
  rank_ = p_.info.rank;
  layout_ = zero::flat_layout(g, N_);
  const auto np = g.params.size();
  // The buffer layouts the lowering sized (zero/lower.hpp), indexed here.
  part_off_ = zero::stage3_partition_offsets(g, N_);
  part_off_.pop_back();
  gip_off_ = zero::grads_in_partition_offsets(g, layout_, rank_);
  persist_off_.assign(np, -1);
  fp16_ = p_.info.model_dtype == DType::fp16;
  if (fp16_) {
    const auto& f = cfg.fp16;
    loss_scale_ = f.loss_scale > 0.0 ? f.loss_scale : std::ldexp(1.0, static_cast<int>(f.initial_scale_power));
    hysteresis_ = f.hysteresis;
  }
  tensor_buf_.assign(g.tensors.size(), -1);
  tgrad_buf_.assign(g.tensors.size(), -1);
  pgrad_buf_.assign(np, -1);
  full_buf_.assign(np, -1);
  hpz_buf_.assign(np, -1);
  seconds_.assign(p_.events.size(), 0.0);
  starts_.assign(p_.events.size(), 0.0);
  sent_.assign(p_.events.size(), 0);
}

// ------------------------------------------------------------------ bindings
void Interpreter::bind(BufferId b) {
  const auto& buf = p_.buffers[U(b)];
  switch (buf.role) {
    case BufferRole::activation:
    case BufferRole::op_scratch: tensor_buf_[U(buf.ref)] = b; break;
    case BufferRole::activation_grad: tgrad_buf_[U(buf.ref)] = b; break;
    case BufferRole::param_grad:
      if (pgrad_buf_[U(buf.ref)] < 0) pgrad_buf_[U(buf.ref)] = b;  // the first live one is param.grad
      break;
    case BufferRole::param_full16:
      if (buf.ref >= 0) full_buf_[U(buf.ref)] = b;
      else persist_buf_ = b;
      break;
    case BufferRole::flat_params16:
    case BufferRole::param_partition16: params_buf_ = b; break;
    case BufferRole::hpz_partition16: hpz_buf_[U(buf.ref)] = b; break;
    default: break;
  }
}

void Interpreter::unbind(BufferId b) {
  const auto& buf = p_.buffers[U(b)];
  auto drop = [&](std::vector<BufferId>& v) {
    if (buf.ref >= 0 && v[U(buf.ref)] == b) v[U(buf.ref)] = -1;
  };
  switch (buf.role) {
    case BufferRole::activation:
    case BufferRole::op_scratch: drop(tensor_buf_); break;
    case BufferRole::activation_grad: {
      drop(tgrad_buf_);
      // The tensors a sum passed this gradient on to (Event::passes_gradient).
      if (auto it = grad_aliases_.find(b); it != grad_aliases_.end()) {
        for (TensorId t : it->second)
          if (tgrad_buf_[U(t)] == b) tgrad_buf_[U(t)] = -1;
        grad_aliases_.erase(it);
      }
      break;
    }
    case BufferRole::param_grad: drop(pgrad_buf_); break;
    case BufferRole::param_full16: drop(full_buf_); break;
    case BufferRole::hpz_partition16: drop(hpz_buf_); break;
    default: break;
  }
}

float* Interpreter::f32(BufferId b) const {
  const std::int64_t n = b >= 0 ? p_.buffers[U(b)].elements : 0;
  return f32_range(b, 0, n);
}

float* Interpreter::f32_range(BufferId b, std::int64_t offset, std::int64_t count) const {
  if (b < 0 || !mem_.live(b)) throw std::logic_error(fmt::format("buffer {} is not live", b < 0 ? std::string("-1") : p_.buffer_name(b)));
  if (!host_) throw std::logic_error(fmt::format("{} device: fp32 host views of its buffers were asked for", dev_.name()));
  use(b);
  zero_if_fresh(b);
  const auto& buf = p_.buffers[U(b)];
  if (buf.dtype != DType::fp16 && buf.dtype != DType::bf16) return static_cast<float*>(mem_.data(b)) + offset;
  std::int64_t lo = offset, hi = offset + count;
  auto it = staged_.find(b);
  if (it != staged_.end()) {
    const std::int64_t slo = it->second.lo, shi = slo + static_cast<std::int64_t>(it->second.v.size());
    if (lo >= slo && hi <= shi) return it->second.v.data() + (offset - slo);
    // Widen: write the held range back, then hold the union.
    lo = std::min(lo, slo);
    hi = std::max(hi, shi);
    flush_one(b, it->second);
    staged_.erase(it);
  }
  Staged st;
  st.lo = lo;
  st.v.resize(U(hi - lo));
  const auto* raw = static_cast<const std::uint16_t*>(mem_.data(b)) + lo;
  if (buf.dtype == DType::bf16) cpu::bf16_to_float(st.v.data(), raw, hi - lo);
  else cpu::fp16_to_float(st.v.data(), raw, hi - lo);
  auto& held = staged_[b] = std::move(st);
  return held.v.data() + (offset - lo);
}

void Interpreter::flush_one(BufferId b, const Staged& st) const {
  const auto& buf = p_.buffers[U(b)];
  auto* raw = static_cast<std::uint16_t*>(mem_.data(b)) + st.lo;
  const auto n = static_cast<std::int64_t>(st.v.size());
  if (buf.dtype == DType::bf16) cpu::float_to_bf16(raw, st.v.data(), n);
  else cpu::float_to_fp16(raw, st.v.data(), n);
}

void Interpreter::flush() const {
  for (const auto& [b, st] : staged_) flush_one(b, st);
  staged_.clear();
}

Ref Interpreter::ref(BufferId b, std::int64_t off) const {
  if (b < 0 || !mem_.live(b)) throw std::logic_error(fmt::format("buffer {} is not live", b < 0 ? std::string("-1") : p_.buffer_name(b)));
  use(b);
  zero_if_fresh(b);
  return {mem_.data(b), p_.buffers[U(b)].dtype, off};
}

void Interpreter::use(BufferId b) const {
  if (running_ < 0) return;
  const auto waits = order_.touch(b);
  waits_to_device(waits);
  if (stream_trace_) stream_trace_->events[U(running_)].push_back({false, b});
}

void Interpreter::before_allocation(BufferId b, int pool_stream) {
  // The waits first: the allocation may zero-fill the memory on the current stream.
  const auto waits = order_.allocated(b, pool_stream);
  if (running_ < 0) return;
  waits_to_device(waits);
  if (stream_trace_) stream_trace_->events[U(running_)].push_back({false, b});
}

void Interpreter::after_allocation(BufferId b) {
  if (running_ >= 0 && stream_trace_) stream_trace_->places[U(b)] = mem_.place(b);
}

void Interpreter::waits_to_device(std::span<const zero::EventId> waits) const {
  for (zero::EventId w : waits) {
    if (stream_trace_) stream_trace_->events[U(running_)].push_back({true, w});
    dev_.event_wait(U(w));
  }
}

float* Interpreter::act(TensorId t) const {
  const BufferId b = tensor_buf_[U(t)];
  if (b < 0) throw std::logic_error(fmt::format("tensor {} is not live", g_.tensors[U(t)].name));
  return f32(b);
}
float* Interpreter::grad(TensorId t) const {
  const BufferId b = tgrad_buf_[U(t)];
  return b >= 0 ? f32(b) : nullptr;
}
const std::int64_t* Interpreter::ids(TensorId t) const { return reinterpret_cast<const std::int64_t*>(act(t)); }
std::int64_t Interpreter::numel(TensorId t) const { return shape_numel(g_.tensors[U(t)].shape); }

Ref Interpreter::act_ref(TensorId t) const {
  const BufferId b = tensor_buf_[U(t)];
  if (b < 0) throw std::logic_error(fmt::format("tensor {} is not live", g_.tensors[U(t)].name));
  return ref(b);
}
Ref Interpreter::grad_ref(TensorId t) const {
  const BufferId b = tgrad_buf_[U(t)];
  return b >= 0 ? ref(b) : Ref{};
}
Ref Interpreter::grad_peek(TensorId t) const {
  const BufferId b = tgrad_buf_[U(t)];
  if (b < 0 || !mem_.live(b)) return {};
  return {mem_.data(b), p_.buffers[U(b)].dtype, 0};
}

std::pair<BufferId, std::int64_t> Interpreter::param_at(ParamId p) const {
  if (stage_ < 3) return {params_buf_, layout_.offset[U(p)]};
  if (persist_off_[U(p)] >= 0) return {persist_buf_, persist_off_[U(p)]};
  const BufferId b = full_buf_[U(p)];
  // One rank gathers nothing: the param is its (whole) partition, where the program keeps
  // it on the device.
  if (b < 0 && N_ == 1 && params_buf_ >= 0 && p_.buffers[U(params_buf_)].placement == zero::Placement::device)
    return {params_buf_, part_off_[U(p)]};
  if (b < 0) throw std::logic_error(fmt::format("param {} used but not gathered", g_.params[U(p)].name));
  return {b, 0};
}
float* Interpreter::param(ParamId p) const {
  const auto [b, off] = param_at(p);
  return f32(b) + off;
}
Ref Interpreter::param_ref(ParamId p) const {
  const auto [b, off] = param_at(p);
  return ref(b, off);
}
float* Interpreter::param_grad(ParamId p) const { return f32(param_grad_buf(p)); }
Ref Interpreter::param_grad_ref(ParamId p) const { return ref(param_grad_buf(p)); }
BufferId Interpreter::param_grad_buf(ParamId p) const {
  const BufferId b = pgrad_buf_[U(p)];
  if (b < 0) throw std::logic_error(fmt::format("gradient of {} is not live", g_.params[U(p)].name));
  return b;
}
float* Interpreter::scratch(std::size_t slot, std::int64_t n) {
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  auto& v = scratch_[slot];
  v.assign(U(n), 0.0f);
  return v.data();
}
std::uint64_t Interpreter::dropout_seed() const {
  // Same masks for a sample whatever the stage; recomputation regenerates them.
  return seed_ * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(step_) << 40) ^
         (static_cast<std::uint64_t>(micro_) << 24) ^ static_cast<std::uint64_t>(rank_);
}

// ------------------------------------------------------------------ init
namespace {
// Initial value of every element of param p: N(0, 0.02) for matrices and embeddings,
// 1 for norm weights, 0 for biases; a function of (seed, param) only.
void init_param(const models::Param& prm, std::uint64_t seed, float* out) {
  const bool bias = prm.name.size() >= 4 && prm.name.compare(prm.name.size() - 4, 4, "bias") == 0;
  if (bias) { std::fill(out, out + prm.numel, 0.0f); return; }
  if (prm.shape.size() == 1) { std::fill(out, out + prm.numel, 1.0f); return; }
  cpu::normal_fill(out, prm.numel, seed, static_cast<std::uint64_t>(prm.id) << 36, 0.0f, 0.02f);
}
}  // namespace

float Interpreter::loss_grad() const {
  // d(loss)/d(loss) = 1/GAS (DeepSpeed scales the loss), times the fp16 loss scale.
  return static_cast<float>(loss_scale_ / static_cast<double>(p_.info.gas));
}

void Interpreter::prologue() {
  // The set-up: persistent buffers, and the temporaries transformers and DeepSpeed make and
  // drop on the way (the caching allocator keeps their segments).
  for (zero::EventId id = 0; id < p_.step_begin; ++id) {
    const Event& e = p_.events[U(id)];
    if (e.empty_cache) mem_.empty_cache();
    for (BufferId b : p_.allocs(e)) {
      if (p_.buffers[U(b)].first_step && p_.buffers[U(b)].placement == zero::Placement::device) {
        first_step_.emplace_back(b, static_cast<int>(e.stream));
        continue;
      }
      before_allocation(b, static_cast<int>(e.stream));  // outside a step: its pool only
      mem_.allocate(p_.buffers[U(b)], static_cast<int>(e.stream));
      allocated(b);
      bind(b);
    }
    mem_.after_allocations(e.id);
    for (const auto& s : p_.slices(e)) persist_off_[U(s.param)] = s.bucket_offset;
    for (BufferId b : p_.frees(e)) {
      unbind(b);
      mem_.release(p_.buffers[U(b)]);
    }
  }
  // Peaks are those of the steps (the set-up's temporaries are not a step's).
  mem_.reset_peaks();
  // The params every stage starts from.
  for (const auto& prm : g_.params) {
    std::vector<float> v;
    if (!skip_values_) {
      v.resize(U(prm.numel));
      if (init_) v = init_->at(prm.name).values;
      else init_param(prm, seed_, v.data());
    }
    // The values from element k (none where they are skipped: the device reads nothing).
    auto values_at = [&](std::int64_t k) -> const float* { return v.empty() ? nullptr : v.data() + k; };
    const auto i = U(prm.id);
    const std::int64_t s = ceil_div(prm.numel, N_);
    const std::int64_t shard = std::clamp<std::int64_t>(prm.numel - rank_ * s, 0, s);  // this rank's shard
    for (const auto& buf : p_.buffers) {
      if (!mem_.live(buf.id)) continue;
      const Ref d = ref(buf.id);
      switch (buf.role) {
        case BufferRole::flat_params16: dev_.upload(d.at(layout_.offset[i]), values_at(0), prm.numel); break;
        case BufferRole::param_partition16: dev_.upload(d.at(part_off_[i]), values_at(rank_ * s), shard); break;
        case BufferRole::param_full16:
          if (buf.ref < 0 && persist_off_[i] >= 0) dev_.upload(d.at(persist_off_[i]), values_at(0), prm.numel);
          break;
        case BufferRole::master_partition:
        case BufferRole::host_master:  // offload_optimizer: the same partition, in host memory
          if (stage_ == 3) {
            dev_.upload(d.at(part_off_[i]), values_at(rank_ * s), shard);
          } else if (stage_ == 0) {
            dev_.upload(d.at(layout_.offset[i]), values_at(0), prm.numel);
          } else {
            const std::int64_t lo = rank_ * layout_.partition, a = layout_.offset[i];
            const std::int64_t from = std::max(a, lo), to = std::min(a + prm.numel, lo + layout_.partition);
            if (to > from) dev_.upload(d.at(from - lo), values_at(from - a), to - from);
          }
          break;
        default: break;
      }
    }
  }
  if (!loss_slots_) loss_slots_ = dev_.allocate(static_cast<std::size_t>(p_.info.gas) * sizeof(float));
}

Interpreter::~Interpreter() {
  if (loss_slots_) dev_.release(loss_slots_);
}

namespace {
std::int64_t total_sent(const CommCounters& c) {
  std::int64_t t = 0;
  for (auto b : c.bytes_sent) t += b;
  return t;
}
}  // namespace

// ------------------------------------------------------------------ step
StepResult Interpreter::step(std::int64_t step, const std::vector<MicroBatch>& data) {
  step_ = step;
  loss_sum_ = 0.0;
  grad_norm_ = -1.0;
  overflow_ = false;
  if (static_cast<std::int64_t>(data.size()) != p_.info.gas)
    throw std::logic_error(fmt::format("{} micro-batches for gradient accumulation {}", data.size(), p_.info.gas));
  // The report is the last step's: a first step also creates the optimizer states.
  mem_.reset_peaks();
  const auto t0 = std::chrono::steady_clock::now();
  dev_.step_begin(p_.events.size());
  order_.step_begin();
  // However the step ends (an exception included), later uses are outside any event.
  struct StepEnd {
    Interpreter& it;
    ~StepEnd() {
      it.running_ = -1;
      it.order_.step_end();
    }
  } step_end{*this};
  if (stream_trace_) {
    stream_trace_->events.assign(p_.events.size(), {});
    stream_trace_->places.assign(p_.buffers.size(), std::nullopt);
  }
  for (zero::EventId id = p_.step_begin; id < static_cast<zero::EventId>(p_.events.size()); ++id) {
    const Event& e = p_.events[U(id)];
    micro_ = e.micro_step;
    if (e.kind == EventKind::copy && e.copy_op == CopyOp::load_batch) batch_ = &data[U(e.micro_step)];
    const std::int64_t sent_before = e.kind == EventKind::collective ? total_sent(comm_.counters()) : 0;
    const auto waits = order_.begin(id);
    running_ = id;
    if (order_.transparent(id)) {
      // A host event: Python on DeepSpeed's host thread, nothing for the device to run or time.
      run_event(e);
      running_ = -1;
      continue;
    }
    if (stream_trace_)
      for (zero::EventId w : waits) stream_trace_->events[U(id)].push_back({true, w});
    dev_.event_order(U(id), static_cast<int>(e.stream), waits);
    dev_.event_begin(U(id));
    run_event(e);
    dev_.event_end(U(id));
    running_ = -1;
    if (e.kind == EventKind::collective) sent_[U(id)] = total_sent(comm_.counters()) - sent_before;
  }
  dev_.step_times(seconds_, starts_);
  // The micro-steps' losses, kept on the device until the step ends.
  std::vector<float> losses(U(p_.info.gas));
  dev_.download(losses.data(), Ref{loss_slots_, DType::fp32, 0}, p_.info.gas);
  for (float l : losses) loss_sum_ += static_cast<double>(l);
  StepResult r;
  r.loss = loss_sum_ / static_cast<double>(p_.info.gas);
  r.grad_norm = grad_norm_;
  r.loss_scale = loss_scale_;
  r.skipped = overflow_;
  update_loss_scale();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void Interpreter::create_first_step_buffers() {
  for (const auto& [b, stream] : first_step_) {
    before_allocation(b, stream);
    mem_.allocate(p_.buffers[U(b)], stream);
    after_allocation(b);
    allocated(b);
    bind(b);
  }
  first_step_.clear();
}

void Interpreter::run_event(const Event& e) {
  if (e.kind == EventKind::optimizer && !first_step_.empty()) create_first_step_buffers();
  if (e.empty_cache) mem_.empty_cache();
  for (BufferId b : p_.allocs(e)) {
    before_allocation(b, static_cast<int>(e.stream));
    mem_.allocate(p_.buffers[U(b)], static_cast<int>(e.stream));
    after_allocation(b);
    allocated(b);
    bind(b);
  }
  mem_.after_allocations(e.id);
  switch (e.kind) {
    case EventKind::compute: {
      const auto& op = g_.ops[U(e.op)];
      if (e.phase == zero::Phase::backward) {
        backward_op(op);
      } else {
        forward_op(op);
        if (e.phase == zero::Phase::forward && std::find(op.outputs.begin(), op.outputs.end(), g_.loss) != op.outputs.end()) {
          flush();
          dev_.copy(Ref{loss_slots_, DType::fp32, e.micro_step}, act_ref(g_.loss), 1);
        }
      }
      break;
    }
    case EventKind::copy:
      // A copy event is many runs (one per param or slice): the device may launch them together.
      dev_.batch(true);
      copy_event(e);
      dev_.batch(false);
      break;
    case EventKind::collective: collective_event(e); break;
    case EventKind::optimizer: optimizer_event(e); break;
    case EventKind::marker:
      if (e.passes_gradient) {  // the sum's inputs' gradients are its output's: nothing to compute
        const auto& op = g_.ops[U(e.op)];
        const BufferId y = tgrad_buf_[U(op.outputs[0])];
        if (y < 0) throw std::logic_error(fmt::format("{}: the gradient it passes on is not live", op.name));
        for (TensorId t : op.inputs) {
          tgrad_buf_[U(t)] = y;
          grad_aliases_[y].push_back(t);
        }
      }
      break;
    case EventKind::host: break;  // the executor's own host thread does this work
  }
  flush();
  for (BufferId b : p_.frees(e)) {
    unbind(b);
    fresh_[U(b)] = kWritten;
    blocks_.erase(b);
    if (running_ >= 0) order_.freed(b);
    mem_.release(p_.buffers[U(b)]);
  }
}

// ------------------------------------------------------------------ ops
void Interpreter::forward_op(const models::Op& op) { dev_.forward(op, *this); }
void Interpreter::backward_op(const models::Op& op) {
  // Which fresh gradients of the op's inputs its kernels may write whole (each input once:
  // a tensor that is two operands gets two writes), or which of their column blocks; every
  // other fresh one it touches, among them the gradients of its outputs it reads, is
  // zero-filled when it is touched.
  std::vector<BufferId> may, may_blocks;
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    const BufferId b = tgrad_buf_[U(op.inputs[i])];
    if (b < 0 || (fresh_[U(b)] != kFresh && fresh_[U(b)] != kBlocks)) continue;
    if (std::find(op.inputs.begin(), op.inputs.begin() + static_cast<std::ptrdiff_t>(i), op.inputs[i]) !=
        op.inputs.begin() + static_cast<std::ptrdiff_t>(i))
      continue;  // asked at its first position
    const bool once = std::count(op.inputs.begin(), op.inputs.end(), op.inputs[i]) == 1;
    if (fresh_[U(b)] == kFresh && once && backward_assigns(g_, op, i)) {
      fresh_[U(b)] = kMayAssign;
      may.push_back(b);
      continue;
    }
    std::vector<ColumnBlock> cols = backward_assigns_columns(g_, op, i);
    if (cols.empty()) continue;
    Blocks& bl = blocks_[b];
    bl.width = cols.front().width;
    for (const ColumnBlock& c : cols) {
      const bool unwritten = std::none_of(bl.done.begin(), bl.done.end(), [&](const auto& d) {
        return c.first < d.second && d.first < c.first + c.count;
      });
      if (unwritten && c.width == bl.width) bl.may.push_back(c);
    }
    if (bl.may.empty()) {
      if (bl.done.empty()) blocks_.erase(b);
      continue;
    }
    fresh_[U(b)] = kBlocks;
    may_blocks.push_back(b);
  }
  dev_.backward(op, *this);
  // Written, or still as fresh as before (the op did not reach it: no gradient flowed).
  for (BufferId b : may) fresh_[U(b)] = fresh_[U(b)] == kMayAssign ? kFresh : kWritten;
  for (BufferId b : may_blocks) {
    auto it = blocks_.find(b);
    if (it == blocks_.end()) continue;  // zero-filled whole while the op ran
    Blocks& bl = it->second;
    bl.may.clear();
    bl.claimed = false;
    std::int64_t covered = 0;
    for (const auto& [lo, hi] : bl.done) covered += hi - lo;
    if (covered == bl.width || fresh_[U(b)] != kBlocks) {
      if (covered == bl.width) fresh_[U(b)] = kWritten;
      blocks_.erase(it);
    } else if (bl.done.empty()) {
      fresh_[U(b)] = kFresh;
      blocks_.erase(it);
    }
  }
}

bool Interpreter::accumulates(TensorId t) {
  const BufferId b = tgrad_buf_[U(t)];
  if (b < 0) return true;
  if (fresh_[U(b)] == kBlocks) {  // part of it written by other ops: the rest becomes zeros now
    auto it = blocks_.find(b);
    if (it == blocks_.end()) throw std::logic_error(fmt::format("{}: column blocks not tracked", p_.buffer_name(b)));
    if (it->second.claimed)  // it promised to touch only its blocks
      throw std::logic_error(fmt::format("{}: all of it asked for by the op that claimed a column block of it",
                                         p_.buffer_name(b)));
    use(b);  // (the fills below are this event's use of it)
    zero_unwritten(b, it->second, 0, it->second.width);
    blocks_.erase(it);
    fresh_[U(b)] = kWritten;
    return true;
  }
  if (fresh_[U(b)] != kMayAssign) return true;
  fresh_[U(b)] = kAssigned;
  return false;
}

bool Interpreter::accumulates(TensorId t, ColumnBlock cols) {
  const BufferId b = tgrad_buf_[U(t)];
  if (b < 0) return true;
  if (cols.first == 0 && cols.count == cols.width) return accumulates(t);
  if (fresh_[U(b)] != kBlocks) return true;  // whole: as fresh as before, or written
  Blocks& bl = blocks_.at(b);
  if (auto m = std::find(bl.may.begin(), bl.may.end(), cols); m != bl.may.end()) {
    bl.may.erase(m);
    bl.done.emplace_back(cols.first, cols.first + cols.count);
    bl.claimed = true;
    return false;
  }
  // Not a block it may write whole: the block's unwritten columns become zeros to add into.
  use(b);
  zero_unwritten(b, bl, cols.first, cols.first + cols.count);
  return true;
}

void Interpreter::zero_unwritten(BufferId b, Blocks& bl, std::int64_t lo, std::int64_t hi) const {
  if (auto it = staged_.find(b); it != staged_.end()) {  // the fills go to its memory
    flush_one(b, it->second);
    staged_.erase(it);
  }
  std::sort(bl.done.begin(), bl.done.end());
  const auto& buf = p_.buffers[U(b)];
  const std::int64_t rows = buf.elements / bl.width;
  std::vector<std::pair<std::int64_t, std::int64_t>> gaps;
  std::int64_t at = lo;
  for (const auto& [d0, d1] : bl.done) {
    if (d1 <= at || d0 >= hi) continue;
    if (d0 > at) gaps.emplace_back(at, d0);
    at = std::max(at, d1);
  }
  if (at < hi) gaps.emplace_back(at, hi);
  for (const auto& [g0, g1] : gaps) {
    dev_.zero_columns(Ref{mem_.data(b), buf.dtype, 0}, rows, ColumnBlock{g0, g1 - g0, bl.width});
    bl.done.emplace_back(g0, g1);
  }
}

void Interpreter::allocated(BufferId b) {
  const auto& buf = p_.buffers[U(b)];
  const bool grad = buf.role == BufferRole::activation_grad;
  if (grad) fresh_[U(b)] = kFresh;
  blocks_.erase(b);
  if (poison_ && is_float(buf.dtype) && (grad || !zero::starts_zeroed(buf.role)))
    dev_.fill(Ref{mem_.data(b), buf.dtype, 0}, buf.elements, std::numeric_limits<float>::quiet_NaN());
}

void Interpreter::zero_if_fresh(BufferId b) const {
  const std::uint8_t f = fresh_[U(b)];
  if (f == kBlocks) {
    // Touched by the op that promised some of its blocks (it touches only those), or by
    // another: then its unwritten columns become zeros.
    auto it = blocks_.find(b);
    if (it == blocks_.end()) throw std::logic_error(fmt::format("{}: column blocks not tracked", p_.buffer_name(b)));
    if (it->second.claimed) return;
    zero_unwritten(b, it->second, 0, it->second.width);
    blocks_.erase(it);
    fresh_[U(b)] = kWritten;
    return;
  }
  if (f != kFresh && f != kMayAssign) return;
  fresh_[U(b)] = kWritten;
  const auto& buf = p_.buffers[U(b)];
  dev_.fill(Ref{mem_.data(b), buf.dtype, 0}, buf.elements, 0.0f);
}


// ------------------------------------------------------------------ copies
// Every copy is a sequence of contiguous runs handed to the device (copy, add, fill), so the
// same event moves the same elements on any device.
void Interpreter::copy_event(const Event& e) {
  const auto sl = p_.slices(e);
  auto elems = [&](BufferId b) { return p_.buffers[U(b)].elements; };
  // A slice's gradient values: the param's own gradient while it is live, else the
  // bucket the program copied it into.
  auto grad_src = [&](const zero::BucketSlice& s) -> Ref {
    if (pgrad_buf_[U(s.param)] >= 0) return param_grad_ref(s.param).at(s.param_offset);
    if (e.src_buf >= 0 && s.bucket_offset >= 0) return ref(e.src_buf, s.bucket_offset);
    throw std::logic_error(fmt::format("{}: no gradient for {}", p_.event_name(e.id), g_.params[U(s.param)].name));
  };
  const std::int64_t P = layout_.partition, lo = rank_ * P;
  // The part of [a, a + count) of the flat layout in this rank's partition, from a.
  struct Run {
    std::int64_t skip = 0, count = 0;
  };
  auto in_partition = [&](std::int64_t a, std::int64_t count) -> Run {
    const std::int64_t from = std::max(a, lo), to = std::min(a + count, lo + P);
    return to > from ? Run{from - a, to - from} : Run{};
  };
  switch (e.copy_op) {
    case CopyOp::none: break;
    case CopyOp::load_batch:
      for (std::size_t i = 0; i < g_.inputs.size(); ++i) {
        const TensorId t = g_.inputs[i];
        const auto& v = (*batch_)[i];
        if (static_cast<std::int64_t>(v.size()) != numel(t))
          throw std::logic_error(fmt::format("input {}: {} values for {} elements", g_.tensors[U(t)].name, v.size(), numel(t)));
        dev_.upload_bytes(act_ref(t).base, v.data(), v.size() * sizeof(std::int64_t));
      }
      break;
    case CopyOp::grad_to_bucket:
      for (const auto& s : sl) dev_.copy(ref(e.dst_buf, s.bucket_offset), ref(e.src_buf, s.param_offset), s.count);
      break;
    case CopyOp::grad_accumulate:
      for (const auto& s : sl) dev_.add(ref(e.dst_buf, s.bucket_offset), ref(e.src_buf, s.param_offset), s.count);
      break;
    case CopyOp::flatten: {
      std::int64_t pos = 0;
      for (const auto& s : sl) {
        dev_.copy(ref(e.dst_buf, pos), grad_src(s), s.count);
        pos += s.count;
      }
      break;
    }
    case CopyOp::unflatten_grads: {
      std::int64_t pos = 0;
      for (const auto& s : sl) {
        const Ref to = e.dst_buf >= 0 ? ref(e.dst_buf, s.bucket_offset) : param_grad_ref(s.param).at(s.param_offset);
        dev_.copy(to, ref(e.src_buf, pos), s.count);
        pos += s.count;
      }
      break;
    }
    case CopyOp::to_partition: {
      // grads_in_partition holds whole params; the offloaded host partition holds exactly
      // the partition, by position.
      const bool host = p_.buffers[U(e.dst_buf)].role == BufferRole::host_grads32;
      std::int64_t pos = 0;
      for (const auto& s : sl) {
        const auto i = U(s.param);
        const std::int64_t a = layout_.offset[i] + s.param_offset;
        const Run r = in_partition(a, s.count);
        if (r.count > 0) {
          const std::int64_t at = host ? a + r.skip - lo : gip_off_[i] + s.param_offset + r.skip;
          dev_.add(ref(e.dst_buf, at), ref(e.src_buf, pos + r.skip), r.count);
        }
        pos += s.count;
      }
      break;
    }
    case CopyOp::accumulate: dev_.add(ref(e.dst_buf), ref(e.src_buf), std::min(elems(e.src_buf), elems(e.dst_buf))); break;
    case CopyOp::partition_grads:
      for (std::size_t i = 0; i < g_.params.size(); ++i) {
        if (gip_off_[i] < 0) continue;
        const Run r = in_partition(layout_.offset[i], g_.params[i].numel);
        if (r.count == 0) continue;
        const Ref to = ref(e.dst_buf, layout_.offset[i] + r.skip - lo);
        dev_.copy(to, ref(e.src_buf, gip_off_[i] + r.skip), r.count);
        if (e.src2_buf >= 0) dev_.add(to, ref(e.src2_buf, gip_off_[i] + r.skip), r.count);
      }
      // The partition's padding past the last param (the buffer is not zero-filled).
      if (const std::int64_t have = std::clamp<std::int64_t>(layout_.params - lo, 0, P); have < P)
        dev_.fill(ref(e.dst_buf, have), P - have, 0.0f);
      break;
    case CopyOp::master_to_params: {
      const auto role = p_.buffers[U(e.dst_buf)].role;
      const std::int64_t base = role == BufferRole::flat_params16 && (stage_ == 1 || stage_ == 2) ? lo : 0;
      dev_.copy(ref(e.dst_buf, base + e.offset), ref(e.src_buf, e.offset), e.elements);
      break;
    }
    case CopyOp::gather_unflatten: {
      // The gathered buffer holds one block per rank of the gather's group (all ranks, or
      // the hpZ group); each block has every param's shard of that rank, in slice order.
      const std::int64_t gn = e.group >= 0 ? static_cast<std::int64_t>(p_.groups[U(e.group)].ranks.size()) : N_;
      std::int64_t block = 0;
      for (const auto& s : sl) block += ceil_div(s.count, gn);
      std::int64_t prefix = 0;
      for (const auto& s : sl) {
        const std::int64_t sh = ceil_div(s.count, gn);
        const Ref full = param_ref(s.param);
        for (std::int64_t q = 0; q < gn; ++q)
          dev_.copy(full.at(q * sh), ref(e.src_buf, q * block + prefix), std::clamp<std::int64_t>(s.count - q * sh, 0, sh));
        prefix += sh;
      }
      // hpZ: the forward gather also fills each param's secondary partition, this rank's
      // 1/h of it within its hpZ group, which the backward gathers read.
      if (const std::int64_t h = cfg_.zero.zero_hpz_partition_size; stage_ == 3 && h > 1)
        for (const auto& s : sl) {
          const BufferId sec = hpz_buf_[U(s.param)];
          if (sec < 0) continue;
          const std::int64_t sh = ceil_div(s.count, h), at = (rank_ % h) * sh;
          const std::int64_t have = std::clamp<std::int64_t>(s.count - at, 0, sh);
          dev_.copy(ref(sec), param_ref(s.param).at(at), have);
          dev_.fill(ref(sec, have), sh - have, 0.0f);
        }
      break;
    }
    case CopyOp::interleave: {
      std::int64_t block = 0;
      for (const auto& s : sl) block += ceil_div(s.count, N_);
      std::int64_t prefix = 0;
      for (const auto& s : sl) {
        const std::int64_t sh = ceil_div(s.count, N_);
        const Ref g = grad_src(s);
        for (std::int64_t q = 0; q < N_; ++q)
          dev_.copy(ref(e.dst_buf, q * block + prefix), g.at(q * sh), std::clamp<std::int64_t>(s.count - q * sh, 0, sh));
        prefix += sh;
      }
      break;
    }
    case CopyOp::shard_accumulate: {
      // This rank's chunk of each param: from the reduce-scatter output (blocks per rank,
      // interleaved), or from the all-reduced contiguous bucket (each param whole, in slice
      // order: stage 3 with reduce_scatter false).
      const bool contiguous = p_.buffers[U(e.src_buf)].role == BufferRole::ipg_bucket;
      std::int64_t block = 0;
      for (const auto& s : sl) block += ceil_div(s.count, N_);
      std::int64_t prefix = 0;
      for (const auto& s : sl) {
        const std::int64_t sh = ceil_div(s.count, N_);
        const Ref from = contiguous ? ref(e.src_buf, s.bucket_offset + rank_ * sh) : ref(e.src_buf, rank_ * block + prefix);
        dev_.add(ref(e.dst_buf, part_off_[U(s.param)]), from, std::clamp<std::int64_t>(s.count - rank_ * sh, 0, sh));
        prefix += sh;
      }
      break;
    }
    case CopyOp::subgroup_grads:
      dev_.copy(ref(e.dst_buf), ref(e.src_buf, e.offset), e.elements);
      dev_.fill(ref(e.src_buf, e.offset), e.elements, 0.0f);  // zero_grad of the partition
      break;
    case CopyOp::cast: dev_.copy(ref(e.dst_buf), ref(e.src_buf), std::min(elems(e.src_buf), elems(e.dst_buf))); break;
    case CopyOp::grads_to_list:
    case CopyOp::flatten_list: {
      // One buffer per slice: the event's allocations (its destinations) or frees (its sources).
      const auto list = e.copy_op == CopyOp::grads_to_list ? p_.allocs(e) : p_.frees(e);
      if (list.size() != sl.size())
        throw std::logic_error(fmt::format("{}: {} slices for {} buffers", p_.event_name(e.id), sl.size(), list.size()));
      std::int64_t pos = 0;
      for (std::size_t i = 0; i < sl.size(); ++i) {
        if (e.copy_op == CopyOp::grads_to_list) {
          dev_.copy(ref(list[i]), grad_src(sl[i]), sl[i].count);
        } else {
          dev_.copy(ref(e.dst_buf, pos), ref(list[i]), sl[i].count);
          pos += sl[i].count;
        }
      }
      break;
    }
  }
}

// ------------------------------------------------------------------ collectives
// The sum of squares and whether a value is not finite, over this rank's partition of the
// gradients (what DeepSpeed's norm and overflow check cover on a rank).
NormStats Interpreter::partition_norm() {
  dev_.norm_begin();
  dev_.batch(true);  // the parts may be summed together; norm_end runs them
  const auto host_grads = std::find_if(p_.buffers.begin(), p_.buffers.end(), [&](const zero::Buffer& buf) {
    return buf.role == BufferRole::host_grads32 && mem_.live(buf.id);
  });
  if (stage_ == 3 || host_grads != p_.buffers.end()) {
    // A flat partition of this rank's gradients: stage 3's, or the offloaded host one.
    for (const auto& buf : p_.buffers)
      if ((buf.role == BufferRole::grad_partition || buf.role == BufferRole::host_grads32) && mem_.live(buf.id)) {
        const Ref part[] = {ref(buf.id)};
        dev_.norm_add(part, buf.elements);
      }
    dev_.batch(false);
    return dev_.norm_end();
  }
  std::vector<BufferId> parts;
  for (const auto& buf : p_.buffers)
    if (buf.role == BufferRole::grads_in_partition && mem_.live(buf.id)) parts.push_back(buf.id);
  const std::int64_t P = layout_.partition, lo = rank_ * P;
  std::vector<Ref> at(parts.size());
  for (std::size_t i = 0; i < g_.params.size(); ++i) {
    if (gip_off_[i] < 0) continue;
    const std::int64_t a = layout_.offset[i];
    const std::int64_t from = std::max(a, lo), to = std::min(a + g_.params[i].numel, lo + P);
    if (to <= from) continue;
    for (std::size_t k = 0; k < parts.size(); ++k) at[k] = ref(parts[k], gip_off_[i] + (from - a));
    dev_.norm_add(at, to - from);
  }
  dev_.batch(false);
  return dev_.norm_end();
}

// Runs a collective on a buffer of this device: in place where the communicator reads
// the device's memory (NCCL on the GPU; MPI on the CPU device's host memory), else
// staged through host memory (MPI with a GPU: ranks sharing one GPU).
void Interpreter::run_collective(CollectiveCall c, void* buf, std::size_t bytes) {
  const bool device_comm = comm_.device_buffers() && !dev_.host_addressable();
  if (dev_.host_addressable() || device_comm || c.group.size() == 1) {  // a group of one moves nothing
    c.buf = buf;
    c.on_device = device_comm;
    comm_.run(c);
    return;
  }
  std::vector<std::byte> staged(bytes);
  dev_.download_bytes(staged.data(), buf, bytes);
  c.buf = staged.data();
  comm_.run(c);
  dev_.upload_bytes(buf, staged.data(), bytes);
}

void Interpreter::collective_event(const Event& e) {
  const auto& group = p_.groups[U(e.group)].ranks;
  CollectiveCall c;
  c.kind = e.coll;
  c.elements = e.elements;
  c.dtype = e.dtype;
  c.op = e.reduce_op;
  c.group = group;
  c.root = e.root < 0 ? 0 : e.root;
  if (e.dst_buf < 0) {
    // A scalar the program reduces at the step: the squared gradient norm (sum) or the
    // overflow flag (max), over this rank's partition of the gradients.
    const NormStats st = partition_norm();
    float scalar = e.trigger == zero::Trigger::overflow_check ? (st.nonfinite ? 1.0f : 0.0f) : static_cast<float>(st.sumsq);
    c.buf = &scalar;
    comm_.run(c);
    if (e.trigger == zero::Trigger::grad_norm) grad_norm_ = std::sqrt(static_cast<double>(scalar)) / loss_scale_;
    if (e.trigger == zero::Trigger::overflow_check) overflow_ = scalar > 0.0f;
    return;
  }
  if (e.coll == zero::CollKind::all_gather && e.src_buf >= 0) {
    // Stage 3: this rank's shards of the slices' params into its block of the output: from
    // its partition (a gather over all ranks), or from the params' hpZ secondary partitions
    // (a gather within the hpZ group; src_buf names one of them).
    const auto gn = static_cast<std::int64_t>(group.size());
    const auto gi = static_cast<std::int64_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
    const bool secondary = p_.buffers[U(e.src_buf)].role == BufferRole::hpz_partition16;
    std::int64_t block = 0;
    for (const auto& s : p_.slices(e)) block += ceil_div(s.count, gn);
    std::int64_t prefix = 0;
    for (const auto& s : p_.slices(e)) {
      const std::int64_t sh = ceil_div(s.count, gn);
      const Ref from = secondary ? ref(hpz_buf_[U(s.param)]) : ref(e.src_buf, part_off_[U(s.param)]);
      dev_.copy(ref(e.dst_buf, gi * block + prefix), from, sh);
      prefix += sh;
    }
  }
  flush();  // collectives move the buffers' stored bytes
  const auto esz = static_cast<std::int64_t>(dtype_size(e.dtype));
  use(e.dst_buf);
  if (p_.buffers[U(e.dst_buf)].placement != zero::Placement::device && !dev_.host_addressable())
    throw std::logic_error(fmt::format("{}: a collective on a host buffer ({}): the program places collectives' "
                                       "buffers on the device", p_.event_name(e.id), p_.buffer_name(e.dst_buf)));
  auto* base = static_cast<std::byte*>(mem_.data(e.dst_buf));
  if (e.coll == zero::CollKind::reduce) {
    // Only the part of the packed buffer that lands in the root's partition is reduced.
    const std::int64_t P = layout_.partition, rlo = c.root * P;
    std::vector<std::pair<std::int64_t, std::int64_t>> where;  // (element, count)
    std::int64_t pos = 0, total = 0;
    for (const auto& s : p_.slices(e)) {
      const std::int64_t a = layout_.offset[U(s.param)] + s.param_offset;
      const std::int64_t from = std::max(a, rlo), to = std::min(a + s.count, rlo + P);
      if (to > from) {
        where.emplace_back(pos + (from - a), to - from);
        total += to - from;
      }
      pos += s.count;
    }
    if (total != e.elements)
      throw std::logic_error(fmt::format("{}: {} elements in the root's partition, program says {}", p_.event_name(e.id),
                                         total, e.elements));
    std::vector<std::byte> piece(U(total * esz));
    std::size_t k = 0;
    for (auto [at, cnt] : where) {
      dev_.download_bytes(piece.data() + k, base + at * esz, U(cnt * esz));
      k += U(cnt * esz);
    }
    c.buf = piece.data();
    comm_.run(c);
    k = 0;
    for (auto [at, cnt] : where) {
      dev_.upload_bytes(base + at * esz, piece.data() + k, U(cnt * esz));
      k += U(cnt * esz);
    }
    return;
  }
  run_collective(c, base, U(e.elements * esz));
}

// ------------------------------------------------------------------ optimizer
void Interpreter::optimizer_event(const Event& e) {
  const auto& oc = cfg_.optimizer;
  const Ref states = e.src2_buf >= 0 ? ref(e.src2_buf) : Ref{};
  const Ref states2 = e.src3_buf >= 0 ? ref(e.src3_buf) : Ref{};
  const bool adam = oc.type != zero::OptimizerType::sgd;
  auto update = [&](Ref p, Ref g, std::int64_t at, std::int64_t n, float factor) {
    if (adam) {
      cpu::AdamConfig a;
      a.lr = lr_.value_or(oc.lr);
      a.beta1 = betas_ ? betas_->first : oc.beta1;
      a.beta2 = betas_ ? betas_->second : oc.beta2;
      a.eps = oc.eps;
      a.weight_decay = oc.weight_decay;
      a.decoupled = oc.type == zero::OptimizerType::adamw || oc.adam_w_mode;
      dev_.adam_step(p, g, states.at(at), states2.at(at), n, optimizer_step_.value_or(step_), a, factor);
    } else {
      cpu::SgdConfig sg;
      sg.lr = lr_.value_or(oc.lr);
      sg.momentum = oc.momentum;
      sg.weight_decay = oc.weight_decay;
      dev_.sgd_step(p, g, states ? states.at(at) : Ref{}, n, optimizer_step_.value_or(step_), sg, factor);
    }
  };
  // BF16_Optimizer: every rank holds the all-reduced fp32 gradients of every param; the
  // norm is theirs (local), the update reads this rank's partition, clear_hp_grads zeroes
  // them for the next step.
  if (bf16_opt_) {
    const Ref all = ref(e.src_buf);
    const std::int64_t n = p_.buffers[U(e.src_buf)].elements;
    dev_.norm_begin();
    const Ref whole[] = {all};
    dev_.norm_add(whole, n);
    grad_norm_ = std::sqrt(dev_.norm_end().sumsq);
    double combined = 1.0;
    if (cfg_.gradient_clipping > 0.0) {
      const double clip = (grad_norm_ + 1e-6) / cfg_.gradient_clipping;
      if (clip > 1.0) combined = clip;
    }
    update(ref(e.dst_buf, e.offset), all.at(rank_ * layout_.partition + e.offset), e.offset, e.elements,
           static_cast<float>(1.0 / combined));
    dev_.fill(all, n, 0.0f);
    return;
  }
  // Stage 0 (replicated gradients): the norm and the overflow check are local.
  if (stage_ == 0 || e.src_buf < 0) {
    dev_.norm_begin();
    if (e.src_buf < 0) {
      dev_.batch(true);
      for (const auto& prm : g_.params) {
        const Ref g[] = {param_grad_ref(prm.id)};
        dev_.norm_add(g, prm.numel);
      }
      dev_.batch(false);
    } else {
      const Ref g[] = {ref(e.src_buf)};
      dev_.norm_add(g, e.elements);
    }
    const NormStats st = dev_.norm_end();
    grad_norm_ = std::sqrt(st.sumsq) / loss_scale_;
    if (e.checks_overflow) overflow_ = st.nonfinite;  // FP16_Optimizer's has_overflow
  }
  // The offloaded host gradient partition is consumed by its update (DeepSpeed zeroes it
  // for the next step, and on an overflow too).
  const bool host_grads = e.src_buf >= 0 && p_.buffers[U(e.src_buf)].role == BufferRole::host_grads32;
  if (overflow_) {  // skip the update (fp16: the loss scale drops after the step; bf16: DeepSpeed's check)
    if (host_grads) dev_.fill(ref(e.src_buf, e.offset), e.elements, 0.0f);
    return;
  }
  // DeepSpeed's unscale_and_clip_grads: grads /= loss_scale · max(1, norm / clip).
  double combined = loss_scale_;
  if (cfg_.gradient_clipping > 0.0 && grad_norm_ >= 0.0) {
    const double clip = (grad_norm_ + 1e-6) / cfg_.gradient_clipping;
    if (clip > 1.0) combined *= clip;
  }
  const auto factor = static_cast<float>(1.0 / combined);
  if (e.src_buf < 0) {
    for (const auto& prm : g_.params)
      update(ref(e.dst_buf, layout_.offset[U(prm.id)]), param_grad_ref(prm.id), layout_.offset[U(prm.id)], prm.numel, factor);
    return;
  }
  const Ref grads = ref(e.src_buf, host_grads ? e.offset : 0);
  update(ref(e.dst_buf, e.offset), grads, e.offset, e.elements, factor);
  if (host_grads) dev_.fill(grads, e.elements, 0.0f);
}

void Interpreter::update_loss_scale() {
  if (!fp16_ || cfg_.fp16.loss_scale > 0.0) return;  // static scale
  const auto& f = cfg_.fp16;
  if (overflow_) {
    if (hysteresis_ <= 1) loss_scale_ = std::max(loss_scale_ / 2.0, f.min_loss_scale);
    else --hysteresis_;
    last_overflow_ = step_;
  } else if ((step_ - last_overflow_) % f.loss_scale_window == 0) {
    loss_scale_ *= 2.0;
  }
}

std::vector<CheckpointBlob> Interpreter::checkpoint_blobs(CheckpointPart part) const {
  flush();
  std::vector<CheckpointBlob> out;
  for (zero::EventId id = 0; id < p_.step_begin; ++id)
    for (BufferId b : p_.allocs(p_.events[U(id)])) {
      const auto& buf = p_.buffers[U(b)];
      if (buf.role == zero::BufferRole::init_copy) continue;  // the set-up's, freed before training
      const bool model = buf.category == zero::Category::params;
      const bool optim = buf.category == zero::Category::master_params || buf.category == zero::Category::optimizer_states;
      if ((part == CheckpointPart::model_states && model) || (part == CheckpointPart::optim_states && optim))
        out.push_back({p_.buffer_name(b), mem_.data(b), buf.bytes.v,
                       buf.placement == zero::Placement::device ? &device_memory_ : nullptr});
    }
  return out;
}

nlohmann::json Interpreter::scaler_state() const {
  return {{"loss_scale", loss_scale_}, {"hysteresis", hysteresis_}, {"last_overflow", last_overflow_}};
}

void Interpreter::set_scaler_state(const nlohmann::json& j) {
  loss_scale_ = j.at("loss_scale").get<double>();
  hysteresis_ = j.at("hysteresis").get<std::int64_t>();
  last_overflow_ = j.at("last_overflow").get<std::int64_t>();
}

void Interpreter::set_param_value(ParamId p, std::int64_t i, float v) {
  if (stage_ == 3) throw std::logic_error("set_param_value: stage 3 holds shards");
  flush();
  const std::int64_t f = layout_.offset[U(p)] + i;
  dev_.upload(ref(params_buf_, f), &v, 1);
  for (const auto& buf : p_.buffers) {
    if ((buf.role != BufferRole::master_partition && buf.role != BufferRole::host_master) || !mem_.live(buf.id)) continue;
    const std::int64_t base = stage_ == 0 ? 0 : rank_ * layout_.partition;
    if (f >= base && f < base + buf.elements) dev_.upload(ref(buf.id, f - base), &v, 1);
  }
}

std::vector<float> Interpreter::param_values(ParamId p) const {
  flush();
  const auto& prm = g_.params[U(p)];
  std::vector<float> out(U(prm.numel), 0.0f);
  if (stage_ < 3) {
    dev_.download(out.data(), ref(params_buf_, layout_.offset[U(p)]), prm.numel);
  } else if (persist_off_[U(p)] >= 0) {
    dev_.download(out.data(), ref(persist_buf_, persist_off_[U(p)]), prm.numel);
  } else {
    // Stage 3: only this rank's shard is held; the rest is left zero.
    const std::int64_t sh = ceil_div(prm.numel, N_);
    const std::int64_t have = std::clamp<std::int64_t>(prm.numel - rank_ * sh, 0, sh);
    dev_.download(out.data() + rank_ * sh, ref(params_buf_, part_off_[U(p)]), have);
  }
  return out;
}

}  // namespace zp::exec
