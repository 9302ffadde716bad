#include "zero/lower/stage_1_and_2.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "zero/lower/offload.hpp"
#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

using models::ParamId;

void ZeroOptimizerLowering::prologue() {
  const std::int64_t P = c_.layout.partition;  // Ψ'/N
  // stage_1_and_2.py __init__ on the model transformers built (and the engine cast):
  // empty_cache(), then flatten_dense_tensors_aligned packs the params into the flat buffer
  // and _update_model_bit16_weights points them into it (the module's tensors go).
  std::vector<BufferId> module;
  if (!c_.offload_opt) {
    module = c_.build_model();
    c_.empty_cache("empty_cache_before_flatten");
  }
  // (Ψ',) model dtype, Ψ' = roundup(Ψ, 2N)
  c_.states.params = c_.persistent(Category::params, Placement::device, BufferRole::flat_params16, c_.md, c_.layout.padded,
                                   fmt::format("params{} (flat, padded to 2N: {} elements)", dtype_name(c_.md), c_.layout.padded));
  std::vector<BufferId> clone;
  if (!c_.offload_opt) {
    c_.free_init(module, "params_to_flat_views");
    // partition.detach().clone().to(fp32): a 16-bit clone of this rank's partition, then its
    // fp32 copy (the master); for an fp32 model the clone is the master.
    if (c_.md != DType::fp32) clone = {c_.init_temp(Category::master_params, c_.md, P, "partition.clone")};
  }
  // (P,) fp32 master partition and its states
  c_.states.master = c_.persistent(Category::master_params, optimizer_placement(c_), master_role(c_), DType::fp32, P,
                                   "master fp32 partition", 0);
  if (!c_.offload_opt) {
    c_.free_init(clone, "partition.drop_clone");
    // initialize_optimizer_states: a zero fp32 gradient for the partition, dropped again
    // (Adam creates its states at the first step).
    c_.init_temp(Category::grads, DType::fp32, P, "initialize_optimizer_states.zero_grads", false);
  }
  // Adam's states: created by its first step (stage_1_and_2.py _optimizer_step).
  c_.optimizer_states(P, "optimizer states (partition)", 0, DType::fp32, true);
  if (c_.offload_opt) host_buffers_stage12(c_, P);
}

// stage_1_and_2.py: hooks when partition_gradients, overlap_comm or contiguous_gradients.
bool ZeroOptimizerLowering::hooks_installed() const {
  return c_.stage == 2 || c_.overlap || c_.cfg.zero.contiguous_gradients;
}

void ZeroOptimizerLowering::grad_produced(MicroState& st, ParamId p, models::OpId o) {
  // Stage 1: param.grad persists across micro-steps until the boundary reduction copies it
  // into the bucket. Stage 2: the gradient lives until the hook copies it into the bucket.
  if (c_.stage == 1) grads_.produced(c_, p, o);
  else own_grad(c_, st, p);
}

void ZeroOptimizerLowering::grad_hook(MicroState& st, ParamId p) {
  c_.at.last_grad_event = c_.b.cur_id();  // the backward op that produced the gradient
  if (!hooks_installed()) return;
  // Stage 1 without overlap_comm: the hook finds nothing to do (its gradients are reduced
  // at the boundary); otherwise it runs reduce_independent_p_g_buckets_and_remove_grads.
  const bool reduce_now = c_.stage == 2 || (c_.overlap && c_.at.boundary);
  c_.host_hook(Phase::backward, reduce_now);
  setup_buckets();
  if (reduce_now) ipg_add(&st, p, false);
}

// stage_1_and_2.py setup_buckets: at the first hook of a backward, when not already set
// up, allocate RBS elements (×2 under overlap_comm) if contiguous_gradients.
void ZeroOptimizerLowering::setup_buckets() {
  if (ipg_ready_) return;
  ipg_ready_ = true;
  const int nbuf = gradient_buckets(c_.cfg).count;
  if (nbuf == 0) return;
  Builder& b = c_.b;
  b.begin(EventKind::marker, Stream::compute, Phase::backward, c_.at.micro, "setup_buckets");
  for (int i = 0; i < nbuf; ++i) {
    // (RBS,) model dtype
    ipg_buf_[i] = b.buffer(Category::comm_buffers, Placement::device, BufferRole::ipg_bucket, c_.md, c_.rbs,
                           fmt::format("ipg bucket {} ({} elements)", i, c_.rbs), i);
    b.alloc(ipg_buf_[i]);
  }
  ipg_index_ = 0;
  ipg_elements_ = 0;
}

