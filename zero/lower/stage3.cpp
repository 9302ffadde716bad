#include "zero/lower/stage3.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "zero/lower/offload.hpp"
#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

using models::ParamId;

void Stage3Lowering::prologue() {
  Builder& b = c_.b;
  const Placement pw = c_.offload_param ? Placement::host : Placement::device;
  const std::int64_t part = stage3_partition_elements(c_.g, c_.N);  // Σ ceil(numel/N)
  // (Σ ceil(numel/N),) model dtype
  c_.states.params = c_.persistent(Category::params, pw, BufferRole::param_partition16, c_.md, part,
                                   fmt::format("params{} partitions (sum of ceil(numel/N))", dtype_name(c_.md)));
  if (coord_.persistent_elements() > 0) {
    // (Σ numel of the persistent params,) model dtype
    c_.persistent(Category::params, Placement::device, BufferRole::param_full16, c_.md, coord_.persistent_elements(),
                  fmt::format("persistent params (numel <= {})", c_.cfg.zero.stage3_param_persistence_threshold));
    // Where each persistent param lives in the buffer (for the executor).
    std::int64_t at = 0;
    for (const auto& prm : c_.g.params)
      if (coord_.persistent(prm.id)) {
        b.slice({prm.id, 0, prm.numel, at});
        at += prm.numel;
      }
  }
  // (Σ ceil(numel/N),) fp32 master partition and its states. stage3.py _create_fp32_partitions
  // on the device: the 16-bit partitions converted to fp32 (a temporary), then its clone is
  // the master; the converted copy goes once the master exists (its cached block later takes
  // the gradient partition).
  std::vector<BufferId> converted;
  if (!c_.offload_opt && c_.md != DType::fp32)
    converted = {c_.init_temp(Category::master_params, DType::fp32, part, "fp32_partitions.converted", true)};
  c_.states.master = c_.persistent(Category::master_params, optimizer_placement(c_), master_role(c_), DType::fp32, part,
                                   "master fp32 partition", 0);
  c_.free_init(converted, "fp32_partitions.drop_converted");
  // Adam's states: created by its first step (stage3.py _optimizer_step).
  c_.optimizer_states(part, "optimizer states (partition)", 0, DType::fp32, true);
  // _setup_for_real_optimizer's order: the IPG bucket, then the flat gradient partition.
  if (c_.cfg.zero.contiguous_gradients)
    // (RBS,) communication dtype
    bucket_ = c_.persistent(Category::comm_buffers, Placement::device, BufferRole::ipg_bucket, c_.cd, c_.rbs,
                            fmt::format("reduce bucket ({} elements)", c_.rbs), 0);
  if (c_.offload_opt) {
    host_grad_partition(c_, part);
  } else {
    // (Σ ceil(numel/N),) accumulation dtype
    grad_partition_ = c_.persistent(Category::grads, Placement::device, BufferRole::grad_partition, c_.accum_dtype(), part,
                                    "flat gradient partition");
  }
  coord_.build_trace();
}

// The autograd gradient lives until the hook copies it into the bucket.
void Stage3Lowering::grad_produced(MicroState& st, ParamId p, models::OpId) { own_grad(c_, st, p); }

// stage3.py: the gradient is copied into the persistent reduce bucket; a bucket that
// cannot take the next gradient is reduce-scattered first.
void Stage3Lowering::grad_hook(MicroState& st, ParamId p) {
  Builder& b = c_.b;
  c_.at.last_grad_event = b.cur_id();  // the backward op that produced the gradient
  c_.host_hook(Phase::backward);       // reduce_partition_and_remove_grads' Python
  const std::int64_t n = c_.numel(p);
  if (elements_ + n > c_.rbs && elements_ > 0) flush(Trigger::bucket_full);
  const BufferId grad = st.param_grad[static_cast<std::size_t>(p)];
  st.param_grad[static_cast<std::size_t>(p)] = -1;
  if (c_.cfg.zero.contiguous_gradients && elements_ + n <= c_.rbs) {
    Event& e = b.begin(EventKind::copy, Stream::compute, Phase::backward, c_.at.micro,
                       b.cached(LabelKind::copy_to_bucket, p, [&] { return fmt::format("copy_to_bucket.{}", c_.pname(p)); }));
    e.mem_bytes = Bytes{2 * n * c_.b16()};
    e.copy_op = CopyOp::grad_to_bucket;
    e.src_buf = grad;
    e.dst_buf = bucket_;
    b.dep(last_reduce_);
    b.slice({p, 0, n, elements_});
    b.free(grad);
    c_.at.last_copy = b.cur_id();
    c_.launched(b.cur_id());
  } else {
    loose_.push_back(grad);
  }
  params_.push_back({p, 0, n, elements_});
  elements_ += n;
}

