// Lowering of (op graph, ds_config, N, rank) into the step program of one rank.
// Each DeepSpeed behaviour is modelled in one function below; REFERENCE.md §1 and
// DeepSpeed's runtime/zero/stage_1_and_2.py, stage3.py and partitioned_param_coordinator.py
// describe what is reproduced.
#include "zero/lower.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include <fmt/format.h>

namespace zp::zero {

using models::OpGraph;
using models::OpId;
using models::ParamId;
using models::TensorId;

namespace {

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
std::int64_t ceil_div(std::int64_t x, std::int64_t m) { return (x + m - 1) / m; }

// ---------------------------------------------------------------------------------
// Builder: appends events and buffers; an event is open until the next begin().
enum class LabelKind : std::uint8_t {
  copy_to_bucket, accumulate_fp32, flatten, flatten_buf, cast_buf, all_reduce, reduce_to, copy_to_partition,
  gather, gather_buf, gather_copy, gather_h2d, release, interleave, rs_in, reduce_scatter,
  accumulate_partition, checkpoint_release,
};

class Builder {
 public:
  explicit Builder(Program& p) : p_(p) {}

  // A new label. Callers that issue a name once per key keep the index themselves
  // (cached() and the Lowering's per-op tables).
  std::int32_t add_label(std::string s) {
    p_.labels.push_back(std::move(s));
    return static_cast<std::int32_t>(p_.labels.size() - 1);
  }
  // A name issued as it comes (every micro-step's "batch", the step's "optimizer") is
  // interned: issued again it gets the index it got first, so a program's labels do not
  // depend on how many micro-steps were lowered one by one (see Lowering::replicate).
  std::int32_t label(std::string s) {
    auto [it, fresh] = interned_.try_emplace(s, static_cast<std::int32_t>(p_.labels.size()));
    if (fresh) p_.labels.push_back(std::move(s));
    return it->second;
  }

  // Labels repeat across micro-steps: format each (kind, index) once.
  // Indices are small (op, param, bucket or visit numbers): a flat table per kind, with a
  // map for the rare large or negative one.
  template <class Make>
  std::int32_t cached(LabelKind kind, std::int64_t index, Make&& make) {
    constexpr std::int64_t kFlat = std::int64_t{1} << 20;
    if (index >= 0 && index < kFlat) {
      auto& t = flat_[static_cast<std::size_t>(kind)];
      const auto i = static_cast<std::size_t>(index);
      if (i >= t.size()) t.resize(std::max<std::size_t>(i + 1, t.size() * 2), -1);
      if (t[i] < 0) t[i] = add_label(make());
      return t[i];
    }
    const std::uint64_t key = (static_cast<std::uint64_t>(kind) << 48) ^ static_cast<std::uint64_t>(index);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const std::int32_t l = add_label(make());
    cache_.emplace(key, l);
    return l;
  }

  BufferId buffer(Category c, Placement where, BufferRole role, DType t, std::int64_t elements,
                  std::int32_t name, std::int32_t ref = -1) {
    Buffer b;
    b.id = static_cast<BufferId>(p_.buffers.size());
    b.category = c;
    b.placement = where;
    b.role = role;
    b.dtype = t;
    b.elements = elements;
    b.bytes = Bytes{elements * dtype_size(t)};
    b.ref = ref;
    b.name = name;
    p_.buffers.push_back(b);
    return b.id;
  }
  BufferId buffer(Category c, Placement where, BufferRole role, DType t, std::int64_t elements,
                  std::string name, std::int32_t ref = -1) {
    return buffer(c, where, role, t, elements, label(std::move(name)), ref);
  }

  Event& begin(EventKind k, Stream s, Phase ph, int micro, std::int32_t lbl) {
    close();
    Event& e = p_.events.emplace_back();
    e.id = static_cast<EventId>(p_.events.size() - 1);
    e.kind = k;
    e.stream = s;
    e.phase = ph;
    e.micro_step = static_cast<std::int16_t>(micro);
    e.label = lbl;
    e.alloc_begin = e.alloc_end = static_cast<std::uint32_t>(p_.alloc_list.size());
    e.free_begin = e.free_end = static_cast<std::uint32_t>(p_.free_list.size());
    e.dep_begin = e.dep_end = static_cast<std::uint32_t>(p_.dep_list.size());
    e.slice_begin = e.slice_end = static_cast<std::uint32_t>(p_.slice_list.size());
    open_ = true;
    return e;
  }
  Event& begin(EventKind k, Stream s, Phase ph, int micro, std::string lbl) {
    return begin(k, s, ph, micro, label(std::move(lbl)));
  }
  Event& cur() { return p_.events.back(); }
  EventId cur_id() const { return static_cast<EventId>(p_.events.size() - 1); }

  void alloc(BufferId b) { p_.alloc_list.push_back(b); }
  void free(BufferId b) { p_.free_list.push_back(b); }
  void dep(EventId d) {
    if (d >= 0 && d != cur_id()) p_.dep_list.push_back(d);
  }
  void slice(const BucketSlice& s) { p_.slice_list.push_back(s); }

  void close() {
    if (!open_) return;
    Event& e = p_.events.back();
    e.alloc_end = static_cast<std::uint32_t>(p_.alloc_list.size());
    e.free_end = static_cast<std::uint32_t>(p_.free_list.size());
    e.dep_end = static_cast<std::uint32_t>(p_.dep_list.size());
    e.slice_end = static_cast<std::uint32_t>(p_.slice_list.size());
    open_ = false;
  }

 private:
  Program& p_;
  bool open_ = false;
  std::unordered_map<std::uint64_t, std::int32_t> cache_;
  std::unordered_map<std::string, std::int32_t> interned_;
  std::array<std::vector<std::int32_t>, 18> flat_;  // one per LabelKind
};

// Per-tensor and per-param facts of the graph that do not depend on the micro-step.
struct GraphFacts {
  std::vector<OpId> last_fwd_use;    // last forward op reading or producing the tensor
  std::vector<OpId> min_saver;       // earliest op saving it (its backward frees it), -1 none
  std::vector<OpId> grad_first;      // backward op that first produces its gradient (max consumer)
  std::vector<char> requires_grad;
  std::vector<OpId> param_first_bwd; // max op reading the param: its grad appears there
  std::vector<OpId> param_ready;     // min op reading the param: its hook fires there
  std::vector<std::vector<ParamId>> ready_at_op;  // params whose hook fires at op's backward
  std::vector<std::int32_t> layer_of_op;
};

GraphFacts analyse(const OpGraph& g) {
  const auto nt = g.tensors.size();
  const auto np = g.params.size();
  GraphFacts f;
  f.last_fwd_use.assign(nt, -1);
  f.min_saver.assign(nt, -1);
  f.grad_first.assign(nt, -1);
  f.requires_grad.assign(nt, 0);
  f.param_first_bwd.assign(np, -1);
  f.param_ready.assign(np, -1);
  f.ready_at_op.assign(g.ops.size(), {});
  f.layer_of_op.assign(g.ops.size(), -1);
  for (const auto& t : g.tensors) {
    const bool floating = t.dtype == DType::fp32 || t.dtype == DType::fp16 || t.dtype == DType::bf16;
    f.requires_grad[static_cast<std::size_t>(t.id)] = floating && t.producer != models::kNone;
  }
  for (const auto& op : g.ops) {
    f.layer_of_op[static_cast<std::size_t>(op.id)] = op.layer;
    for (TensorId t : op.inputs) {
      auto& u = f.last_fwd_use[static_cast<std::size_t>(t)];
      u = std::max(u, op.id);
      if (f.requires_grad[static_cast<std::size_t>(t)]) {
        auto& gf = f.grad_first[static_cast<std::size_t>(t)];
        gf = std::max(gf, op.id);
      }
    }
    for (TensorId t : op.outputs) {
      auto& u = f.last_fwd_use[static_cast<std::size_t>(t)];
      u = std::max(u, op.id);
    }
    for (TensorId t : op.saved) {
      auto& s = f.min_saver[static_cast<std::size_t>(t)];
      if (s < 0 || op.id < s) s = op.id;
    }
    for (ParamId p : op.params) {
      auto& fb = f.param_first_bwd[static_cast<std::size_t>(p)];
      fb = std::max(fb, op.id);
      auto& r = f.param_ready[static_cast<std::size_t>(p)];
      if (r < 0 || op.id < r) r = op.id;
    }
  }
  for (std::size_t p = 0; p < np; ++p)
    if (f.param_ready[p] >= 0) f.ready_at_op[static_cast<std::size_t>(f.param_ready[p])].push_back(static_cast<ParamId>(p));
  return f;
}

// A ZeRO-3 module visit: a maximal run of consecutive ops of one module.
struct Visit {
  OpId first = -1, last = -1;
  std::vector<ParamId> params;
  std::int64_t numel = 0;
};

// ---------------------------------------------------------------------------------
class Lowering {
 public:
  Lowering(const OpGraph& g, const DsConfig& cfg, const Batch& batch, const LowerOptions& opt, Program& p)
      : g_(g), cfg_(cfg), batch_(batch), opt_(opt), p_(p), b_(p), f_(analyse(g)) {
    N_ = opt.world_size;
    stage_ = cfg.zero.stage;
    md_ = cfg.model_dtype();
    cd_ = cfg.communication_data_type();
    overlap_ = cfg.zero.overlap();
    rbs_ = cfg.zero.reduce_bucket_size;
    layout_ = flat_layout(g, N_);
    offload_opt_ = cfg.zero.offload_optimizer.device != OffloadDevice::none && stage_ >= 1;
    offload_param_ = cfg.zero.offload_param.device != OffloadDevice::none && stage_ == 3;
    ckpt_ = opt.activation_checkpointing;
    ckpt_input_.assign(g.tensors.size(), 0);
    // torch.utils.checkpoint keeps every tensor argument of the checkpointed layer: the
    // hidden states, and whatever else the layer reads from outside it (BERT's extended
    // attention mask, Llama's rotary cos/sin).
    if (ckpt_)
      for (const auto& l : g.layers) {
        if (l.input >= 0) ckpt_input_[static_cast<std::size_t>(l.input)] = 1;
        for (OpId o = l.first; o >= 0 && o <= l.last; ++o)
          for (TensorId t : g.ops[static_cast<std::size_t>(o)].inputs) {
            const OpId prod = g.tensors[static_cast<std::size_t>(t)].producer;
            if (prod < l.first || prod > l.last) ckpt_input_[static_cast<std::size_t>(t)] = 1;
          }
      }
    hpz_ = stage_ == 3 && cfg.zero.zero_hpz_partition_size > 1 ? cfg.zero.zero_hpz_partition_size : 1;
    // engine.py _do_optimizer_sanity_check: stage 1 + bf16 + fp32 gradient accumulation
    // (no CPU offload) runs BF16_Optimizer instead of the ZeRO optimizer.
    bf16_opt_ = runs_bf16_optimizer(cfg);
  }

  void run() {
    // Size the program once: about three events and two buffers per op and micro-step.
    const auto per_micro = g_.ops.size() * (ckpt_ ? 4 : 3) + g_.params.size() * 2;
    p_.events.reserve(per_micro * static_cast<std::size_t>(gas()) + 64);
    p_.buffers.reserve(per_micro * static_cast<std::size_t>(gas()) + 64);
    p_.alloc_list.reserve(per_micro * static_cast<std::size_t>(gas()) + 64);
    p_.free_list.reserve(per_micro * static_cast<std::size_t>(gas()) + 64);
    p_.dep_list.reserve(2 * per_micro * static_cast<std::size_t>(gas()) + 64);
    p_.slice_list.reserve(per_micro * static_cast<std::size_t>(gas()) + 64);
    setup_info();
    setup_groups();
    prologue();
    p_.step_begin = static_cast<EventId>(p_.events.size());
    if (opt_.copied_micro_steps) *opt_.copied_micro_steps = 0;
    const int G = gas();
    // Micro-steps are lowered one by one until one repeats the one before it: micro-step 2
    // micro-step 1, else 3 micro-step 2 (micro-step 0 may differ from the rest, and with it
    // where micro-step 1 finds what micro-step 0 left). The micro-steps after it, to G-2,
    // are then copies of it.
    std::array<Marks, 5> at{};
    int m = 0, compared = -1;
    for (; m < G; ++m) {
      if (m < static_cast<int>(at.size())) {
        b_.close();  // finishes the event before; the micro-step opens its own first
        at[static_cast<std::size_t>(m)] = marks();
      }
      if ((m == 3 || m == 4) && opt_.replicate_micro_steps && G > m + 1 &&
          periodic(at[static_cast<std::size_t>(m - 2)], at[static_cast<std::size_t>(m - 1)], at[static_cast<std::size_t>(m)])) {
        compared = m - 2;
        break;
      }
      micro_step(m);
    }
    if (compared >= 0) {
      // Lower the last micro-step and the step right after the repeating one, then make
      // room for the copies.
      const Marks& a = at[static_cast<std::size_t>(compared)];
      const Marks& b = at[static_cast<std::size_t>(compared + 1)];
      const Marks& c = at[static_cast<std::size_t>(compared + 2)];
      const int copies = G - 1 - m;
      micro_step(G - 1);
      step();
      b_.close();
      replicate(a, b, c, copies);
      p_.repeat = {static_cast<EventId>(b.events), static_cast<EventId>(c.events - b.events), copies};
      if (opt_.copied_micro_steps) *opt_.copied_micro_steps = copies;
      return;
    }
    step();
    b_.close();
  }

