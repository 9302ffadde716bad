#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

namespace {
void scalar_allreduce(Context& c, Trigger t, ReduceOp op, const char* name) {
  c.collective(Stream::compute, Phase::step, -1, c.b.label(name), CollKind::all_reduce, op, t, c.dp_group, 1,
               DType::fp32, -1);
}
}  // namespace

void gradient_checks(Context& c) {
  if (c.md == DType::fp16) scalar_allreduce(c, Trigger::overflow_check, ReduceOp::max, "overflow_check");
  scalar_allreduce(c, Trigger::grad_norm, ReduceOp::sum, "grad_norm");
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
}

void params_from_master(Context& c, Event& e, std::int64_t offset, std::int64_t n) {
  e.copy_op = CopyOp::master_to_params;
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
}

}  // namespace zp::zero::lowering
