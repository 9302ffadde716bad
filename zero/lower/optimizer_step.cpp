#include "zero/lower/optimizer_step.hpp"

#include <algorithm>

namespace zp::zero::lowering {

namespace {
// What the local reduction before the scalar all-reduce reads, as zeroplan's executor reads it:
// this rank's gradients, stage 3's flat partition (one tensor) or the stage 1/2 gradients of
// the params overlapping its partition (one tensor each, in `partitions` buffers: 2 at stage 2
// with accumulation, the accumulated micro-steps and the last one); nothing on the device when
// the optimizer is offloaded. DeepSpeed visits one list of gradients (averaged_gradients; its
// step's GPU time measured the same with 1 and 4 micro-steps), at stage 3 the partition's view
// of each param: `elements` in `views` tensors.
struct LocalRead {
  std::int64_t bytes = 0;
  std::int32_t tensors = 0;
  std::int64_t elements = 0;
  std::int32_t views = 0;
};
LocalRead local_read(const Context& c, int partitions) {
  if (c.offload_opt) return {};
  const std::int64_t dt = dtype_size(c.accum_dtype());
  if (c.stage == 3) {
    const std::int64_t n = stage3_partition_elements(c.g, c.N);
    return {n * dt, 1, n, static_cast<std::int32_t>(c.g.params.size())};
  }
  const std::int64_t n = grads_in_partition_elements(c.g, c.layout, c.opt.rank);
  const std::int32_t t = partition_tensors(c);
  return {partitions * n * dt, partitions * t, n, t};
}

// DeepSpeed's `kernels` and `bytes` for a check (Event::loop_kernels, loop_bytes): what the local
// reduction of zeroplan's executor does not already price (a kernel per tensor it counts, and its
// bytes). Where the executor reads more (two partition buffers), nothing is taken off: never
// negative.
void beyond_local_reduction(Event& e, const LocalRead& r, std::int64_t kernels, std::int64_t bytes) {
  e.loop_kernels = static_cast<std::int32_t>(std::max<std::int64_t>(0, kernels - r.tensors));
  e.loop_bytes = Bytes{std::max<std::int64_t>(0, bytes - r.bytes)};
}

Event& scalar_allreduce(Context& c, Trigger t, ReduceOp op, const char* name, const LocalRead& r) {
  Event& e = c.collective(Stream::compute, Phase::step, -1, c.b.label(name), CollKind::all_reduce, op, t, c.dp_group,
                          1, DType::fp32, -1);
  e.mem_bytes = Bytes{r.bytes};
  e.tensors = r.tensors;
  c.b.dep(c.at.last_reduce);  // it reads the reduced gradients (on the reduction stream under overlap_comm)
  c.at.last_check = e.id;
  return e;
}
}  // namespace

std::int32_t partition_tensors(const Context& c) {
  std::int32_t n = 0;
  for (const std::int64_t off : grads_in_partition_offsets(c.g, c.layout, c.opt.rank)) n += off >= 0 ? 1 : 0;
  return n;
}

void gradient_checks(Context& c, int partitions) {
  const LocalRead r = local_read(c, partitions);
  const std::int64_t dt = dtype_size(c.accum_dtype());
  if (c.checks_overflow()) {
    Event& e = scalar_allreduce(c, Trigger::overflow_check, ReduceOp::max, "overflow_check", r);
    if (c.stage < 3) {
      // has_overflow_partitioned_grads_serial: has_inf_or_nan per gradient (amax and amin each
      // read it; each isfinite is abs, two compares and a product on the scalar; logical_and,
      // logical_not) and the add into the count: 13 kernels and two reads per gradient, beyond
      // what the local reduction prices (a kernel per tensor and a read of each buffer it counts).
      beyond_local_reduction(e, r, kOverflowKernelsPerGradient * static_cast<std::int64_t>(r.views), 2 * r.elements * dt);
    }
    c.at.overflow_check = e.id;
    c.host_step_after_check(e.id);
  }
  Event& e = scalar_allreduce(c, Trigger::grad_norm, ReduceOp::sum, "grad_norm", r);
  // get_grad_norm_direct: per gradient (stage 3: per param's view of the partition) a cast to
  // fp64 (get_norm_dtype) and the norm of that copy: 2 kernels, a read and an fp64 write and
  // read, beyond what the local reduction prices.
  beyond_local_reduction(e, r, kNormKernelsPerGradient * static_cast<std::int64_t>(r.views), r.elements * (dt + 2 * 8));
  c.host_step_rest();
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

void unscale_pass(Event& e, std::int64_t elements) {
  e.loop_kernels += 1;
  e.loop_bytes = Bytes{e.loop_bytes.v + elements * 2 * 4};
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