void ZeroOptimizerLowering::release_ipg_buffers() {
  if (!ipg_ready_) return;
  for (int i = 0; i < 2; ++i)
    if (ipg_buf_[i] >= 0) {
      c_.b.free(ipg_buf_[i]);
      ipg_buf_[i] = -1;
    }
  ipg_ready_ = false;
}

BufferId ZeroOptimizerLowering::take_grad(MicroState* st, ParamId p) {
  if (c_.stage == 1) return grads_.take(p);
  auto& pg = st->param_grad[static_cast<std::size_t>(p)];
  const BufferId g = pg;
  pg = -1;
  return g;
}

// stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads.
// (The hook's Python is on the host event: grad_hook.)
void ZeroOptimizerLowering::ipg_add(MicroState* st, ParamId p, bool at_boundary_pass) {
  const std::int64_t n = c_.numel(p);
  if (ipg_elements_ + n > c_.rbs) flush_ipg(Trigger::bucket_full);
  const BufferId grad = take_grad(st, p);
  if (c_.cfg.zero.contiguous_gradients && n > c_.rbs) {
    // Reduced on its own from its own storage.
    ipg_params_.push_back({p, 0, n, -1});
    ipg_large_grads_.push_back(grad);
    flush_ipg(Trigger::param_too_large);
    return;
  }
  if (c_.cfg.zero.contiguous_gradients) {
    Builder& b = c_.b;
    Event& e = b.begin(EventKind::copy, Stream::compute, at_boundary_pass ? Phase::reduction : Phase::backward, c_.at.micro,
                       b.cached(LabelKind::copy_to_bucket, p, [&] { return fmt::format("copy_to_bucket.{}", c_.pname(p)); }));
    e.mem_bytes = Bytes{2 * n * c_.b16()};
    e.copy_op = CopyOp::grad_to_bucket;
    e.src_buf = grad;
    e.dst_buf = ipg_buf_[ipg_index_];
    // The compute stream must not overwrite a buffer still being reduced.
    b.dep(ipg_last_reduce_[ipg_index_]);
    b.slice({p, 0, n, ipg_elements_});
    b.free(grad);  // grad now views the bucket: its own storage is released
    c_.at.last_copy = b.cur_id();
    if (!at_boundary_pass) c_.launched(b.cur_id());
  } else {
    ipg_loose_grads_.push_back(grad);
  }
  ipg_params_.push_back({p, 0, n, ipg_elements_});
  ipg_elements_ += n;
}

std::int64_t ZeroOptimizerLowering::overlap_with_rank(std::int64_t lo, std::int64_t hi, int r) const {
  const std::int64_t P = c_.layout.partition;
  const std::int64_t a = std::max(lo, static_cast<std::int64_t>(r) * P);
  const std::int64_t z = std::min(hi, static_cast<std::int64_t>(r + 1) * P);
  return std::max<std::int64_t>(0, z - a);
}

int ZeroOptimizerLowering::merged_slices() const {
  const std::int64_t P = c_.layout.partition;
  int n = 0;
  std::int64_t prev = -1;
  for (const auto& s : ipg_params_) {
    const std::int64_t lo = c_.layout.offset[static_cast<std::size_t>(s.param)] + s.param_offset;
    for (std::int64_t r = lo / P; r <= (lo + s.count - 1) / P; ++r) {
      if (r != prev) ++n;
      prev = r;
    }
  }
  return n;
}

std::int64_t ZeroOptimizerLowering::mine(int r) const {
  std::int64_t part = 0;
  for (const auto& s : ipg_params_) {
    const std::int64_t lo = c_.layout.offset[static_cast<std::size_t>(s.param)] + s.param_offset;
    part += overlap_with_rank(lo, lo + s.count, r);
  }
  return part;
}