 private:
  int gas() const { return static_cast<int>(batch_.gas); }
  std::int64_t b16() const { return dtype_size(md_); }
  Stream red_stream() const { return overlap_ ? Stream::reduction : Stream::compute; }

  // One collective event (nccl-tests style: kind, group, count, dtype) and why it was issued.
  Event& collective(Stream s, Phase ph, int micro, std::int32_t label, CollKind kind, ReduceOp op, Trigger why,
                    GroupId group, std::int64_t elements, DType t, std::int32_t bucket) {
    Event& c = b_.begin(EventKind::collective, s, ph, micro, label);
    c.coll = kind;
    c.reduce_op = op;
    c.trigger = why;
    c.group = group;
    c.elements = elements;
    c.dtype = t;
    c.bucket = bucket;
    return c;
  }
  std::int64_t numel(ParamId p) const { return g_.params[static_cast<std::size_t>(p)].numel; }
  const std::string& pname(ParamId p) const { return g_.params[static_cast<std::size_t>(p)].name; }
  bool hooks_installed() const {
    // stage_1_and_2.py: hooks when partition_gradients, overlap_comm or contiguous_gradients.
    if (bf16_opt_) return false;
    return stage_ == 2 || overlap_ || cfg_.zero.contiguous_gradients;
  }
  DType accum_dtype() const { return cfg_.grad_accum_dtype.value_or(md_); }

  void setup_info() {
    auto& i = p_.info;
    i.model = g_.cfg.name;
    i.stage = stage_;
    i.world_size = N_;
    i.rank = opt_.rank;
    i.micro_batch = batch_.micro_batch;
    i.seq_len = g_.opt.seq_len;
    i.gas = batch_.gas;
    i.model_dtype = md_;
    i.comm_dtype = cd_;
    i.overlap_comm = overlap_;
    i.activation_checkpointing = ckpt_;
    i.params = layout_.params;
    i.padded_params = stage_ == 1 || stage_ == 2 ? layout_.padded : layout_.params;
    i.partition_elements = stage_ == 3 ? stage3_partition_elements(g_, N_)
                           : (stage_ == 0 ? layout_.params : layout_.partition);
    i.reduce_bucket_elements = rbs_;
    i.ipg_buffers = gradient_buckets(cfg_).count;
  }

  void setup_groups() {
    Group dp{"dp", {}};
    for (int r = 0; r < N_; ++r) dp.ranks.push_back(r);
    p_.groups.push_back(dp);
    dp_group_ = 0;
    if (hpz_ > 1) {
      Group h{"hpz", {}};
      const int base = opt_.rank / static_cast<int>(hpz_) * static_cast<int>(hpz_);
      for (int r = base; r < base + hpz_ && r < N_; ++r) h.ranks.push_back(r);
      p_.groups.push_back(h);
      hpz_group_ = 1;
    }
  }

  // ------------------------------------------------------------------ replication
  // Where each of the program's lists stood at a point of the lowering.
  struct Marks {
    std::size_t events = 0, buffers = 0, allocs = 0, frees = 0, deps = 0, slices = 0;
  };
  Marks marks() const {
    return {p_.events.size(), p_.buffers.size(), p_.alloc_list.size(), p_.free_list.size(), p_.dep_list.size(),
            p_.slice_list.size()};
  }

  // A reference (event or buffer id) of the later of two compared micro-steps points either
  // into itself or the one before (relative: it moves with the micro-step) or before both
  // (fixed: the prologue's buffers, what micro-step 0 allocated for the whole step). `r1`
  // is the earlier micro-step's reference, `start1` where that micro-step begins.
  static bool same_ref(std::int64_t r1, std::int64_t r2, std::size_t start1, std::size_t delta) {
    if (r1 < 0 || r2 < 0) return r1 == r2;
    if (static_cast<std::size_t>(r2) >= start1) return static_cast<std::size_t>(r1) + delta == static_cast<std::size_t>(r2);
    return r1 == r2;
  }

  // Whether the micro-step [b, c) is the micro-step [a, b) moved by one micro-step: the
  // same events, buffers, lists and labels, every reference relative or fixed as above,
  // and every buffer the first allocates freed by the end of the second (so nothing a
  // repeated micro-step allocates outlives the next one, and what the last micro-step and
  // the step free was allocated before the compared ones or by the one before them).
  bool periodic(const Marks& a, const Marks& b, const Marks& c) const {
    const Marks d{b.events - a.events, b.buffers - a.buffers, b.allocs - a.allocs,
                  b.frees - a.frees,   b.deps - a.deps,       b.slices - a.slices};
    if (c.events - b.events != d.events || c.buffers - b.buffers != d.buffers || c.allocs - b.allocs != d.allocs ||
        c.frees - b.frees != d.frees || c.deps - b.deps != d.deps || c.slices - b.slices != d.slices)
      return false;
    for (std::size_t i = 0; i < d.events; ++i) {
      const Event& e1 = p_.events[a.events + i];
      const Event& e2 = p_.events[b.events + i];
      if (!same_ref(e1.src_buf, e2.src_buf, a.buffers, d.buffers) ||
          !same_ref(e1.src2_buf, e2.src2_buf, a.buffers, d.buffers) ||
          !same_ref(e1.dst_buf, e2.dst_buf, a.buffers, d.buffers))
        return false;
      Event t = e1;
      shift_event(t, 1, d, a, true);
      t.src_buf = e2.src_buf;
      t.src2_buf = e2.src2_buf;
      t.dst_buf = e2.dst_buf;
      if (!(t == e2)) return false;
    }
    for (std::size_t i = 0; i < d.buffers; ++i) {
      Buffer t = p_.buffers[a.buffers + i];
      t.id += static_cast<BufferId>(d.buffers);
      if (!(t == p_.buffers[b.buffers + i])) return false;
    }
    for (std::size_t i = 0; i < d.allocs; ++i)
      if (!same_ref(p_.alloc_list[a.allocs + i], p_.alloc_list[b.allocs + i], a.buffers, d.buffers)) return false;
    for (std::size_t i = 0; i < d.frees; ++i)
      if (!same_ref(p_.free_list[a.frees + i], p_.free_list[b.frees + i], a.buffers, d.buffers)) return false;
    for (std::size_t i = 0; i < d.deps; ++i)
      if (!same_ref(p_.dep_list[a.deps + i], p_.dep_list[b.deps + i], a.events, d.events)) return false;
    for (std::size_t i = 0; i < d.slices; ++i)
      if (!(p_.slice_list[a.slices + i] == p_.slice_list[b.slices + i])) return false;
    std::vector<char> freed(d.buffers, 0);
    for (std::size_t i = a.frees; i < c.frees; ++i) {
      const auto f = static_cast<std::size_t>(p_.free_list[i]);
      if (f >= a.buffers && f < b.buffers) freed[f - a.buffers] = 1;
    }
    return std::all_of(freed.begin(), freed.end(), [](char x) { return x != 0; });
  }

  // Moves an event by k micro-steps of `d` ids: its id, its list ranges, and (when it is a
  // repeated micro-step's) its micro-step; buffer references at or after `a` move too.
  static void shift_event(Event& e, std::size_t k, const Marks& d, const Marks& a, bool repeated) {
    e.id += static_cast<EventId>(k * d.events);
    if (repeated && e.micro_step >= 0) e.micro_step = static_cast<std::int16_t>(e.micro_step + k);
    e.alloc_begin += static_cast<std::uint32_t>(k * d.allocs);
    e.alloc_end += static_cast<std::uint32_t>(k * d.allocs);
    e.free_begin += static_cast<std::uint32_t>(k * d.frees);
    e.free_end += static_cast<std::uint32_t>(k * d.frees);
    e.dep_begin += static_cast<std::uint32_t>(k * d.deps);
    e.dep_end += static_cast<std::uint32_t>(k * d.deps);
    e.slice_begin += static_cast<std::uint32_t>(k * d.slices);
    e.slice_end += static_cast<std::uint32_t>(k * d.slices);
    auto buf = [&](BufferId& b) {
      if (b >= 0 && static_cast<std::size_t>(b) >= a.buffers) b += static_cast<BufferId>(k * d.buffers);
    };
    buf(e.src_buf);
    buf(e.src2_buf);
    buf(e.dst_buf);
  }

  // The program holds the micro-steps up to [b, c), which repeats [a, b), then the last
  // micro-step and the step (from c). Insert k copies of [b, c) before the last one and
  // move it and the step past them: every reference at or after a moves by k micro-steps.
  void replicate(const Marks& a, const Marks& b, const Marks& c, int copies) {
    const Marks d{b.events - a.events, b.buffers - a.buffers, b.allocs - a.allocs,
                  b.frees - a.frees,   b.deps - a.deps,       b.slices - a.slices};
    const auto k_all = static_cast<std::size_t>(copies);
    auto move_buf = [&](BufferId x, std::size_t k) {
      return x >= 0 && static_cast<std::size_t>(x) >= a.buffers ? x + static_cast<BufferId>(k * d.buffers) : x;
    };
    auto move_event = [&](EventId x, std::size_t k) {
      return x >= 0 && static_cast<std::size_t>(x) >= a.events ? x + static_cast<EventId>(k * d.events) : x;
    };
    // Each list: [0, c) kept, then the copies of [b, c), then the tail [c, end) moved; each
    // copy is appended whole, then its references are moved in place.
    auto expand = [&](auto& list, std::size_t from, std::size_t to, auto&& move) {
      using T = std::remove_reference_t<decltype(list[0])>;
      static_assert(std::is_trivially_copyable_v<T>);
      const std::vector<T> block(list.begin() + static_cast<std::ptrdiff_t>(from), list.begin() + static_cast<std::ptrdiff_t>(to));
      const std::vector<T> tail(list.begin() + static_cast<std::ptrdiff_t>(to), list.end());
      list.resize(to);
      list.reserve(to + k_all * block.size() + tail.size());
      for (std::size_t k = 1; k <= k_all; ++k) {
        const std::size_t at = list.size();
        list.insert(list.end(), block.begin(), block.end());
        for (std::size_t i = at; i < list.size(); ++i) move(list[i], k, true);
      }
      const std::size_t at = list.size();
      list.insert(list.end(), tail.begin(), tail.end());
      for (std::size_t i = at; i < list.size(); ++i) move(list[i], k_all, false);
    };
    expand(p_.events, b.events, c.events, [&](Event& e, std::size_t k, bool repeated) { shift_event(e, k, d, a, repeated); });
    expand(p_.buffers, b.buffers, c.buffers, [&](Buffer& x, std::size_t k, bool) { x.id += static_cast<BufferId>(k * d.buffers); });
    expand(p_.alloc_list, b.allocs, c.allocs, [&](BufferId& x, std::size_t k, bool) { x = move_buf(x, k); });
    expand(p_.free_list, b.frees, c.frees, [&](BufferId& x, std::size_t k, bool) { x = move_buf(x, k); });
    expand(p_.dep_list, b.deps, c.deps, [&](EventId& x, std::size_t k, bool) { x = move_event(x, k); });
    expand(p_.slice_list, b.slices, c.slices, [](BucketSlice&, std::size_t, bool) {});
  }