// stage3.py __reduce_and_partition_ipg_grads: the bucket is interleaved per destination
// rank into one buffer (reduce_scatter_coalesced), reduce-scattered, and this rank's
// output — a view of that buffer — accumulated into the gradient partition; only with
// reduce_scatter false and contiguous_gradients is the contiguous bucket all-reduced in
// place instead (__avg_scatter_contiguous_grads), and this rank's chunk of each param
// taken from it.
// host work: the collective launch.
void Stage3Lowering::flush(Trigger why) {
  if (params_.empty()) return;
  Builder& b = c_.b;
  const Stream rs = c_.red_stream();
  const int m = c_.at.micro;
  const std::size_t first = c_.p.events.size();  // issued from a hook (or the backward's end)
  const int bn = c_.at.bucket_seq++;
  std::int64_t padded = 0, out = 0;  // Σ N·ceil(count/N), Σ ceil(count/N)
  for (const auto& s : params_) {
    padded += c_.N * ceil_div(s.count, c_.N);
    out += ceil_div(s.count, c_.N);
  }
  Event& il = b.begin(EventKind::copy, rs, Phase::backward, m,
                      b.cached(LabelKind::interleave, bn, [&] { return fmt::format("interleave.bucket{}", bn); }));
  b.dep(c_.at.last_copy);
  b.dep(c_.at.last_grad_event);
  BufferId inter = -1;
  const BufferId bucket_src = c_.cfg.zero.contiguous_gradients ? bucket_ : -1;
  BufferId reduced = bucket_src;
  // (a param larger than the bucket stays outside it, and then the bucket is not used)
  if (c_.cfg.zero.reduce_scatter || !c_.cfg.zero.contiguous_gradients || !loose_.empty()) {
    il.mem_bytes = Bytes{2 * padded * dtype_size(c_.cd)};
    // (Σ N·ceil(count/N),) communication dtype, rank-major blocks
    inter = b.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, c_.cd, padded,
                     b.cached(LabelKind::rs_in, bn, [&] { return fmt::format("reduce-scatter input bucket{}", bn); }), bn);
    b.alloc(inter);
    il.copy_op = CopyOp::interleave;
    il.src_buf = bucket_src;
    il.dst_buf = inter;
    for (const auto& s : params_) b.slice(s);
    reduced = inter;
    c_.collective(rs, Phase::backward, m,
                  b.cached(LabelKind::reduce_scatter, bn, [&] { return fmt::format("reduce_scatter.bucket{}", bn); }),
                  CollKind::reduce_scatter, ReduceOp::avg, why, c_.dp_group, padded, c_.cd, bn);
  } else {
    std::int64_t elements = 0;
    for (const auto& sl : params_) elements += sl.count;
    c_.collective(rs, Phase::backward, m,
                  b.cached(LabelKind::all_reduce, bn, [&] { return fmt::format("all_reduce.bucket{}", bn); }),
                  CollKind::all_reduce, ReduceOp::avg, why, c_.dp_group, elements, c_.cd, bn);
  }
  b.cur().dst_buf = reduced;
  for (const auto& s : params_) b.slice(s);
  Event& acc = b.begin(EventKind::copy, rs, Phase::backward, m,
                       b.cached(LabelKind::accumulate_partition, bn,
                                [&] { return fmt::format("accumulate_partition.bucket{}", bn); }));
  acc.mem_bytes = Bytes{3 * out * dtype_size(c_.cd)};
  acc.copy_op = CopyOp::shard_accumulate;
  acc.copy_kernel = CopyKernel::add;
  acc.src_buf = reduced;
  acc.dst_buf = c_.offload_opt ? c_.states.host_grads : grad_partition_;
  for (const auto& s : params_) b.slice(s);
  if (c_.offload_opt) acc.dst = Placement::host;
  if (inter >= 0) b.free(inter);
  for (BufferId gbuf : loose_) b.free(gbuf);
  loose_.clear();
  last_reduce_ = b.cur_id();
  c_.at.last_reduce = last_reduce_;
  params_.clear();
  elements_ = 0;
  c_.launched_since(first);
}