// stage_1_and_2.py reduce_ipg_grads → average_tensor / allreduce_bucket.
// host work: the collective launches.
void ZeroOptimizerLowering::flush_ipg(Trigger why) {
  if (ipg_params_.empty()) return;
  Builder& b = c_.b;
  const auto& z = c_.cfg.zero;
  std::int64_t elements = 0;
  for (const auto& s : ipg_params_) elements += s.count;
  const Stream rs = c_.red_stream();
  const Phase ph = boundary_pass_ ? Phase::reduction : Phase::backward;
  const int bucket_no = c_.at.bucket_seq++;
  const std::size_t first = c_.p.events.size();  // a hook's flush: launches beside the backward's ops
  // average_tensor: with use_multi_rank_bucket_allreduce the slices are flattened
  // (allreduce_bucket copies them: torch.cat) and all-reduced — unless the bucket is one
  // slice (it lies in one rank's partition: always on one rank), which
  // flatten_dense_tensors returns as a view of the bucket; with it false each destination's
  // slice is reduced in place; with reduce_scatter false the bucket is all-reduced in
  // place. Loose gradients (no contiguous bucket) are always flattened. A cast copy is
  // added when communication_data_type differs from the model dtype.
  const bool flatten = !z.contiguous_gradients ||
                       (z.reduce_scatter && z.use_multi_rank_bucket_allreduce && merged_slices() > 1);
  Event& fl = b.begin(EventKind::copy, rs, ph, c_.at.micro,
                      b.cached(LabelKind::flatten, bucket_no, [&] { return fmt::format("flatten.bucket{}", bucket_no); }));
  fl.mem_bytes = Bytes{flatten ? 2 * elements * c_.b16() : 0};
  b.dep(c_.at.last_copy);
  b.dep(c_.at.last_grad_event);
  BufferId flat = -1;
  if (flatten) {
    // (Σ slice counts,) model dtype
    flat = b.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, c_.md, elements,
                    b.cached(LabelKind::flatten_buf, bucket_no, [&] { return fmt::format("flatten bucket{}", bucket_no); }),
                    bucket_no);
    b.alloc(flat);
  }
  BufferId cast = -1;
  if (c_.cd != c_.md) {
    // (Σ slice counts,) communication dtype
    cast = b.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, c_.cd, elements,
                    b.cached(LabelKind::cast_buf, bucket_no,
                             [&] { return fmt::format("cast bucket{} to {}", bucket_no, dtype_name(c_.cd)); }),
                    bucket_no);
    b.alloc(cast);
  }
  for (const auto& s : ipg_params_) b.slice(s);
  // Data: the slices are packed in order into the reduced buffer: the cast copy, else the
  // flat copy, else the contiguous bucket itself, else (a lone param) its own gradient.
  const BufferId bucket_src = z.contiguous_gradients ? ipg_buf_[ipg_index_] : -1;
  BufferId reduced = cast >= 0 ? cast : flat >= 0 ? flat : bucket_src;
  if (!ipg_large_grads_.empty() && flat < 0 && cast < 0) reduced = ipg_large_grads_.front();
  if (flat >= 0 || cast >= 0) {
    fl.copy_op = CopyOp::flatten;
    if (cast >= 0) fl.copy_kernel = CopyKernel::cast;
    fl.src_buf = bucket_src;
    fl.dst_buf = reduced;
  }
  const EventId last = reduce_bucket(rs, ph, bucket_no, why, elements, reduced);
  copy_to_partition(rs, ph, bucket_no, last, reduced);
  if (flat >= 0) b.free(flat);
  if (cast >= 0) b.free(cast);
  for (BufferId gbuf : ipg_loose_grads_) b.free(gbuf);
  for (BufferId gbuf : ipg_large_grads_) b.free(gbuf);
  ipg_loose_grads_.clear();
  ipg_large_grads_.clear();
  ipg_last_reduce_[ipg_index_] = b.cur_id();
  c_.at.last_reduce = b.cur_id();
  ipg_params_.clear();
  ipg_elements_ = 0;
  if (c_.overlap) ipg_index_ = 1 - ipg_index_;
  if (ph == Phase::backward) c_.launched_since(first);
}