  // ------------------------------------------------------------------ prologue
  BufferId persistent(Category c, Placement where, BufferRole role, DType t, std::int64_t elements,
                      std::string name, std::int32_t ref = -1) {
    b_.begin(EventKind::marker, Stream::compute, Phase::init, -1, name);
    const BufferId id = b_.buffer(c, where, role, t, elements, b_.cur().label, ref);
    b_.alloc(id);
    return id;
  }

  void prologue() {
    const std::int64_t psi = layout_.params;
    const std::int64_t k_state = cfg_.optimizer.state_bytes_per_param();
    const Placement opt_where = offload_opt_ ? Placement::host : Placement::device;
    auto states = [&](std::int64_t elements, const std::string& name, std::int32_t ref) {
      if (k_state > 0)
        states_buf_ = persistent(Category::optimizer_states, opt_where,
                                 offload_opt_ ? BufferRole::host_optimizer_state : BufferRole::optimizer_state,
                                 DType::fp32, elements * k_state / 4, name, ref);
    };
    if (stage_ == 0 || bf16_opt_) {
      // BF16_Optimizer flattens its 16-bit params and fp32 gradients aligned to 2N, as ZeRO-1/2 do.
      const std::int64_t flat = bf16_opt_ ? layout_.padded : psi;
      params_buf_ = persistent(Category::params, Placement::device, BufferRole::flat_params16, md_, flat,
                 fmt::format("params{} (flat, {} elements)", dtype_name(md_), flat));
      if (!bf16_opt_ && md_ != DType::fp32) {
        // FP16_Optimizer (fp16, and bf16 without ZeRO): fp32 master copy and states, unpartitioned.
        master_buf_ = persistent(Category::master_params, Placement::device, BufferRole::master_partition, DType::fp32, psi,
                                 "master fp32 params", 0);
        states(psi, "optimizer states", 0);
      } else if (bf16_opt_) {
        // BF16_Optimizer (ZeRO-1 with fp32 accumulation): fp32 grad buffer, master and states partitioned.
        grads32_ = persistent(Category::grads, Placement::device, BufferRole::flat_grads32, DType::fp32, flat,
                              "fp32 grad accumulation buffer");
        master_buf_ = persistent(Category::master_params, Placement::device, BufferRole::master_partition, DType::fp32,
                                 layout_.partition, "master fp32 partition", 0);
        states(layout_.partition, "optimizer states (partition)", 0);
      } else {
        states(psi, "optimizer states", 0);
      }
      return;
    }
    if (stage_ == 1 || stage_ == 2) {
      const std::int64_t P = layout_.partition;
      params_buf_ = persistent(Category::params, Placement::device, BufferRole::flat_params16, md_, layout_.padded,
                               fmt::format("params{} (flat, padded to 2N: {} elements)", dtype_name(md_), layout_.padded));
      master_buf_ = persistent(Category::master_params, opt_where,
                               offload_opt_ ? BufferRole::host_master : BufferRole::master_partition, DType::fp32, P,
                               "master fp32 partition", 0);
      states(P, "optimizer states (partition)", 0);
      if (offload_opt_) {
        host_grads_ = persistent(Category::grads, Placement::host, BufferRole::host_grads32, DType::fp32, P,
                                 "host fp32 grad partition");
        persistent(Category::params, Placement::host, BufferRole::host_staging16, md_, P, "host 16-bit staging partition");
        std::int64_t largest = 0;
        for (const auto& prm : g_.params) largest = std::max(largest, prm.numel);
        persistent(Category::comm_buffers, Placement::device, BufferRole::offload_staging, md_, 2 * largest,
                   "device staging buffer (2 x largest param)");
      }
      return;
    }
    // Stage 3
    const Placement pw = offload_param_ ? Placement::host : Placement::device;
    std::int64_t persist_total = 0;
    s3_persistent_.assign(g_.params.size(), 0);
    for (const auto& prm : g_.params) {
      if (prm.numel <= cfg_.zero.stage3_param_persistence_threshold &&
          persist_total + prm.numel <= cfg_.zero.stage3_model_persistence_threshold) {
        s3_persistent_[static_cast<std::size_t>(prm.id)] = 1;
        persist_total += prm.numel;
      }
    }
    const std::int64_t part = stage3_partition_elements(g_, N_);
    params_buf_ = persistent(Category::params, pw, BufferRole::param_partition16, md_, part,
                             fmt::format("params{} partitions (sum of ceil(numel/N))", dtype_name(md_)));
    if (persist_total > 0) {
      persistent(Category::params, Placement::device, BufferRole::param_full16, md_, persist_total,
                 fmt::format("persistent params (numel <= {})", cfg_.zero.stage3_param_persistence_threshold));
      // Where each persistent param lives in the buffer (for the executor).
      std::int64_t at = 0;
      for (const auto& prm : g_.params)
        if (s3_persistent_[static_cast<std::size_t>(prm.id)]) {
          b_.slice({prm.id, 0, prm.numel, at});
          at += prm.numel;
        }
    }
    master_buf_ = persistent(Category::master_params, opt_where,
                             offload_opt_ ? BufferRole::host_master : BufferRole::master_partition, DType::fp32, part,
                             "master fp32 partition", 0);
    states(part, "optimizer states (partition)", 0);
    if (offload_opt_) {
      host_grads_ = persistent(Category::grads, Placement::host, BufferRole::host_grads32, DType::fp32, part,
                               "host fp32 grad partition");
    } else {
      s3_grad_partition_ = persistent(Category::grads, Placement::device, BufferRole::grad_partition, accum_dtype(), part,
                                      "flat gradient partition");
    }
    if (cfg_.zero.contiguous_gradients)
      s3_bucket_ = persistent(Category::comm_buffers, Placement::device, BufferRole::ipg_bucket, cd_, rbs_,
                              fmt::format("reduce bucket ({} elements)", rbs_), 0);
    build_visits();
  }

  // ------------------------------------------------------------------ micro-step
  struct MicroState {
    std::vector<BufferId> tensor_buf;     // per tensor: live buffer, -1 if none
    std::vector<BufferId> grad_buf;       // per tensor: live gradient buffer
    std::vector<BufferId> param_grad;     // per param: live autograd grad buffer
  };

  void micro_step(int m) {
    MicroState st;
    st.tensor_buf.assign(g_.tensors.size(), -1);
    st.grad_buf.assign(g_.tensors.size(), -1);
    st.param_grad.assign(g_.params.size(), -1);
    ms_ = m;
    boundary_ = m == gas() - 1;
    bucket_seq_ = 0;
    gather_seq_ = 0;
    prefetch_seq_ = 0;

    // The batch arrives (ids, labels, masks).
    b_.begin(EventKind::copy, Stream::compute, Phase::forward, m, "batch");
    b_.cur().src = Placement::host;
    b_.cur().copy_op = CopyOp::load_batch;
    for (TensorId t : g_.inputs) {
      const auto& ten = g_.tensors[static_cast<std::size_t>(t)];
      st.tensor_buf[static_cast<std::size_t>(t)] = b_.buffer(Category::activations, Placement::device, BufferRole::activation,
                                                             ten.dtype, ten.bytes.v / dtype_size(ten.dtype), op_label_tensor(t), t);
      b_.alloc(st.tensor_buf[static_cast<std::size_t>(t)]);
      b_.cur().mem_bytes += ten.bytes;
    }

    if (stage_ == 3) s3_begin_pass();
    forward(st);
    backward(st);
    reduction_epilogue();
    // Inputs go when the micro-step's references drop.
    b_.begin(EventKind::marker, Stream::compute, Phase::backward, m, "free_batch");
    for (TensorId t : g_.inputs) release_tensor(st, t);
    for (std::size_t t = 0; t < st.tensor_buf.size(); ++t)
      if (st.tensor_buf[t] >= 0) release_tensor(st, static_cast<TensorId>(t));
  }

  std::int32_t op_label(OpId o) {
    if (op_labels_.empty()) op_labels_.assign(g_.ops.size(), -1);
    auto& l = op_labels_[static_cast<std::size_t>(o)];
    if (l < 0) l = b_.add_label(g_.ops[static_cast<std::size_t>(o)].name);
    return l;
  }
  std::int32_t op_label_tensor(TensorId t) {
    if (tensor_labels_.empty()) tensor_labels_.assign(g_.tensors.size(), -1);
    auto& l = tensor_labels_[static_cast<std::size_t>(t)];
    if (l < 0) l = b_.add_label(g_.tensors[static_cast<std::size_t>(t)].name);
    return l;
  }
  std::int32_t grad_label_tensor(TensorId t) {
    if (grad_labels_.empty()) grad_labels_.assign(g_.tensors.size(), -1);
    auto& l = grad_labels_[static_cast<std::size_t>(t)];
    if (l < 0) l = b_.add_label("grad:" + g_.tensors[static_cast<std::size_t>(t)].name);
    return l;
  }
  std::int32_t param_grad_label(ParamId p) {
    if (pgrad_labels_.empty()) pgrad_labels_.assign(g_.params.size(), -1);
    auto& l = pgrad_labels_[static_cast<std::size_t>(p)];
    if (l < 0) l = b_.add_label("grad:" + pname(p));
    return l;
  }

  void release_tensor(MicroState& st, TensorId t) {
    auto& b = st.tensor_buf[static_cast<std::size_t>(t)];
    if (b >= 0) {
      b_.free(b);
      b = -1;
    }
  }

  bool in_ckpt_layer(OpId o) const { return ckpt_ && f_.layer_of_op[static_cast<std::size_t>(o)] >= 0; }

  // A tensor is kept for backward when an op saves it; under checkpointing, tensors of a
  // checkpointed layer are not kept (they are recomputed), except the layer input.
  bool kept_for_backward(TensorId t, bool recomputing) const {
    const OpId saver = f_.min_saver[static_cast<std::size_t>(t)];
    if (saver < 0) return false;
    if (!ckpt_ || recomputing) return true;
    return !in_ckpt_layer(saver);
  }

  // Forward of one op (or its recomputation): allocate outputs, free what is dead.
  void forward_op(MicroState& st, OpId o, Phase ph, bool recomputing) {
    const auto& op = g_.ops[static_cast<std::size_t>(o)];
    if (stage_ == 3) s3_before_op(o, ph);
    Event& e = b_.begin(EventKind::compute, Stream::compute, ph, ms_, op_label(o));
    last_compute_ = e.id;
    e.op = o;
    e.layer = op.layer;
    e.flops = op.fwd_flops;
    e.mem_bytes = op.fwd_bytes;
    if (stage_ == 3) s3_dep_on_fetch(o);
    for (TensorId t : op.outputs) {
      const auto& ten = g_.tensors[static_cast<std::size_t>(t)];
      const BufferId id = b_.buffer(Category::activations, Placement::device, BufferRole::activation, ten.dtype,
                                    ten.bytes.v / dtype_size(ten.dtype), op_label_tensor(t), t);
      b_.alloc(id);
      release_tensor(st, t);  // a recomputation replaces a tensor still held from before
      st.tensor_buf[static_cast<std::size_t>(t)] = id;
    }
    // Free inputs/outputs whose last forward use is this op and that nobody keeps.
    auto dead = [&](TensorId t) {
      if (f_.last_fwd_use[static_cast<std::size_t>(t)] > o) return false;
      if (t == g_.loss) return false;
      if (is_ckpt_input(t) && !recomputing) return false;
      if (recomputing) {
        // During recomputation only the layer's own tensors are rebuilt; the layer input
        // belongs to the checkpoint.
        if (is_ckpt_input(t)) return false;
        const OpId saver = f_.min_saver[static_cast<std::size_t>(t)];
        return saver < 0 || f_.layer_of_op[static_cast<std::size_t>(saver)] != recompute_layer_;
      }
      return !kept_for_backward(t, false);
    };
    for (TensorId t : op.inputs)
      if (st.tensor_buf[static_cast<std::size_t>(t)] >= 0 && dead(t)) release_tensor(st, t);
    for (TensorId t : op.outputs)
      if (st.tensor_buf[static_cast<std::size_t>(t)] >= 0 && dead(t)) release_tensor(st, t);
    // Recomputation: outputs that leave the layer are not needed again.
    if (recomputing)
      for (TensorId t : op.outputs) {
        const OpId saver = f_.min_saver[static_cast<std::size_t>(t)];
        const bool saved_here = saver >= 0 && f_.layer_of_op[static_cast<std::size_t>(saver)] == recompute_layer_;
        const bool used_here = f_.last_fwd_use[static_cast<std::size_t>(t)] <= layer_last_op(recompute_layer_);
        if (!saved_here && !used_here && st.tensor_buf[static_cast<std::size_t>(t)] >= 0) release_tensor(st, t);
      }
    if (stage_ == 3) s3_after_op(o, ph);
  }

