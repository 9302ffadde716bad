#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

namespace {
// What the local reduction before the scalar all-reduce reads: this rank's gradients, stage 3's
// flat partition (one tensor) or the stage 1/2 gradients of the params overlapping its
// partition (one tensor each); nothing on the device when the optimizer is offloaded.
struct LocalRead {
  std::int64_t bytes = 0;
  std::int32_t tensors = 0;
};
LocalRead local_read(const Context& c, int partitions) {
  if (c.offload_opt) return {};
  const std::int64_t dt = dtype_size(c.accum_dtype());
  if (c.stage == 3) return {stage3_partition_elements(c.g, c.N) * dt, 1};
  return {partitions * grads_in_partition_elements(c.g, c.layout, c.opt.rank) * dt, partitions * partition_tensors(c)};
}

void scalar_allreduce(Context& c, Trigger t, ReduceOp op, const char* name, int partitions) {
  Event& e = c.collective(Stream::compute, Phase::step, -1, c.b.label(name), CollKind::all_reduce, op, t, c.dp_group,
                          1, DType::fp32, -1);
  const LocalRead r = local_read(c, partitions);
  e.mem_bytes = Bytes{r.bytes};
  e.tensors = r.tensors;
  c.b.dep(c.at.last_reduce);  // it reads the reduced gradients (on the reduction stream under overlap_comm)
  c.at.last_check = e.id;
}
}  // namespace

std::int32_t partition_tensors(const Context& c) {
  std::int32_t n = 0;
  for (const std::int64_t off : grads_in_partition_offsets(c.g, c.layout, c.opt.rank)) n += off >= 0 ? 1 : 0;
  return n;
}

void gradient_checks(Context& c, int partitions) {
  if (c.md == DType::fp16) scalar_allreduce(c, Trigger::overflow_check, ReduceOp::max, "overflow_check", partitions);
  scalar_allreduce(c, Trigger::grad_norm, ReduceOp::sum, "grad_norm", partitions);
}

void optimizer_event(Context& c, std::int64_t elements, Placement where, const std::string& name, BufferId dst,
                     BufferId grads, std::int64_t offset) {
  Event& e = c.b.begin(EventKind::optimizer, where == Placement::host ? Stream::host : Stream::compute, Phase::step, -1,
                       name);
  e.dst_buf = dst;
  e.src_buf = grads;
  e.src2_buf = c.states.states;
  e.src3_buf = c.states.states2;
  e.offset = offset;
  e.elements = elements;
  const std::int64_t k = c.cfg.optimizer.state_bytes_per_param();
  // Adam: ~12 FLOPs per element; reads/writes master, grad and states.
  e.flops = Flops{12.0 * static_cast<double>(elements)};
  e.mem_bytes = Bytes{elements * (2 * 4 + 4 + 2 * k)};
  e.src = e.dst = where;
  c.b.dep(c.at.last_reduce);
  // The update clips and unscales with the norm (and skips on an overflow): on the host it
  // runs after the host read them back; on the device's compute stream the order is implied.
  c.b.dep(c.at.last_check);
}

void params_from_master(Context& c, Event& e, std::int64_t offset, std::int64_t n) {
  c.at.last_update = e.id;
  e.copy_op = CopyOp::master_to_params;
  if (c.md != DType::fp32) e.copy_kernel = CopyKernel::cast;
  e.src_buf = c.states.master;
  e.dst_buf = c.states.params;
  e.offset = offset;
  e.elements = n;
}

void post_step_allgather(Context& c, std::int64_t P) {
  if (c.N <= 1) return;
  c.collective(Stream::compute, Phase::post_step, -1, c.b.label("all_gather.params"), CollKind::all_gather,
               ReduceOp::none, Trigger::post_step, c.dp_group, P * c.N, c.md, 0);
  c.b.cur().dst_buf = c.states.params;
  c.b.dep(c.at.last_update);  // the updated partition (from the host when offloaded)
}

}  // namespace zp::zero::lowering