EventId ZeroOptimizerLowering::reduce_bucket(Stream rs, Phase ph, int bucket_no, Trigger why, std::int64_t elements,
                                             BufferId reduced) {
  Builder& b = c_.b;
  const auto& z = c_.cfg.zero;
  const bool multi_rank_allreduce = z.use_multi_rank_bucket_allreduce || !z.reduce_scatter;
  EventId last = -1;
  if (multi_rank_allreduce || c_.N == 1) {
    c_.collective(rs, ph, c_.at.micro,
                  b.cached(LabelKind::all_reduce, bucket_no, [&] { return fmt::format("all_reduce.bucket{}", bucket_no); }),
                  CollKind::all_reduce, ReduceOp::avg, why, c_.dp_group, elements, c_.cd, bucket_no);
    b.cur().dst_buf = reduced;
    for (const auto& s : ipg_params_) b.slice(s);
    return b.cur_id();
  }
  // One reduce per destination rank, carrying the part of the bucket it owns.
  for (int r = 0; r < c_.N; ++r) {
    const std::int64_t part = mine(r);
    if (part == 0) continue;
    c_.collective(rs, ph, c_.at.micro,
                  b.cached(LabelKind::reduce_to, bucket_no * 65536 + r,
                           [&] { return fmt::format("reduce.bucket{}.to{}", bucket_no, r); }),
                  CollKind::reduce, ReduceOp::avg, why, c_.dp_group, part, c_.cd, bucket_no);
    b.cur().dst_buf = reduced;
    b.cur().root = r;
    for (const auto& s : ipg_params_) b.slice(s);
    last = b.cur_id();
  }
  return last;
}

// This rank's slices of the reduced buffer into grads_in_partition (allocated at the
// first reduction), or, offloaded, into the host fp32 gradient partition.
void ZeroOptimizerLowering::copy_to_partition(Stream rs, Phase ph, int bucket_no, EventId after, BufferId reduced) {
  Builder& b = c_.b;
  Event& cp = b.begin(EventKind::copy, rs, ph, c_.at.micro,
                      b.cached(LabelKind::copy_to_partition, bucket_no,
                               [&] { return fmt::format("copy_to_partition.bucket{}", bucket_no); }));
  b.dep(after);
  const std::int64_t n = mine(c_.opt.rank);
  cp.mem_bytes = Bytes{2 * n * c_.b16()};
  cp.copy_op = CopyOp::to_partition;
  cp.copy_kernel = CopyKernel::add;  // dst += (converting where the partition is fp32)
  cp.src_buf = reduced;
  for (const auto& s : ipg_params_) b.slice(s);
  // copy_grads_in_partition runs a copy per parameter of this rank's partition (the CUDA
  // launch queue counts them; the pieces priced are the slices).
  for (const auto& s : ipg_params_) {
    const std::int64_t lo = c_.layout.offset[static_cast<std::size_t>(s.param)] + s.param_offset;
    if (overlap_with_rank(lo, lo + s.count, c_.opt.rank) > 0) ++cp.tensors;
  }
  if (c_.offload_opt) {
    cp.dst = Placement::host;
    cp.mem_bytes = Bytes{n * c_.b16()};   // bytes crossing PCIe, one direction
    cp.dst_buf = c_.states.host_grads;    // accumulated there in fp32, by partition position
    return;
  }
  if (grads_in_partition_ < 0) {
    // (Σ numel of the params overlapping this rank's partition,) accumulation dtype
    grads_in_partition_ = b.buffer(Category::grads, Placement::device, BufferRole::grads_in_partition, c_.accum_dtype(),
                                   grads_in_partition_elements(c_.g, c_.layout, c_.opt.rank),
                                   "grads_in_partition (params overlapping this rank's partition)");
    b.alloc(grads_in_partition_);
  }
  c_.p.events.back().dst_buf = grads_in_partition_;
}

// independent_gradient_partition_epilogue: all_grad_tensors keeps (micro-step 0) or is
// accumulated from (later ones) this micro-step's grads_in_partition, which the epilogue
// then drops; the next micro-step's first reduction allocates a new one.
void ZeroOptimizerLowering::accumulate_partition() {
  if (accumulated_partition_ < 0) {
    accumulated_partition_ = grads_in_partition_;
  } else {
    Builder& b = c_.b;
    b.begin(EventKind::copy, c_.red_stream(), Phase::backward, c_.at.micro, "accumulate_grads_in_partition");
    b.cur().mem_bytes = Bytes{3 * c_.p.buffers[static_cast<std::size_t>(grads_in_partition_)].bytes.v};
    b.cur().copy_op = CopyOp::accumulate;
    b.cur().copy_kernel = CopyKernel::add;
    b.cur().src_buf = grads_in_partition_;
    b.cur().dst_buf = accumulated_partition_;
    b.free(grads_in_partition_);
  }
  grads_in_partition_ = -1;
}