  bool is_ckpt_input(TensorId t) const {
    return ckpt_ && t >= 0 && ckpt_input_[static_cast<std::size_t>(t)] != 0;
  }
  OpId layer_last_op(std::int32_t l) const { return g_.layers[static_cast<std::size_t>(l)].last; }

  void forward(MicroState& st) {
    for (const auto& op : g_.ops) forward_op(st, op.id, Phase::forward, false);
  }

  void backward(MicroState& st) {
    const auto nops = static_cast<OpId>(g_.ops.size());
    for (OpId o = nops - 1; o >= 0; --o) {
      const std::int32_t layer = f_.layer_of_op[static_cast<std::size_t>(o)];
      if (ckpt_ && layer >= 0 && o == layer_last_op(layer)) {
        recompute_layer_ = layer;
        const auto& span = g_.layers[static_cast<std::size_t>(layer)];
        for (OpId r = span.first; r <= span.last; ++r) forward_op(st, r, Phase::recompute, true);
      }
      backward_op(st, o);
      if (ckpt_ && layer >= 0 && o == g_.layers[static_cast<std::size_t>(layer)].first) {
        // The checkpoint drops the layer input once the layer's backward is done.
        b_.begin(EventKind::marker, Stream::compute, Phase::backward, ms_,
                 b_.cached(LabelKind::checkpoint_release, layer, [&] { return fmt::format("layer{}.checkpoint_release", layer); }));
        // Released unless an op before the layer still saves it for its own backward.
        const TensorId in = g_.layers[static_cast<std::size_t>(layer)].input;
        const OpId saver = in >= 0 ? f_.min_saver[static_cast<std::size_t>(in)] : -1;
        if (in >= 0 && (saver < 0 || saver >= g_.layers[static_cast<std::size_t>(layer)].first)) release_tensor(st, in);
        recompute_layer_ = -1;
      }
    }
  }

  void backward_op(MicroState& st, OpId o) {
    const auto& op = g_.ops[static_cast<std::size_t>(o)];
    if (stage_ == 3) s3_before_op(o, Phase::backward);
    Event& e = b_.begin(EventKind::compute, Stream::compute, Phase::backward, ms_, op_label(o));
    last_compute_ = e.id;
    e.op = o;
    e.layer = op.layer;
    e.flops = op.bwd_flops;
    e.mem_bytes = op.bwd_bytes;
    if (stage_ == 3) s3_dep_on_fetch(o);
    // Gradients of the inputs (accumulated when several consumers contribute).
    for (TensorId t : op.inputs) {
      if (!f_.requires_grad[static_cast<std::size_t>(t)]) continue;
      if (st.grad_buf[static_cast<std::size_t>(t)] < 0) {
        const auto& ten = g_.tensors[static_cast<std::size_t>(t)];
        const BufferId id = b_.buffer(Category::temporaries, Placement::device, BufferRole::activation_grad, ten.dtype,
                                      ten.bytes.v / dtype_size(ten.dtype), grad_label_tensor(t), t);
        b_.alloc(id);
        st.grad_buf[static_cast<std::size_t>(t)] = id;
      }
    }
    // Parameter gradients.
    for (ParamId p : op.params) param_grad_produced(st, p, o);
    // What this backward consumed: saved tensors whose earliest saver is this op, and the
    // gradient of outputs produced here.
    for (TensorId t : op.saved)
      if (f_.min_saver[static_cast<std::size_t>(t)] == o && (!is_ckpt_input(t) || !in_ckpt_layer(o)))
        release_tensor(st, t);
    for (TensorId t : op.outputs) {
      auto& gb = st.grad_buf[static_cast<std::size_t>(t)];
      if (gb >= 0) { b_.free(gb); gb = -1; }
      if (t == g_.loss) release_tensor(st, t);
    }
    if (stage_ == 3) s3_after_op(o, Phase::backward);
    // Gradient hooks of params whose last contribution was this op.
    for (ParamId p : f_.ready_at_op[static_cast<std::size_t>(o)]) grad_hook(st, p);
  }

  // ------------------------------------------------------------------ gradients
  void param_grad_produced(MicroState& st, ParamId p, OpId o) {
    auto& pg = st.param_grad[static_cast<std::size_t>(p)];
    const std::int64_t n = numel(p);
    if (stage_ == 0 || stage_ == 1) {
      // param.grad persists across micro-steps until the step (stage 0) or until the
      // boundary reduction copies it into the bucket (stage 1).
      if (accum_grads_.empty()) accum_grads_.assign(g_.params.size(), -1);
      auto& acc = accum_grads_[static_cast<std::size_t>(p)];
      if (bf16_opt_) {
        // BF16_Optimizer accumulates into its fp32 buffer at the hook; autograd's grad is transient.
        if (pg < 0) {
          pg = b_.buffer(Category::grads, Placement::device, BufferRole::param_grad, md_, n, param_grad_label(p), p);
          b_.alloc(pg);
        }
        return;
      }
      if (acc < 0) {
        acc = b_.buffer(Category::grads, Placement::device, BufferRole::param_grad, md_, n, param_grad_label(p), p);
        b_.alloc(acc);
      } else if (o == f_.param_first_bwd[static_cast<std::size_t>(p)]) {
        // AccumulateGrad: a fresh gradient is added into param.grad and dropped.
        const BufferId tmp = b_.buffer(Category::temporaries, Placement::device, BufferRole::param_grad, md_, n,
                                       param_grad_label(p), p);
        b_.alloc(tmp);
        b_.free(tmp);
      }
      return;
    }
    // Stages 2 and 3: the autograd gradient lives until the hook copies it into the bucket.
    if (pg < 0) {
      pg = b_.buffer(Category::grads, Placement::device, BufferRole::param_grad, md_, n, param_grad_label(p), p);
      b_.alloc(pg);
    }
  }

  void grad_hook(MicroState& st, ParamId p) {
    if (stage_ == 0 || bf16_opt_) {
      if (bf16_opt_) {
        auto& pg = st.param_grad[static_cast<std::size_t>(p)];
        Event& e = b_.begin(EventKind::copy, Stream::compute, Phase::backward, ms_, b_.cached(LabelKind::accumulate_fp32, p, [&] { return fmt::format("accumulate_fp32.{}", pname(p)); }));
        e.mem_bytes = Bytes{numel(p) * (b16() + 8)};
        e.copy_op = CopyOp::grad_accumulate;
        e.src_buf = pg;
        e.dst_buf = grads32_;
        b_.slice({p, 0, numel(p), layout_.offset[static_cast<std::size_t>(p)]});
        b_.free(pg);
        pg = -1;
      }
      return;
    }
    last_grad_event_ = b_.cur_id();  // the backward op that produced the gradient
    if (stage_ == 3) { s3_grad_hook(st, p); return; }
    if (!hooks_installed()) return;
    setup_buckets();
    const bool reduce_now = stage_ == 2 || (overlap_ && boundary_);
    if (reduce_now) ipg_add(st, p, false);
  }

  // stage_1_and_2.py setup_buckets: at the first hook of a backward, when not already set
  // up, allocate RBS elements (×2 under overlap_comm) if contiguous_gradients.
  void setup_buckets() {
    if (ipg_ready_) return;
    ipg_ready_ = true;
    const int nbuf = gradient_buckets(cfg_).count;
    if (nbuf == 0) return;
    b_.begin(EventKind::marker, Stream::compute, Phase::backward, ms_, "setup_buckets");
    for (int i = 0; i < nbuf; ++i) {
      ipg_buf_[i] = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::ipg_bucket, md_, rbs_,
                              fmt::format("ipg bucket {} ({} elements)", i, rbs_), i);
      b_.alloc(ipg_buf_[i]);
    }
    ipg_index_ = 0;
    ipg_elements_ = 0;
  }

  void release_ipg_buffers() {
    if (!ipg_ready_) return;
    for (int i = 0; i < 2; ++i)
      if (ipg_buf_[i] >= 0) {
        b_.free(ipg_buf_[i]);
        ipg_buf_[i] = -1;
      }
    ipg_ready_ = false;
  }

  // stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads.
  void ipg_add(MicroState& st, ParamId p, bool at_boundary_pass) {
    const std::int64_t n = numel(p);
    if (ipg_elements_ + n > rbs_) flush_ipg(st, Trigger::bucket_full);
    BufferId grad = take_grad(st, p);
    if (cfg_.zero.contiguous_gradients && n > rbs_) {
      // Reduced on its own from its own storage.
      ipg_params_.push_back({p, 0, n, -1});
      ipg_large_grads_.push_back(grad);
      flush_ipg(st, Trigger::param_too_large);
      return;
    }
    if (cfg_.zero.contiguous_gradients) {
      Event& e = b_.begin(EventKind::copy, Stream::compute, at_boundary_pass ? Phase::reduction : Phase::backward, ms_,
                          b_.cached(LabelKind::copy_to_bucket, p, [&] { return fmt::format("copy_to_bucket.{}", pname(p)); }));
      e.mem_bytes = Bytes{2 * n * b16()};
      e.copy_op = CopyOp::grad_to_bucket;
      e.src_buf = grad;
      e.dst_buf = ipg_buf_[ipg_index_];
      // The compute stream must not overwrite a buffer still being reduced.
      b_.dep(ipg_last_reduce_[ipg_index_]);
      b_.slice({p, 0, n, ipg_elements_});
      b_.free(grad);  // grad now views the bucket: its own storage is released
      last_copy_ = b_.cur_id();
    } else {
      ipg_loose_grads_.push_back(grad);
    }
    ipg_params_.push_back({p, 0, n, ipg_elements_});
    ipg_elements_ += n;
  }

  BufferId take_grad(MicroState& st, ParamId p) {
    BufferId g = -1;
    if (stage_ == 1) {
      g = accum_grads_[static_cast<std::size_t>(p)];
      accum_grads_[static_cast<std::size_t>(p)] = -1;
    } else {
      g = st.param_grad[static_cast<std::size_t>(p)];
      st.param_grad[static_cast<std::size_t>(p)] = -1;
    }
    return g;
  }

  // Elements of [lo, hi) of the flat buffer that land in rank r's partition.
  std::int64_t overlap_with_rank(std::int64_t lo, std::int64_t hi, int r) const {
    const std::int64_t a = std::max(lo, static_cast<std::int64_t>(r) * layout_.partition);
    const std::int64_t z = std::min(hi, static_cast<std::int64_t>(r + 1) * layout_.partition);
    return std::max<std::int64_t>(0, z - a);
  }

