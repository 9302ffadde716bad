#include "zero/lower/fused_optimizer.hpp"

#include <fmt/format.h>

#include "zero/lower/engine_allreduce.hpp"
#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

void FusedOptimizerLowering::prologue() {
  const std::int64_t psi = c_.layout.params;
  // (Ψ,) model dtype
  c_.states.params = c_.persistent(Category::params, Placement::device, BufferRole::flat_params16, c_.md, psi,
                                   fmt::format("params{} (flat, {} elements)", dtype_name(c_.md), psi));
  if (mixed()) {
    // FP16_Optimizer: (Ψ,) fp32 master copy and the states of Ψ params, unpartitioned.
    c_.states.master = c_.persistent(Category::master_params, Placement::device, BufferRole::master_partition,
                                     DType::fp32, psi, "master fp32 params", 0);
    c_.optimizer_states(psi, "optimizer states", 0);
  } else {
    // The plain optimizer on the module's own params: its states are zeros_like(p).
    c_.optimizer_states(psi, "optimizer states", 0, c_.md);
  }
}

void FusedOptimizerLowering::grad_produced(MicroState&, models::ParamId p, models::OpId o) { grads_.produced(c_, p, o); }

void FusedOptimizerLowering::end_of_backward() {
  if (c_.at.boundary) buffered_allreduce(c_, -1);
}

void FusedOptimizerLowering::step() {
  Builder& b = c_.b;
  const std::int64_t psi = c_.layout.params;
  if (mixed()) {
    // fused_optimizer.py step: a list of per-param fp32 copies of the grads (4Ψ), flattened
    // into one fp32 buffer (4Ψ more), the list dropped; step; copy back to the 16-bit
    // params; zero_grad.
    Event& cast = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "grads_to_fp32");
    cast.mem_bytes = Bytes{psi * (c_.b16() + 4)};
    // (Ψ,) fp32, one tensor per param
    const BufferId list32 = b.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, DType::fp32, psi,
                                     "per-param fp32 grads");
    b.alloc(list32);
    cast.copy_op = CopyOp::flatten;
    cast.dst_buf = list32;
    for (const auto& prm : c_.g.params) b.slice({prm.id, 0, prm.numel, -1});
    Event& fl = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "flatten_grads_fp32");
    fl.mem_bytes = Bytes{psi * 8};
    // (Ψ,) fp32
    const BufferId flat32 = b.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32,
                                     psi, "flat grads (fp32)");
    b.alloc(flat32);
    fl.copy_op = CopyOp::cast;
    fl.src_buf = list32;
    fl.dst_buf = flat32;
    b.free(list32);
    optimizer_event(c_, psi, Placement::device, "optimizer", c_.states.master, flat32);
    b.free(flat32);
    Event& cp = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
    cp.mem_bytes = Bytes{psi * (4 + c_.b16())};
    params_from_master(c_, cp, 0, psi);
  } else {
    optimizer_event(c_, psi, Placement::device, "optimizer", c_.states.params, -1);
  }
  b.begin(EventKind::marker, Stream::compute, Phase::step, -1, "zero_grad");
  grads_.free_all(b);
}

}  // namespace zp::zero::lowering