// engine.allreduce_gradients → reduce_gradients at stage 1's boundary: every param, in
// registration order.
void ZeroOptimizerLowering::reduce_at_boundary() {
  boundary_pass_ = true;
  if (hooks_installed()) setup_buckets();
  for (const auto& prm : c_.g.params) {
    if (!grads_.live(prm.id)) continue;
    ipg_add(nullptr, prm.id, true);
  }
  flush_ipg(Trigger::gas_boundary);
  c_.b.begin(EventKind::marker, c_.red_stream(), Phase::reduction, c_.at.micro, "ipg_epilogue");
  c_.b.dep(c_.at.last_reduce);
  release_ipg_buffers();
  boundary_pass_ = false;
}

// End of backward: stage 2 flushes every micro-step; stage 1 reduces at the boundary.
void ZeroOptimizerLowering::end_of_backward() {
  if (c_.stage == 2 || (c_.overlap && c_.at.boundary)) {
    flush_ipg(Trigger::end_of_backward);
    c_.b.begin(EventKind::marker, c_.red_stream(), Phase::backward, c_.at.micro, "ipg_epilogue");
    c_.b.dep(c_.at.last_reduce);
    release_ipg_buffers();
    if (c_.stage == 2 && !c_.at.boundary && grads_in_partition_ >= 0) accumulate_partition();
    return;
  }
  if (c_.stage == 1 && c_.at.boundary) reduce_at_boundary();
}

void ZeroOptimizerLowering::step() {
  Builder& b = c_.b;
  const std::int64_t P = c_.layout.partition;
  // Stage 2 with accumulation holds the earlier micro-steps' partition and the last one's.
  const int partitions = accumulated_partition_ >= 0 && grads_in_partition_ >= 0 && accumulated_partition_ != grads_in_partition_ ? 2 : 1;
  gradient_checks(c_, partitions);
  auto release_partition_grads = [&] {
    if (grads_in_partition_ >= 0) { b.free(grads_in_partition_); grads_in_partition_ = -1; }
    if (accumulated_partition_ >= 0) { b.free(accumulated_partition_); accumulated_partition_ = -1; }
  };
  if (c_.offload_opt) {
    host_step_stage12(c_, P, release_partition_grads);
  } else {
    // Flatten the partition's grads (accumulation dtype) and cast to fp32: transient.
    // The cast is no copy when they are fp32 already.
    const DType gd = c_.accum_dtype();
    Event& fl = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "flatten_partition_grads");
    // Read from each partition buffer, written once; param by param, a copy and then an add
    // per param from the second.
    fl.mem_bytes = Bytes{(partitions + 1) * P * dtype_size(gd)};
    fl.tensors = partitions * partition_tensors(c_);
    if (partitions > 1) fl.copy_kernel = CopyKernel::add;
    fl.copy_op = CopyOp::partition_grads;
    fl.host_bound = true;  // the host has just read the norm back
    fl.src_buf = grads_in_partition_;
    fl.src2_buf = accumulated_partition_;
    BufferId flat16 = -1;
    if (gd != DType::fp32) {
      // (P,) accumulation dtype
      flat16 = b.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, gd, P,
                        fmt::format("flat partition grads ({})", dtype_name(gd)));
      b.alloc(flat16);
      c_.p.events.back().dst_buf = flat16;
      Event& cast = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "cast_partition_grads_fp32");
      cast.mem_bytes = Bytes{P * (dtype_size(gd) + 4)};
      cast.copy_op = CopyOp::cast;
      cast.copy_kernel = CopyKernel::cast;
      cast.src_buf = flat16;
    }
    // (P,) fp32
    const BufferId flat32 = b.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32, P,
                                     "flat partition grads (fp32)");
    b.alloc(flat32);
    c_.p.events.back().dst_buf = flat32;
    if (flat16 >= 0) b.free(flat16);
    release_partition_grads();
    optimizer_event(c_, P, Placement::device, "optimizer", c_.states.master, flat32);
    unscale_pass(c_.p.events.back(), P);
    b.free(flat32);
    Event& cp = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
    cp.mem_bytes = Bytes{P * (4 + c_.b16())};
    params_from_master(c_, cp, 0, P);
  }
  post_step_allgather(c_, P);
}

}  // namespace zp::zero::lowering