  // stage_1_and_2.py reduce_ipg_grads → average_tensor / allreduce_bucket.
  void flush_ipg(MicroState& st, Trigger why) {
    (void)st;
    if (ipg_params_.empty()) return;
    std::int64_t elements = 0;
    for (const auto& s : ipg_params_) elements += s.count;
    const Stream rs = red_stream();
    const Phase ph = boundary_pass_ ? Phase::reduction : Phase::backward;
    const int bucket_no = bucket_seq_++;
    // average_tensor: with use_multi_rank_bucket_allreduce the slices are flattened
    // (allreduce_bucket copies them) and all-reduced; with it false each destination's
    // slice is reduced in place; with reduce_scatter false the bucket is all-reduced in
    // place. Loose gradients (no contiguous bucket) are always flattened. A cast copy is
    // added when communication_data_type differs from the model dtype.
    const bool multi_rank_allreduce = cfg_.zero.use_multi_rank_bucket_allreduce || !cfg_.zero.reduce_scatter;
    const bool flatten = !cfg_.zero.contiguous_gradients || (cfg_.zero.reduce_scatter && cfg_.zero.use_multi_rank_bucket_allreduce);
    Event& fl = b_.begin(EventKind::copy, rs, ph, ms_, b_.cached(LabelKind::flatten, bucket_no, [&] { return fmt::format("flatten.bucket{}", bucket_no); }));
    fl.mem_bytes = Bytes{flatten ? 2 * elements * b16() : 0};
    b_.dep(last_copy_);
    b_.dep(last_grad_event_);
    BufferId flat = -1;
    if (flatten) {
      flat = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, md_, elements,
                       b_.cached(LabelKind::flatten_buf, bucket_no, [&] { return fmt::format("flatten bucket{}", bucket_no); }), bucket_no);
      b_.alloc(flat);
    }
    BufferId cast = -1;
    if (cd_ != md_) {
      cast = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, cd_, elements,
                       b_.cached(LabelKind::cast_buf, bucket_no, [&] { return fmt::format("cast bucket{} to {}", bucket_no, dtype_name(cd_)); }), bucket_no);
      b_.alloc(cast);
    }
    for (const auto& s : ipg_params_) b_.slice(s);
    // Data: the slices are packed in order into the reduced buffer: the cast copy, else the
    // flat copy, else the contiguous bucket itself, else (a lone param) its own gradient.
    const BufferId bucket_src = cfg_.zero.contiguous_gradients ? ipg_buf_[ipg_index_] : -1;
    BufferId reduced = cast >= 0 ? cast : flat >= 0 ? flat : bucket_src;
    if (!ipg_large_grads_.empty() && flat < 0 && cast < 0) reduced = ipg_large_grads_.front();
    if (flat >= 0 || cast >= 0) {
      fl.copy_op = CopyOp::flatten;
      fl.src_buf = bucket_src;
      fl.dst_buf = reduced;
    }
    EventId last = -1;
    if (multi_rank_allreduce || N_ == 1) {
      collective(rs, ph, ms_, b_.cached(LabelKind::all_reduce, bucket_no, [&] { return fmt::format("all_reduce.bucket{}", bucket_no); }), CollKind::all_reduce, ReduceOp::avg, why, dp_group_, elements, cd_, bucket_no);
      b_.cur().dst_buf = reduced;
      for (const auto& s : ipg_params_) b_.slice(s);
      last = b_.cur_id();
    } else {
      // One reduce per destination rank, carrying the part of the bucket it owns.
      for (int r = 0; r < N_; ++r) {
        std::int64_t part = 0;
        for (const auto& s : ipg_params_) {
          const std::int64_t lo = layout_.offset[static_cast<std::size_t>(s.param)] + s.param_offset;
          part += overlap_with_rank(lo, lo + s.count, r);
        }
        if (part == 0) continue;
        collective(rs, ph, ms_, b_.cached(LabelKind::reduce_to, bucket_no * 65536 + r, [&] { return fmt::format("reduce.bucket{}.to{}", bucket_no, r); }), CollKind::reduce, ReduceOp::avg, why, dp_group_, part, cd_, bucket_no);
        b_.cur().dst_buf = reduced;
        b_.cur().root = r;
        for (const auto& s : ipg_params_) b_.slice(s);
        last = b_.cur_id();
      }
    }
    // Copy this rank's slices into grads_in_partition (allocated at the first reduction).
    Event& cp = b_.begin(EventKind::copy, rs, ph, ms_, b_.cached(LabelKind::copy_to_partition, bucket_no, [&] { return fmt::format("copy_to_partition.bucket{}", bucket_no); }));
    b_.dep(last);
    std::int64_t mine = 0;
    for (const auto& s : ipg_params_) {
      const std::int64_t lo = layout_.offset[static_cast<std::size_t>(s.param)] + s.param_offset;
      mine += overlap_with_rank(lo, lo + s.count, opt_.rank);
    }
    cp.mem_bytes = Bytes{2 * mine * b16()};
    cp.copy_op = CopyOp::to_partition;
    cp.src_buf = reduced;
    for (const auto& s : ipg_params_) b_.slice(s);
    if (offload_opt_) {
      cp.dst = Placement::host;
      cp.mem_bytes = Bytes{mine * b16()};  // bytes crossing PCIe, one direction
      cp.dst_buf = host_grads_;            // accumulated there in fp32, by partition position
    } else if (grads_in_partition_ < 0) {
      grads_in_partition_ = b_.buffer(Category::grads, Placement::device, BufferRole::grads_in_partition, accum_dtype(),
                                      grads_in_partition_elements(g_, layout_, opt_.rank),
                                      "grads_in_partition (params overlapping this rank's partition)");
      b_.alloc(grads_in_partition_);
    }
    if (!offload_opt_) p_.events.back().dst_buf = grads_in_partition_;
    if (flat >= 0) b_.free(flat);
    if (cast >= 0) b_.free(cast);
    for (BufferId gbuf : ipg_loose_grads_) b_.free(gbuf);
    for (BufferId gbuf : ipg_large_grads_) b_.free(gbuf);
    ipg_loose_grads_.clear();
    ipg_large_grads_.clear();
    ipg_last_reduce_[ipg_index_] = b_.cur_id();
    last_reduce_ = b_.cur_id();
    ipg_params_.clear();
    ipg_elements_ = 0;
    if (overlap_) ipg_index_ = 1 - ipg_index_;
  }

  // End of backward: stage 2 flushes every micro-step; stage 1 reduces at the boundary.
  void reduction_epilogue() {
    if (stage_ == 0 || bf16_opt_) {
      if (boundary_) stage0_allreduce();
      return;
    }
    if (stage_ == 3) {
      s3_flush(Trigger::end_of_backward);
      s3_end_pass();
      return;
    }
    MicroState dummy;
    if (stage_ == 2 || (overlap_ && boundary_)) {
      flush_ipg(dummy, Trigger::end_of_backward);
      b_.begin(EventKind::marker, red_stream(), Phase::backward, ms_, "ipg_epilogue");
      b_.dep(last_reduce_);
      release_ipg_buffers();
      if (stage_ == 2 && !boundary_ && grads_in_partition_ >= 0) {
        // independent_gradient_partition_epilogue: all_grad_tensors keeps (micro-step 0) or
        // is accumulated from (later ones) this micro-step's grads_in_partition, which the
        // epilogue then drops; the next micro-step's first reduction allocates a new one.
        if (accumulated_partition_ < 0) {
          accumulated_partition_ = grads_in_partition_;
        } else {
          b_.begin(EventKind::copy, red_stream(), Phase::backward, ms_, "accumulate_grads_in_partition");
          b_.cur().mem_bytes = Bytes{3 * p_.buffers[static_cast<std::size_t>(grads_in_partition_)].bytes.v};
          b_.cur().copy_op = CopyOp::accumulate;
          b_.cur().src_buf = grads_in_partition_;
          b_.cur().dst_buf = accumulated_partition_;
          b_.free(grads_in_partition_);
        }
        grads_in_partition_ = -1;
      }
      return;
    }
    if (stage_ == 1 && boundary_) {
      // engine.allreduce_gradients → reduce_gradients: every param, registration order.
      boundary_pass_ = true;
      if (hooks_installed()) setup_buckets();
      for (const auto& prm : g_.params) {
        if (accum_grads_.empty() || accum_grads_[static_cast<std::size_t>(prm.id)] < 0) continue;
        ipg_add(dummy, prm.id, true);
      }
      flush_ipg(dummy, Trigger::gas_boundary);
      b_.begin(EventKind::marker, red_stream(), Phase::reduction, ms_, "ipg_epilogue");
      b_.dep(last_reduce_);
      release_ipg_buffers();
      boundary_pass_ = false;
    }
  }

  // engine.buffered_allreduce_fallback: buckets of <= 5e8 elements, flattened, all-reduced
  // on the compute stream, copied back.
  void stage0_allreduce() {
    constexpr std::int64_t kBucket = 500000000;  // engine.py MEMORY_OPT_ALLREDUCE_SIZE
    const DType gd = bf16_opt_ ? DType::fp32 : md_;
    std::vector<ParamId> cur;
    std::int64_t cur_n = 0;
    int bucket_no = 0;
    auto flush = [&]() {
      if (cur.empty()) return;
      const int bn = bucket_no++;
      Event& fl = b_.begin(EventKind::copy, Stream::compute, Phase::reduction, ms_, fmt::format("flatten.bucket{}", bn));
      fl.mem_bytes = Bytes{2 * cur_n * dtype_size(gd)};
      const BufferId flat = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, gd, cur_n,
                                      fmt::format("flatten bucket{}", bn), bn);
      b_.alloc(flat);
      fl.copy_op = CopyOp::flatten;
      fl.dst_buf = flat;
      // BF16_Optimizer's gradients are its fp32 buffer's (get_grads_for_reduction), by flat offset.
      auto grad_at = [&](ParamId p) { return bf16_opt_ ? layout_.offset[static_cast<std::size_t>(p)] : std::int64_t{-1}; };
      fl.src_buf = bf16_opt_ ? grads32_ : -1;
      for (ParamId p : cur) b_.slice({p, 0, numel(p), grad_at(p)});
      collective(Stream::compute, Phase::reduction, ms_, b_.label(fmt::format("all_reduce.bucket{}", bn)), CollKind::all_reduce, ReduceOp::avg, Trigger::gas_boundary, dp_group_, cur_n, cfg_.communication_data_type_override.value_or(gd), bn);
      b_.cur().dst_buf = flat;
      for (ParamId p : cur) b_.slice({p, 0, numel(p), -1});
      Event& back = b_.begin(EventKind::copy, Stream::compute, Phase::reduction, ms_, fmt::format("unflatten.bucket{}", bn));
      back.mem_bytes = Bytes{2 * cur_n * dtype_size(gd)};
      back.copy_op = CopyOp::unflatten_grads;
      back.src_buf = flat;
      back.dst_buf = bf16_opt_ ? grads32_ : -1;
      for (ParamId p : cur) b_.slice({p, 0, numel(p), grad_at(p)});
      b_.free(flat);
      cur.clear();
      cur_n = 0;
    };
    for (const auto& prm : g_.params) {
      if (cur_n + prm.numel > kBucket) flush();
      cur.push_back(prm.id);
      cur_n += prm.numel;
    }
    flush();
  }

  // ------------------------------------------------------------------ step
  void scalar_allreduce(Trigger t, ReduceOp op, const char* name) {
    collective(Stream::compute, Phase::step, -1, b_.label(name), CollKind::all_reduce, op, t, dp_group_, 1, DType::fp32, -1);
  }

  // Data: dst (master or the params) -= update(src grads, src2 states) over
  // [offset, offset + elements); src -1: each param's own gradient (stage 0, fp32).
  // The updated master range [offset, offset + n) copied (cast) into the 16-bit params
  // (through the host staging buffer when the optimizer is offloaded).
  void params_from_master(Event& e, std::int64_t offset, std::int64_t n) {
    e.copy_op = CopyOp::master_to_params;
    e.src_buf = master_buf_;
    e.dst_buf = params_buf_;
    e.offset = offset;
    e.elements = n;
  }

  void optimizer_event(std::int64_t elements, Placement where, const std::string& name, BufferId dst = -1,
                       BufferId grads = -1, std::int64_t offset = 0) {
    Event& e = b_.begin(EventKind::optimizer, where == Placement::host ? Stream::host : Stream::compute, Phase::step, -1, name);
    e.dst_buf = dst;
    e.src_buf = grads;
    e.src2_buf = states_buf_;
    e.offset = offset;
    e.elements = elements;
    const std::int64_t k = cfg_.optimizer.state_bytes_per_param();
    // Adam: ~12 FLOPs per element; reads/writes master, grad and states.
    e.flops = Flops{12.0 * static_cast<double>(elements)};
    e.mem_bytes = Bytes{elements * (2 * 4 + 4 + 2 * k)};
    e.src = e.dst = where;
    b_.dep(last_reduce_);
  }

  void step() {
    if (stage_ == 0 || bf16_opt_) { step_stage0(); return; }
    if (stage_ == 3) { step_stage3(); return; }
    const std::int64_t P = layout_.partition;
    if (md_ == DType::fp16) scalar_allreduce(Trigger::overflow_check, ReduceOp::max, "overflow_check");
    scalar_allreduce(Trigger::grad_norm, ReduceOp::sum, "grad_norm");
    if (offload_opt_) {
      Event& d2h = b_.begin(EventKind::copy, Stream::host, Phase::step, -1, "grads_to_host");
      d2h.src = Placement::device;
      d2h.dst = Placement::host;
      d2h.mem_bytes = Bytes{P * 4};
      if (grads_in_partition_ >= 0) { b_.free(grads_in_partition_); grads_in_partition_ = -1; }
      if (accumulated_partition_ >= 0) { b_.free(accumulated_partition_); accumulated_partition_ = -1; }
      optimizer_event(P, Placement::host, "optimizer.cpu", master_buf_, host_grads_);
      Event& h2d = b_.begin(EventKind::copy, Stream::host, Phase::step, -1, "params_to_device");
      h2d.src = Placement::host;
      h2d.dst = Placement::device;
      h2d.mem_bytes = Bytes{P * b16()};
      params_from_master(h2d, 0, P);
    } else {
      // Flatten the partition's grads (accumulation dtype) and cast to fp32: transient.
      // The cast is no copy when they are fp32 already.
      const DType gd = accum_dtype();
      Event& fl = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "flatten_partition_grads");
      fl.mem_bytes = Bytes{2 * P * dtype_size(gd)};
      fl.copy_op = CopyOp::partition_grads;
      fl.src_buf = grads_in_partition_;
      fl.src2_buf = accumulated_partition_;
      BufferId flat16 = -1;
      if (gd != DType::fp32) {
        flat16 = b_.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, gd, P,
                           fmt::format("flat partition grads ({})", dtype_name(gd)));
        b_.alloc(flat16);
        p_.events.back().dst_buf = flat16;
        Event& cast = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "cast_partition_grads_fp32");
        cast.mem_bytes = Bytes{P * (dtype_size(gd) + 4)};
        cast.copy_op = CopyOp::cast;
        cast.src_buf = flat16;
      }
      const BufferId flat32 = b_.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32, P,
                                        "flat partition grads (fp32)");
      b_.alloc(flat32);
      p_.events.back().dst_buf = flat32;
      if (flat16 >= 0) b_.free(flat16);
      if (grads_in_partition_ >= 0) { b_.free(grads_in_partition_); grads_in_partition_ = -1; }
      if (accumulated_partition_ >= 0) { b_.free(accumulated_partition_); accumulated_partition_ = -1; }
      optimizer_event(P, Placement::device, "optimizer", master_buf_, flat32);
      b_.free(flat32);
      Event& cp = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
      cp.mem_bytes = Bytes{P * (4 + b16())};
      params_from_master(cp, 0, P);
    }
    post_step_allgather(P);
  }

  // runtime/utils.py all_gather_dp_groups: one all_gather_into_tensor of the flat 16-bit
  // buffer per param group (allgather_bucket_size is not used by it); nothing when N = 1.
  void post_step_allgather(std::int64_t P) {
    if (N_ <= 1) return;
    collective(Stream::compute, Phase::post_step, -1, b_.label("all_gather.params"), CollKind::all_gather,
               ReduceOp::none, Trigger::post_step, dp_group_, P * N_, md_, 0);
    b_.cur().dst_buf = params_buf_;
  }

  void step_stage0() {
    const std::int64_t psi = layout_.params;
    if (!bf16_opt_ && md_ != DType::fp32) {
      // FP16_Optimizer (fused_optimizer.py step): a list of per-param fp32 copies of the
      // grads (4Ψ), flattened into one fp32 buffer (4Ψ more), the list dropped; step;
      // copy back to the 16-bit params; zero_grad.
      Event& cast = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "grads_to_fp32");
      cast.mem_bytes = Bytes{psi * (b16() + 4)};
      const BufferId list32 = b_.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, DType::fp32,
                                        psi, "per-param fp32 grads");
      b_.alloc(list32);
      cast.copy_op = CopyOp::flatten;
      cast.dst_buf = list32;
      for (const auto& prm : g_.params) b_.slice({prm.id, 0, prm.numel, -1});
      Event& fl = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "flatten_grads_fp32");
      fl.mem_bytes = Bytes{psi * 8};
      const BufferId flat32 = b_.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32,
                                        psi, "flat grads (fp32)");
      b_.alloc(flat32);
      fl.copy_op = CopyOp::cast;
      fl.src_buf = list32;
      fl.dst_buf = flat32;
      b_.free(list32);
      optimizer_event(psi, Placement::device, "optimizer", master_buf_, flat32);
      b_.free(flat32);
      Event& cp = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
      cp.mem_bytes = Bytes{psi * (4 + b16())};
      params_from_master(cp, 0, psi);
    } else if (bf16_opt_) {
      // bf16_optimizer.py step: the norm of the (all-reduced, full) fp32 gradients, the
      // update of this rank's fp32 partition, update_lp_params (the partition cast into the
      // flat 16-bit params, then all-gathered), clear_hp_grads.
      const std::int64_t P = layout_.partition;
      optimizer_event(P, Placement::device, "optimizer", master_buf_, grads32_);
      Event& cp = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
      cp.mem_bytes = Bytes{P * (4 + b16())};
      params_from_master(cp, 0, P);
      post_step_allgather(P);
    } else {
      optimizer_event(psi, Placement::device, "optimizer", params_buf_, -1);
    }
    b_.begin(EventKind::marker, Stream::compute, Phase::step, -1, "zero_grad");
    if (!accum_grads_.empty())
      for (auto& gbuf : accum_grads_)
        if (gbuf >= 0) { b_.free(gbuf); gbuf = -1; }
  }

  // ------------------------------------------------------------------ ZeRO-3
  void build_visits() {
    visits_fwd_.clear();
    OpId o = 0;
    const auto nops = static_cast<OpId>(g_.ops.size());
    while (o < nops) {
      const auto& op = g_.ops[static_cast<std::size_t>(o)];
      if (op.params.empty()) { ++o; continue; }
      Visit v;
      v.first = o;
      const models::ModuleId mod = op.module;
      OpId e = o;
      while (e < nops && g_.ops[static_cast<std::size_t>(e)].module == mod && !g_.ops[static_cast<std::size_t>(e)].params.empty())
        ++e;
      v.last = e - 1;
      for (OpId k = v.first; k <= v.last; ++k)
        for (ParamId p : g_.ops[static_cast<std::size_t>(k)].params)
          if (std::find(v.params.begin(), v.params.end(), p) == v.params.end()) v.params.push_back(p);
      for (ParamId p : v.params) v.numel += numel(p);
      visits_fwd_.push_back(std::move(v));
      o = e;
    }
    visit_of_first_op_.assign(g_.ops.size(), -1);
    visit_of_last_op_.assign(g_.ops.size(), -1);
    for (std::size_t i = 0; i < visits_fwd_.size(); ++i) {
      visit_of_first_op_[static_cast<std::size_t>(visits_fwd_[i].first)] = static_cast<std::int32_t>(i);
      visit_of_last_op_[static_cast<std::size_t>(visits_fwd_[i].last)] = static_cast<std::int32_t>(i);
    }
    // The module trace of one micro-step: forward visits, then backward in reverse, with
    // each checkpointed layer's visits recomputed before its backward.
    trace_.clear();
    for (std::size_t i = 0; i < visits_fwd_.size(); ++i) trace_.push_back({static_cast<std::int32_t>(i), Phase::forward});
    std::int32_t done_layer = -1;
    for (auto i = static_cast<std::int32_t>(visits_fwd_.size()) - 1; i >= 0; --i) {
      const std::int32_t layer = f_.layer_of_op[static_cast<std::size_t>(visits_fwd_[static_cast<std::size_t>(i)].first)];
      if (ckpt_ && layer >= 0 && layer != done_layer) {
        done_layer = layer;
        for (std::size_t k = 0; k < visits_fwd_.size(); ++k)
          if (f_.layer_of_op[static_cast<std::size_t>(visits_fwd_[k].first)] == layer)
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
      const auto& v = visits_fwd_[static_cast<std::size_t>(trace_[t].visit)];
      for (ParamId p : v.params) param_trace_.push_back({static_cast<std::int32_t>(t), p});
      trace_prefix_[t + 1] = trace_prefix_[t] + v.numel;
    }
    trace_param_begin_[trace_.size()] = param_trace_.size();
    next_use_.assign(param_trace_.size(), std::numeric_limits<std::int32_t>::max());
    std::vector<std::int32_t> seen(g_.params.size(), std::numeric_limits<std::int32_t>::max());
    for (std::size_t k = param_trace_.size(); k-- > 0;) {
      next_use_[k] = seen[static_cast<std::size_t>(param_trace_[k].param)];
      seen[static_cast<std::size_t>(param_trace_[k].param)] = param_trace_[k].step;
    }
  }

  struct TraceStep { std::int32_t visit; Phase phase; };
  struct ParamUse { std::int32_t step; ParamId param; };

  std::string module_name(const Visit& v) const {
    const auto m = g_.ops[static_cast<std::size_t>(v.first)].module;
    return m >= 0 ? g_.modules[static_cast<std::size_t>(m)].name : g_.ops[static_cast<std::size_t>(v.first)].name;
  }

  void s3_begin_pass() {
    trace_pos_ = 0;
    param_q_ = 0;
    s3_fetched_for_.assign(g_.params.size(), -1);
    if (s3_full_.empty()) s3_full_.assign(g_.params.size(), -1);
    if (s3_inflight_from_.empty()) s3_inflight_from_.assign(g_.params.size(), -1);
  }

  bool s3_available(ParamId p) const {
    return s3_persistent_[static_cast<std::size_t>(p)] || s3_full_[static_cast<std::size_t>(p)] >= 0;
  }

  // Gather `params` (not available) into full tensors: a flat buffer of N × partition,
  // the collective, a per-param copy out, the flat buffer freed.
  // `key` identifies the gather within a micro-step (visit index, or prefetch sequence
  // offset by the number of visits) so labels are formatted once.
  template <class What>
  EventId s3_gather(const std::vector<ParamId>& params, Trigger why, Phase ph, std::int64_t key, What&& what) {
    if (params.empty()) return -1;
    const bool within_hpz = hpz_ > 1 && ph != Phase::forward;
    const std::int64_t group_n = within_hpz ? hpz_ : N_;
    std::int64_t gathered = 0, full = 0;
    for (ParamId p : params) {
      gathered += group_n * ceil_div(numel(p), group_n);
      full += numel(p);
    }
    const Stream s = overlap_ ? Stream::allgather : Stream::compute;
    if (offload_param_) {
      Event& h2d = b_.begin(EventKind::copy, s, ph, ms_, b_.cached(LabelKind::gather_h2d, key, [&] { return fmt::format("h2d.{}", what()); }));
      h2d.src = Placement::host;
      h2d.mem_bytes = Bytes{gathered / group_n * b16()};
    }
    const int seq = gather_seq_++;
    // The hook that issues this gather runs when the host reaches the module, so the gather
    // cannot start before the compute issued ahead of it is under way; tie it to the end of
    // the op before (an upper bound on how far ahead prefetching runs).
    collective(s, ph, ms_, b_.cached(LabelKind::gather, key, [&] { return fmt::format("all_gather.{}", what()); }), CollKind::all_gather, ReduceOp::none, why, within_hpz ? hpz_group_ : dp_group_, gathered, md_, seq);
    b_.dep(last_compute_);
    const BufferId flat = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::gather_flat, md_, gathered,
                                    b_.cached(LabelKind::gather_buf, key, [&] { return fmt::format("all-gather flat buffer {}", what()); }), seq);
    b_.alloc(flat);
    // Within the hpZ group each rank contributes its secondary partition of every param
    // (src_buf names the first; the others follow the slices), else its primary partition.
    BufferId src = params_buf_;
    if (within_hpz && !params.empty() && !s3_hpz_.empty() && s3_hpz_[static_cast<std::size_t>(params.front())] >= 0)
      src = s3_hpz_[static_cast<std::size_t>(params.front())];
    b_.cur().src_buf = src;
    b_.cur().dst_buf = flat;
    for (ParamId p : params) b_.slice({p, 0, numel(p), -1});
    Event& cp = b_.begin(EventKind::copy, s, ph, ms_, b_.cached(LabelKind::gather_copy, key, [&] { return fmt::format("unflatten.{}", what()); }));
    cp.mem_bytes = Bytes{2 * full * b16()};
    cp.copy_op = CopyOp::gather_unflatten;
    cp.group = within_hpz ? hpz_group_ : dp_group_;  // whose blocks the flat buffer holds
    cp.src_buf = flat;
    for (ParamId p : params) b_.slice({p, 0, numel(p), -1});
    for (ParamId p : params) {
      if (s3_full_label_.empty()) s3_full_label_.assign(g_.params.size(), -1);
      auto& lbl = s3_full_label_[static_cast<std::size_t>(p)];
      if (lbl < 0) lbl = b_.add_label("full " + pname(p));
      const BufferId id = b_.buffer(Category::params, Placement::device, BufferRole::param_full16, md_, numel(p), lbl, p);
      b_.alloc(id);
      s3_full_[static_cast<std::size_t>(p)] = id;
      s3_live_ += numel(p);
    }
    b_.free(flat);
    // hpZ: the forward gather also leaves a secondary partition for the backward.
    if (hpz_ > 1 && ph == Phase::forward) {
      if (s3_hpz_.empty()) s3_hpz_.assign(g_.params.size(), -1);
      for (ParamId p : params) {
        auto& h = s3_hpz_[static_cast<std::size_t>(p)];
        if (h >= 0) continue;
        h = b_.buffer(Category::params, Placement::device, BufferRole::hpz_partition16, md_, ceil_div(numel(p), hpz_),
                      "hpz secondary " + pname(p), p);
        b_.alloc(h);
      }
    }
    const EventId done = b_.cur_id();
    for (ParamId p : params) s3_inflight_from_[static_cast<std::size_t>(p)] = done;
    return done;
  }

  void s3_before_op(OpId o, Phase ph) {
    const std::int32_t vi = ph == Phase::backward ? visit_of_last_op_[static_cast<std::size_t>(o)]
                                                  : visit_of_first_op_[static_cast<std::size_t>(o)];
    if (vi < 0) return;
    // Advance the trace to this visit.
    while (trace_pos_ < trace_.size() &&
           !(trace_[trace_pos_].visit == vi && trace_[trace_pos_].phase == ph))
      ++trace_pos_;
    if (trace_pos_ >= trace_.size()) return;
    const auto& v = visits_fwd_[static_cast<std::size_t>(vi)];
    std::vector<ParamId> need;
    for (ParamId p : v.params)
      if (!s3_available(p)) need.push_back(p);
    const std::int64_t vkey = static_cast<std::int64_t>(vi) * 4 + static_cast<std::int64_t>(ph);
    s3_gather(need, Trigger::module_fetch, ph, vkey, [&] { return module_name(v); });
    // Prefetch along the recorded trace (partitioned_param_coordinator.fetch_sub_module).
    while (param_q_ < param_trace_.size() && param_trace_[param_q_].step <= static_cast<std::int32_t>(trace_pos_)) ++param_q_;
    const std::int64_t budget = std::min(cfg_.zero.stage3_prefetch_bucket_size,
                                         cfg_.zero.stage3_max_live_parameters - s3_live_);
    std::vector<ParamId> pre;
    std::int64_t pre_numel = 0;
    while (param_q_ < param_trace_.size() && pre_numel < budget) {
      const ParamId p = param_trace_[param_q_].param;
      // Every use the prefetcher passes marks the param as fetched for that step, so the
      // release after its current use keeps it (partitioned_param_coordinator's guard).
      auto& ff = s3_fetched_for_[static_cast<std::size_t>(p)];
      ff = std::max(ff, param_trace_[param_q_].step);
      ++param_q_;
      if (s3_available(p) || std::find(pre.begin(), pre.end(), p) != pre.end()) continue;
      pre.push_back(p);
      pre_numel += numel(p);
    }
    const int pseq = prefetch_seq_++;
    s3_gather(pre, Trigger::prefetch, ph, (static_cast<std::int64_t>(visits_fwd_.size()) + pseq) * 4,
              [&] { return fmt::format("prefetch{}", pseq); });
  }

  void s3_dep_on_fetch(OpId o) {
    for (ParamId p : g_.ops[static_cast<std::size_t>(o)].params) {
      const EventId d = s3_inflight_from_[static_cast<std::size_t>(p)];
      if (d >= 0) b_.dep(d);
    }
  }

  void s3_after_op(OpId o, Phase ph) {
    const std::int32_t vi = ph == Phase::backward ? visit_of_first_op_[static_cast<std::size_t>(o)]
                                                  : visit_of_last_op_[static_cast<std::size_t>(o)];
    if (vi < 0 || trace_pos_ >= trace_.size()) return;
    // Release (partitioned_param_coordinator.__params_to_release): not persistent, and not
    // used again within max_reuse_distance elements of the trace.
    const auto& v = visits_fwd_[static_cast<std::size_t>(vi)];
    // Modules after this one are scanned while the numel traversed before them is below
    // max_reuse_distance; a param seen in that window stays gathered.
    const std::size_t t = trace_pos_;
    const std::int64_t limit = trace_prefix_[t + 1] + cfg_.zero.stage3_max_reuse_distance;
    const auto window_end = static_cast<std::int32_t>(
        std::lower_bound(trace_prefix_.begin() + static_cast<std::ptrdiff_t>(t + 1),
                         trace_prefix_.begin() + static_cast<std::ptrdiff_t>(trace_.size()), limit) -
        trace_prefix_.begin());
    std::vector<ParamId> rel;
    for (std::size_t k = trace_param_begin_[t]; k < trace_param_begin_[t + 1]; ++k) {
      const ParamId p = param_trace_[k].param;
      if (s3_persistent_[static_cast<std::size_t>(p)] || s3_full_[static_cast<std::size_t>(p)] < 0) continue;
      if (next_use_[k] < window_end) continue;
      if (s3_fetched_for_[static_cast<std::size_t>(p)] > static_cast<std::int32_t>(t)) continue;
      rel.push_back(p);
    }
    if (rel.empty()) return;
    b_.begin(EventKind::marker, Stream::compute, ph, ms_,
             b_.cached(LabelKind::release, vi * 4 + static_cast<std::int64_t>(ph), [&] { return "release." + module_name(v); }));
    for (ParamId p : rel) {
      b_.free(s3_full_[static_cast<std::size_t>(p)]);
      s3_full_[static_cast<std::size_t>(p)] = -1;
      s3_inflight_from_[static_cast<std::size_t>(p)] = -1;
      s3_live_ -= numel(p);
    }
  }

  void s3_end_pass() {
    // Anything still gathered at the end of the pass is released (the trace ends here).
    bool any = false;
    for (std::size_t p = 0; p < s3_full_.size(); ++p)
      if (s3_full_[p] >= 0 && !s3_persistent_[p]) {
        if (!any) b_.begin(EventKind::marker, Stream::compute, Phase::backward, ms_, "release.end_of_backward");
        any = true;
        b_.free(s3_full_[p]);
        s3_full_[p] = -1;
        s3_inflight_from_[p] = -1;
        s3_live_ -= g_.params[p].numel;
      }
  }

  // stage3.py: the gradient is copied into the persistent reduce bucket; a bucket that
  // cannot take the next gradient is reduce-scattered first.
  void s3_grad_hook(MicroState& st, ParamId p) {
    const std::int64_t n = numel(p);
    if (s3_elements_ + n > rbs_ && s3_elements_ > 0) s3_flush(Trigger::bucket_full);
    const BufferId grad = st.param_grad[static_cast<std::size_t>(p)];
    st.param_grad[static_cast<std::size_t>(p)] = -1;
    if (cfg_.zero.contiguous_gradients && s3_elements_ + n <= rbs_) {
      Event& e = b_.begin(EventKind::copy, Stream::compute, Phase::backward, ms_, b_.cached(LabelKind::copy_to_bucket, p, [&] { return fmt::format("copy_to_bucket.{}", pname(p)); }));
      e.mem_bytes = Bytes{2 * n * b16()};
      e.copy_op = CopyOp::grad_to_bucket;
      e.src_buf = grad;
      e.dst_buf = s3_bucket_;
      b_.dep(s3_last_reduce_);
      b_.slice({p, 0, n, s3_elements_});
      b_.free(grad);
      last_copy_ = b_.cur_id();
    } else {
      s3_loose_.push_back(grad);
    }
    s3_params_.push_back({p, 0, n, s3_elements_});
    s3_elements_ += n;
  }

  void s3_flush(Trigger why) {
    if (s3_params_.empty()) return;
    const Stream rs = red_stream();
    const int bn = bucket_seq_++;
    std::int64_t padded = 0, out = 0;
    for (const auto& s : s3_params_) {
      padded += N_ * ceil_div(s.count, N_);
      out += ceil_div(s.count, N_);
    }
    // stage3.py __reduce_and_partition_ipg_grads: the bucket is interleaved per
    // destination rank into one buffer (reduce_scatter_coalesced), reduce-scattered, and
    // this rank's output — a view of that buffer — accumulated into the gradient
    // partition; only with reduce_scatter false and contiguous_gradients is the contiguous
    // bucket all-reduced in place instead (__avg_scatter_contiguous_grads), and this
    // rank's chunk of each param taken from it.
    Event& il = b_.begin(EventKind::copy, rs, Phase::backward, ms_, b_.cached(LabelKind::interleave, bn, [&] { return fmt::format("interleave.bucket{}", bn); }));
    b_.dep(last_copy_);
    b_.dep(last_grad_event_);
    BufferId inter = -1;
    const BufferId bucket_src = cfg_.zero.contiguous_gradients ? s3_bucket_ : -1;
    BufferId reduced = bucket_src;
    // (a param larger than the bucket stays outside it, and then the bucket is not used)
    if (cfg_.zero.reduce_scatter || !cfg_.zero.contiguous_gradients || !s3_loose_.empty()) {
      il.mem_bytes = Bytes{2 * padded * dtype_size(cd_)};
      inter = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, cd_, padded,
                        b_.cached(LabelKind::rs_in, bn, [&] { return fmt::format("reduce-scatter input bucket{}", bn); }), bn);
      b_.alloc(inter);
      il.copy_op = CopyOp::interleave;
      il.src_buf = bucket_src;
      il.dst_buf = inter;
      for (const auto& s : s3_params_) b_.slice(s);
      reduced = inter;
      collective(rs, Phase::backward, ms_, b_.cached(LabelKind::reduce_scatter, bn, [&] { return fmt::format("reduce_scatter.bucket{}", bn); }), CollKind::reduce_scatter, ReduceOp::avg, why, dp_group_, padded, cd_, bn);
    } else {
      std::int64_t elements = 0;
      for (const auto& sl : s3_params_) elements += sl.count;
      collective(rs, Phase::backward, ms_, b_.cached(LabelKind::all_reduce, bn, [&] { return fmt::format("all_reduce.bucket{}", bn); }), CollKind::all_reduce, ReduceOp::avg, why, dp_group_, elements, cd_, bn);
    }
    b_.cur().dst_buf = reduced;
    for (const auto& s : s3_params_) b_.slice(s);
    Event& acc = b_.begin(EventKind::copy, rs, Phase::backward, ms_, b_.cached(LabelKind::accumulate_partition, bn, [&] { return fmt::format("accumulate_partition.bucket{}", bn); }));
    acc.mem_bytes = Bytes{3 * out * dtype_size(cd_)};
    acc.copy_op = CopyOp::shard_accumulate;
    acc.src_buf = reduced;
    acc.dst_buf = offload_opt_ ? host_grads_ : s3_grad_partition_;
    for (const auto& s : s3_params_) b_.slice(s);
    if (offload_opt_) acc.dst = Placement::host;
    if (inter >= 0) b_.free(inter);
    for (BufferId gbuf : s3_loose_) b_.free(gbuf);
    s3_loose_.clear();
    s3_last_reduce_ = b_.cur_id();
    last_reduce_ = s3_last_reduce_;
    s3_params_.clear();
    s3_elements_ = 0;
  }

  void step_stage3() {
    if (md_ == DType::fp16) scalar_allreduce(Trigger::overflow_check, ReduceOp::max, "overflow_check");
    scalar_allreduce(Trigger::grad_norm, ReduceOp::sum, "grad_norm");
    // hpZ secondary copies live from forward to the step.
    if (!s3_hpz_.empty()) {
      b_.begin(EventKind::marker, Stream::compute, Phase::step, -1, "release_hpz_secondary");
      for (auto& h : s3_hpz_)
        if (h >= 0) { b_.free(h); h = -1; }
    }
    // stage3.py _create_fp16_sub_groups: whole params packed in order while the group
    // stays within sub_group_size elements (a larger param is a group of its own).
    std::vector<std::int64_t> sizes;
    {
      std::int64_t cur = 0;
      for (const auto& prm : g_.params) {
        const std::int64_t n = ceil_div(prm.numel, N_);
        if (cur > 0 && cur + n > cfg_.zero.sub_group_size) {
          sizes.push_back(cur);
          cur = 0;
        }
        cur += n;
      }
      if (cur > 0) sizes.push_back(cur);
    }
    const auto groups = static_cast<std::int64_t>(sizes.size());
    std::int64_t group_start = 0;
    for (std::int64_t gi = 0; gi < groups; ++gi) {
      const std::int64_t n = sizes[static_cast<std::size_t>(gi)];
      if (offload_opt_) {
        optimizer_event(n, Placement::host, fmt::format("optimizer.cpu.subgroup{}", gi), master_buf_, host_grads_,
                        group_start);
        Event& h2d = b_.begin(EventKind::copy, Stream::host, Phase::step, -1, fmt::format("params_to_device.subgroup{}", gi));
        h2d.src = Placement::host;
        h2d.dst = offload_param_ ? Placement::host : Placement::device;
        h2d.mem_bytes = Bytes{n * b16()};
        params_from_master(h2d, group_start, n);
        group_start += n;
        continue;
      }
      Event& fl = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, fmt::format("flatten_grads.subgroup{}", gi));
      fl.mem_bytes = Bytes{2 * n * b16()};
      const BufferId f16 = b_.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, md_, n,
                                     fmt::format("sub-group {} grads ({})", gi, dtype_name(md_)), static_cast<std::int32_t>(gi));
      b_.alloc(f16);
      fl.copy_op = CopyOp::subgroup_grads;
      fl.src_buf = s3_grad_partition_;
      fl.dst_buf = f16;
      fl.offset = group_start;
      fl.elements = n;
      Event& cast = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, fmt::format("cast_grads_fp32.subgroup{}", gi));
      cast.mem_bytes = Bytes{n * (b16() + 4)};
      const BufferId f32 = b_.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32, n,
                                     fmt::format("sub-group {} grads (fp32)", gi), static_cast<std::int32_t>(gi));
      b_.alloc(f32);
      cast.copy_op = CopyOp::cast;
      cast.src_buf = f16;
      cast.dst_buf = f32;
      optimizer_event(n, Placement::device, fmt::format("optimizer.subgroup{}", gi), master_buf_, f32, group_start);
      b_.free(f16);
      b_.free(f32);
      Event& cp = b_.begin(EventKind::copy, Stream::compute, Phase::step, -1, fmt::format("master_to_params16.subgroup{}", gi));
      cp.mem_bytes = Bytes{n * (4 + b16())};
      params_from_master(cp, group_start, n);
      group_start += n;
    }
    persistent_allgather();
  }

  // stage3.py _post_step: the persistent params' full copies are refreshed from the
  // updated partitions by one coalesced all-gather into a flat buffer.
  void persistent_allgather() {
    std::vector<ParamId> ps;
    std::int64_t gathered = 0, full = 0;
    for (const auto& prm : g_.params)
      if (s3_persistent_[static_cast<std::size_t>(prm.id)]) {
        ps.push_back(prm.id);
        gathered += N_ * ceil_div(prm.numel, N_);
        full += prm.numel;
      }
    if (ps.empty()) return;
    collective(Stream::compute, Phase::post_step, -1, b_.label("all_gather.persistent_params"), CollKind::all_gather,
               ReduceOp::none, Trigger::post_step, dp_group_, gathered, md_, -1);
    const BufferId flat = b_.buffer(Category::comm_buffers, Placement::device, BufferRole::gather_flat, md_, gathered,
                                    "all-gather flat buffer persistent params", -1);
    b_.alloc(flat);
    b_.cur().src_buf = params_buf_;
    b_.cur().dst_buf = flat;
    for (ParamId p : ps) b_.slice({p, 0, numel(p), -1});
    Event& cp = b_.begin(EventKind::copy, Stream::compute, Phase::post_step, -1, "unflatten.persistent_params");
    cp.mem_bytes = Bytes{2 * full * b16()};
    cp.copy_op = CopyOp::gather_unflatten;
    cp.src_buf = flat;
    for (ParamId p : ps) b_.slice({p, 0, numel(p), -1});
    b_.free(flat);
  }

  // ------------------------------------------------------------------ state
  const OpGraph& g_;
  const DsConfig& cfg_;
  const Batch& batch_;
  const LowerOptions& opt_;
  Program& p_;
  Builder b_;
  GraphFacts f_;
  FlatLayout layout_;
  int N_ = 1;
  int stage_ = 0;
  DType md_ = DType::fp16, cd_ = DType::fp16;
  bool overlap_ = false, offload_opt_ = false, offload_param_ = false, ckpt_ = false, bf16_opt_ = false;
  std::int64_t rbs_ = 0;
  std::int64_t hpz_ = 1;
  GroupId dp_group_ = 0, hpz_group_ = -1;
  int ms_ = 0;
  bool boundary_ = false;
  bool boundary_pass_ = false;
  std::int32_t recompute_layer_ = -1;
  std::vector<char> ckpt_input_;
  std::vector<std::int32_t> op_labels_, tensor_labels_, grad_labels_, pgrad_labels_, s3_full_label_;

  // persistent buffers the executor's operands name
  BufferId params_buf_ = -1, master_buf_ = -1, states_buf_ = -1;
  BufferId grads32_ = -1;  // BF16_Optimizer: the flat fp32 gradients of every param
  // stages 0/1: accumulated param.grad buffers across micro-steps
  std::vector<BufferId> accum_grads_;
  // stages 1/2: ipg bucket state
  bool ipg_ready_ = false;
  BufferId ipg_buf_[2] = {-1, -1};
  int ipg_index_ = 0;
  std::int64_t ipg_elements_ = 0;
  std::vector<BucketSlice> ipg_params_;
  std::vector<BufferId> ipg_loose_grads_, ipg_large_grads_;
  EventId ipg_last_reduce_[2] = {-1, -1};
  EventId last_reduce_ = -1;
  EventId last_copy_ = -1;
  EventId last_grad_event_ = -1;
  EventId last_compute_ = -1;             // the latest compute event issued
  BufferId grads_in_partition_ = -1;
  BufferId accumulated_partition_ = -1;  // stage 2: all_grad_tensors across micro-steps
  int bucket_seq_ = 0;

  // stage 3
  std::vector<char> s3_persistent_;
  BufferId s3_grad_partition_ = -1, s3_bucket_ = -1;
  BufferId host_grads_ = -1;  // offload: the host fp32 gradient partition
  std::vector<Visit> visits_fwd_;
  std::vector<std::int32_t> visit_of_first_op_, visit_of_last_op_;
  std::vector<TraceStep> trace_;
  std::vector<ParamUse> param_trace_;
  std::vector<std::int64_t> trace_prefix_;
  std::vector<std::size_t> trace_param_begin_;
  std::vector<std::int32_t> next_use_;
  std::size_t trace_pos_ = 0, param_q_ = 0;
  std::vector<BufferId> s3_full_, s3_hpz_;
  std::vector<EventId> s3_inflight_from_;
  std::vector<std::int32_t> s3_fetched_for_;
  std::int64_t s3_live_ = 0;
  std::int64_t s3_elements_ = 0;
  std::vector<BucketSlice> s3_params_;
  std::vector<BufferId> s3_loose_;
  EventId s3_last_reduce_ = -1;
  int gather_seq_ = 0, prefetch_seq_ = 0;
};

}  // namespace