void Stage3Lowering::end_of_backward() {
  flush(Trigger::end_of_backward);
  coord_.end_pass();
}

// Whole params packed in order, a group closed by the param that brings it to sub_group_size
// elements or past it (stage3.py's _create_fp16_sub_groups: a group may exceed the size by its
// last param; 0: a group per param); sizes in partition elements (Σ ceil(numel/N)).
std::vector<std::int64_t> Stage3Lowering::sub_groups() const {
  std::vector<std::int64_t> sizes;
  std::int64_t cur = 0;
  for (const auto& prm : c_.g.params) {
    cur += ceil_div(prm.numel, c_.N);
    if (cur >= c_.cfg.zero.sub_group_size) {
      sizes.push_back(cur);
      cur = 0;
    }
  }
  if (cur > 0) sizes.push_back(cur);
  return sizes;
}

// One sub-group's step on the device: its gradients flattened (n,) model dtype, cast to
// (n,) fp32, the update, the copy back to the 16-bit partition.
void Stage3Lowering::device_step_subgroup(std::int64_t gi, std::int64_t offset, std::int64_t n) {
  Builder& b = c_.b;
  Event& fl = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, fmt::format("flatten_grads.subgroup{}", gi));
  fl.mem_bytes = Bytes{2 * n * c_.b16()};
  const BufferId f16 = b.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, c_.md, n,
                                fmt::format("sub-group {} grads ({})", gi, dtype_name(c_.md)), static_cast<std::int32_t>(gi));
  b.alloc(f16);
  fl.copy_op = CopyOp::subgroup_grads;
  fl.host_bound = gi == 0;  // the first after the host read the norm back
  fl.src_buf = grad_partition_;
  fl.dst_buf = f16;
  fl.offset = offset;
  fl.elements = n;
  Event& cast = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, fmt::format("cast_grads_fp32.subgroup{}", gi));
  cast.mem_bytes = Bytes{n * (c_.b16() + 4)};
  const BufferId f32 = b.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32, n,
                                fmt::format("sub-group {} grads (fp32)", gi), static_cast<std::int32_t>(gi));
  b.alloc(f32);
  cast.copy_op = CopyOp::cast;
  cast.copy_kernel = CopyKernel::cast;
  cast.src_buf = f16;
  cast.dst_buf = f32;
  optimizer_event(c_, n, Placement::device, fmt::format("optimizer.subgroup{}", gi), c_.states.master, f32, offset);
  unscale_pass(c_.p.events.back(), n);
  b.free(f16);
  b.free(f32);
  Event& cp = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, fmt::format("master_to_params16.subgroup{}", gi));
  cp.mem_bytes = Bytes{n * (4 + c_.b16())};
  params_from_master(c_, cp, offset, n);
}

void Stage3Lowering::step() {
  overflow_scan();
  gradient_checks(c_);
  // hpZ secondary copies live from forward to the step.
  coord_.release_secondary_partitions();
  const auto sizes = sub_groups();
  std::int64_t offset = 0;
  for (std::size_t gi = 0; gi < sizes.size(); ++gi) {
    const std::int64_t n = sizes[gi];
    if (c_.offload_opt) host_step_subgroup(c_, static_cast<std::int64_t>(gi), offset, n);
    else device_step_subgroup(static_cast<std::int64_t>(gi), offset, n);
    offset += n;
  }
  persistent_allgather();
}

