#include "zero/lower/engine_allreduce.hpp"

#include <fmt/format.h>

#include <vector>

namespace zp::zero::lowering {

using models::ParamId;

void buffered_allreduce(Context& c, BufferId flat_grads32) {
  constexpr std::int64_t kBucket = 500000000;  // engine.py MEMORY_OPT_ALLREDUCE_SIZE
  const bool from_flat = flat_grads32 >= 0;
  const DType gd = from_flat ? DType::fp32 : c.md;
  Builder& b = c.b;
  const int m = c.at.micro;
  std::vector<ParamId> cur;
  std::int64_t cur_n = 0;
  int bucket_no = 0;
  // Where param p's gradient sits in the flat fp32 buffer (-1: its own gradient).
  auto grad_at = [&](ParamId p) { return from_flat ? c.layout.offset[static_cast<std::size_t>(p)] : std::int64_t{-1}; };
  auto flush = [&]() {
    if (cur.empty()) return;
    const int bn = bucket_no++;
    // host work: the flatten, the all-reduce launch, the copy back.
    Event& fl = b.begin(EventKind::copy, Stream::compute, Phase::reduction, m, fmt::format("flatten.bucket{}", bn));
    fl.mem_bytes = Bytes{2 * cur_n * dtype_size(gd)};
    // (Σ numel of the bucket's params,) gradient dtype
    const BufferId flat = b.buffer(Category::comm_buffers, Placement::device, BufferRole::comm_staging, gd, cur_n,
                                   fmt::format("flatten bucket{}", bn), bn);
    b.alloc(flat);
    fl.copy_op = CopyOp::flatten;
    fl.dst_buf = flat;
    fl.src_buf = from_flat ? flat_grads32 : -1;
    for (ParamId p : cur) b.slice({p, 0, c.numel(p), grad_at(p)});
    c.collective(Stream::compute, Phase::reduction, m, b.label(fmt::format("all_reduce.bucket{}", bn)),
                 CollKind::all_reduce, ReduceOp::avg, Trigger::gas_boundary, c.dp_group, cur_n,
                 c.cfg.communication_data_type_override.value_or(gd), bn);
    b.cur().dst_buf = flat;
    for (ParamId p : cur) b.slice({p, 0, c.numel(p), -1});
    Event& back = b.begin(EventKind::copy, Stream::compute, Phase::reduction, m, fmt::format("unflatten.bucket{}", bn));
    back.mem_bytes = Bytes{2 * cur_n * dtype_size(gd)};
    back.copy_op = CopyOp::unflatten_grads;
    back.src_buf = flat;
    back.dst_buf = from_flat ? flat_grads32 : -1;
    for (ParamId p : cur) b.slice({p, 0, c.numel(p), grad_at(p)});
    b.free(flat);
    // What the step reads, and the first read-back of its host loop waits for.
    c.at.last_reduce = back.id;
    cur.clear();
    cur_n = 0;
  };
  for (const auto& prm : c.g.params) {
    if (cur_n + prm.numel > kBucket) flush();
    cur.push_back(prm.id);
    cur_n += prm.numel;
  }
  flush();
}

}  // namespace zp::zero::lowering