FlatLayout flat_layout(const OpGraph& g, int world_size) {
  FlatLayout l;
  l.offset.reserve(g.params.size());
  for (const auto& p : g.params) {
    l.offset.push_back(l.params);
    l.params += p.numel;
  }
  l.padded = round_up(l.params, 2LL * world_size);
  l.partition = l.padded / world_size;
  return l;
}

std::vector<std::int64_t> grads_in_partition_offsets(const OpGraph& g, const FlatLayout& l, int rank) {
  const std::int64_t lo = static_cast<std::int64_t>(rank) * l.partition;
  const std::int64_t hi = lo + l.partition;
  std::vector<std::int64_t> off(g.params.size(), -1);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    const std::int64_t a = l.offset[i], z = a + g.params[i].numel;
    if (a < hi && z > lo) {
      off[i] = at;
      at += g.params[i].numel;
    }
  }
  return off;
}

std::int64_t grads_in_partition_elements(const OpGraph& g, const FlatLayout& l, int rank) {
  const auto off = grads_in_partition_offsets(g, l, rank);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < off.size(); ++i)
    if (off[i] >= 0) total += g.params[i].numel;
  return total;
}

std::vector<std::int64_t> stage3_partition_offsets(const OpGraph& g, int world_size) {
  std::vector<std::int64_t> off(g.params.size() + 1, 0);
  for (std::size_t i = 0; i < g.params.size(); ++i) off[i + 1] = off[i] + ceil_div(g.params[i].numel, world_size);
  return off;
}