// stage3.py has_overflow (fp16 only): on reduce_and_partition_stream (the reduction stream
// under overlap_comm), torch.isinf and then torch.isnan of the flat gradient partition, each
// a bool tensor of its elements reduced by .any() to one element; the step waits for it.
// (Stages 0-2 test with reductions that allocate nothing of that size.)
void Stage3Lowering::overflow_scan() {
  if (c_.md != DType::fp16 || c_.offload_opt) return;
  Builder& b = c_.b;
  const std::int64_t part = stage3_partition_elements(c_.g, c_.N);
  for (const char* test : {"isinf", "isnan"}) {
    Event& e = b.begin(EventKind::copy, c_.red_stream(), Phase::step, -1, fmt::format("overflow_check.{}", test));
    e.mem_bytes = Bytes{part * (c_.b16() + 1)};
    b.dep(c_.at.last_reduce);
    // (Σ ceil(numel/N),) bool, then (1,) bool
    const BufferId mask = b.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, DType::b1, part,
                                   fmt::format("torch.{} of the gradient partition", test));
    const BufferId any = b.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, DType::b1, 1,
                                  fmt::format("torch.{}(...).any()", test));
    b.alloc(mask);
    b.alloc(any);
    b.free(mask);
    b.free(any);
    c_.at.last_reduce = e.id;
  }
}

// stage3.py _post_step: the persistent params' full copies are refreshed from the updated
// partitions by one coalesced all-gather into a flat buffer (Σ N·ceil(numel/N) elements).
void Stage3Lowering::persistent_allgather() {
  Builder& b = c_.b;
  std::vector<ParamId> ps;
  std::int64_t gathered = 0, full = 0;
  for (const auto& prm : c_.g.params)
    if (coord_.persistent(prm.id)) {
      ps.push_back(prm.id);
      gathered += c_.N * ceil_div(prm.numel, c_.N);
      full += prm.numel;
    }
  if (ps.empty()) return;
  c_.collective(Stream::compute, Phase::post_step, -1, b.label("all_gather.persistent_params"), CollKind::all_gather,
                ReduceOp::none, Trigger::post_step, c_.dp_group, gathered, c_.md, -1);
  // It reads the updated partitions: with the optimizer offloaded they come back from the
  // host on the host stream (params_to_device.subgroupN, the last of them).
  b.dep(c_.at.last_update);
  const BufferId flat = b.buffer(Category::comm_buffers, Placement::device, BufferRole::gather_flat, c_.md, gathered,
                                 "all-gather flat buffer persistent params", -1);
  b.alloc(flat);
  b.cur().src_buf = c_.states.params;
  b.cur().dst_buf = flat;
  for (ParamId p : ps) b.slice({p, 0, c_.numel(p), -1});
  Event& cp = b.begin(EventKind::copy, Stream::compute, Phase::post_step, -1, "unflatten.persistent_params");
  cp.mem_bytes = Bytes{2 * full * c_.b16()};
  cp.copy_op = CopyOp::gather_unflatten;
  cp.src_buf = flat;
  for (ParamId p : ps) b.slice({p, 0, c_.numel(p), -1});
  b.free(flat);
}

void Stage3Lowering::before_op(models::OpId o, Phase ph) {
  coord_.before_op(o, ph);
  const models::Fn fn = c_.g.ops[static_cast<std::size_t>(o)].fn;
  if (c_.cfg.zero.memory_efficient_linear && (fn == models::Fn::linear || fn == models::Fn::linear_first_token))
    c_.host_linear_function(ph);
}

void Stage3Lowering::forward_compute(Event& e, const models::Op& op) {
  if (!c_.cfg.zero.memory_efficient_linear || op.fn != models::Fn::linear || op.inputs.empty()) return;
  const bool biased = std::any_of(op.gemms.begin(), op.gemms.end(), [](const models::Gemm& g) { return g.bias; });
  const auto& in = c_.g.tensors[static_cast<std::size_t>(op.inputs.front())];
  e.unfused_bias = biased && in.shape.size() >= 3;
  // `output += bias` is an eager op of its own: dispatched and launched apart from the product.
  if (e.unfused_bias) c_.host_extra_op(e.phase, e.id);
}

}  // namespace zp::zero::lowering
