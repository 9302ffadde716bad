#include "zero/lower/bf16_optimizer.hpp"

#include <fmt/format.h>

#include "zero/lower/engine_allreduce.hpp"
#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

void Bf16OptimizerLowering::prologue() {
  const std::int64_t flat = c_.layout.padded;  // Ψ' = roundup(Ψ, 2N)
  // (Ψ',) bf16
  c_.states.params = c_.persistent(Category::params, Placement::device, BufferRole::flat_params16, c_.md, flat,
                                   fmt::format("params{} (flat, {} elements)", dtype_name(c_.md), flat));
  // (Ψ',) fp32 gradients of every param; (Ψ'/N,) fp32 master partition and its states
  c_.states.grads32 = c_.persistent(Category::grads, Placement::device, BufferRole::flat_grads32, DType::fp32, flat,
                                    "fp32 grad accumulation buffer");
  c_.states.master = c_.persistent(Category::master_params, Placement::device, BufferRole::master_partition,
                                   DType::fp32, c_.layout.partition, "master fp32 partition", 0);
  c_.optimizer_states(c_.layout.partition, "optimizer states (partition)", 0);
}

// Autograd's gradient is transient: the hook accumulates it into the fp32 buffer.
void Bf16OptimizerLowering::grad_produced(MicroState& st, models::ParamId p, models::OpId) { own_grad(c_, st, p); }

void Bf16OptimizerLowering::grad_hook(MicroState& st, models::ParamId p) {
  Builder& b = c_.b;
  c_.host_hook(Phase::backward);
  auto& pg = st.param_grad[static_cast<std::size_t>(p)];
  Event& e = b.begin(EventKind::copy, Stream::compute, Phase::backward, c_.at.micro,
                     b.cached(LabelKind::accumulate_fp32, p, [&] { return fmt::format("accumulate_fp32.{}", c_.pname(p)); }));
  e.mem_bytes = Bytes{c_.numel(p) * (c_.b16() + 8)};
  e.copy_op = CopyOp::grad_accumulate;
  e.copy_kernel = CopyKernel::add;
  e.src_buf = pg;
  e.dst_buf = c_.states.grads32;
  b.slice({p, 0, c_.numel(p), c_.layout.offset[static_cast<std::size_t>(p)]});
  c_.launched(b.cur_id());
  b.free(pg);
  pg = -1;
}

void Bf16OptimizerLowering::end_of_backward() {
  if (c_.at.boundary) buffered_allreduce(c_, c_.states.grads32);
}

// bf16_optimizer.py step: the norm of the (all-reduced, full) fp32 gradients, the update of
// this rank's fp32 partition, update_lp_params (the partition cast into the flat 16-bit
// params, then all-gathered), clear_hp_grads.
void Bf16OptimizerLowering::step() {
  Builder& b = c_.b;
  const std::int64_t P = c_.layout.partition;
  optimizer_event(c_, P, Placement::device, "optimizer", c_.states.master, c_.states.grads32);
  // The norm of the full fp32 gradient buffer, inside step().
  c_.p.events.back().reduce_bytes = c_.p.buffers[static_cast<std::size_t>(c_.states.grads32)].bytes;
  c_.p.events.back().tensors = 1;
  Event& cp = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
  cp.mem_bytes = Bytes{P * (4 + c_.b16())};
  params_from_master(c_, cp, 0, P);
  post_step_allgather(c_, P);
  b.begin(EventKind::marker, Stream::compute, Phase::step, -1, "zero_grad");
}

}  // namespace zp::zero::lowering