std::int64_t stage3_partition_elements(const OpGraph& g, int world_size) {
  return stage3_partition_offsets(g, world_size).back();
}

bool runs_bf16_optimizer(const DsConfig& cfg, const ZeroConfig& z) {
  return z.stage == 1 && cfg.model_dtype() == DType::bf16 && cfg.grad_accum_dtype == DType::fp32 &&
         z.offload_optimizer.device == OffloadDevice::none;
}

GradientBuckets gradient_buckets(const DsConfig& cfg, const ZeroConfig& z) {
  if (!z.contiguous_gradients || z.stage == 0 || runs_bf16_optimizer(cfg, z)) return {};
  if (z.stage == 3) return {1, Bytes{z.reduce_bucket_size * dtype_size(cfg.communication_data_type())}};
  // stage_1_and_2.py: hooks are installed (contiguous_gradients), one bucket, two with overlap.
  return {z.overlap() ? 2 : 1, Bytes{z.reduce_bucket_size * dtype_size(cfg.model_dtype())}};
}

Bytes device_bytes_lower_bound(const DsConfig& cfg, const ZeroConfig& z, std::int64_t params, int world_size) {
  const std::int64_t n = world_size;
  std::int64_t bytes = (z.stage == 3 ? ceil_div(params, n) : params) * dtype_size(cfg.model_dtype());
  const bool offload = z.offload_optimizer.device != OffloadDevice::none && z.stage >= 1;
  if (!offload) {
    const std::int64_t master = cfg.model_dtype() == DType::fp32 ? 0 : 4;
    bytes += (z.stage == 0 ? params : params / n) * (master + cfg.optimizer.state_bytes_per_param());
  }
  const GradientBuckets b = gradient_buckets(cfg, z);
  return Bytes{bytes + b.count * b.each.v};
}

int heaviest_rank(const OpGraph& g, const DsConfig& cfg, int world_size) {
  if (cfg.zero.stage != 1 && cfg.zero.stage != 2) return 0;
  const FlatLayout l = flat_layout(g, world_size);
  int best = 0;
  std::int64_t best_n = -1;
  for (int r = 0; r < world_size; ++r) {
    const std::int64_t n = grads_in_partition_elements(g, l, r);
    if (n > best_n) { best_n = n; best = r; }
  }
  return best;
}

Program lower(const OpGraph& g, const DsConfig& cfg, const Batch& batch, const LowerOptions& opt) {
  if (opt.world_size < 1) throw std::invalid_argument("world size must be >= 1");
  if (opt.rank < 0 || opt.rank >= opt.world_size) throw std::invalid_argument("rank out of range");
  Program p;
  Lowering low(g, cfg, batch, opt, p);
  low.run();
  return p;
}

}  // namespace zp::zero
