#include "zero/lower/fused_optimizer.hpp"

#include <fmt/format.h>

#include "zero/lower/engine_allreduce.hpp"
#include "zero/lower/optimizer_step.hpp"

namespace zp::zero::lowering {

void FusedOptimizerLowering::prologue() {
  const std::int64_t psi = c_.layout.params;
  // fused_optimizer.py __init__ on the model transformers built (and the engine cast):
  // _flatten_dense_tensors([p.clone().detach() for p in group]) clones every param and packs
  // the clones into the flat buffer; the clones go with the list, the module's own tensors
  // when p.data is pointed into the flat buffer. The plain optimizer keeps the module's params.
  std::vector<BufferId> module, clones;
  if (mixed()) {
    module = c_.build_model();
    c_.b.begin(EventKind::marker, Stream::compute, Phase::init, -1, "fp16_groups.clone");
    for (const auto& prm : c_.g.params) {
      // (numel,) model dtype
      clones.push_back(c_.b.buffer(Category::params, Placement::device, BufferRole::init_copy, c_.md, prm.numel,
                                   "clone of " + prm.name, prm.id));
      c_.b.alloc(clones.back());
    }
  }
  // (Ψ,) model dtype
  c_.states.params = c_.persistent(Category::params, Placement::device, BufferRole::flat_params16, c_.md, psi,
                                   fmt::format("params{} (flat, {} elements)", dtype_name(c_.md), psi));
  if (mixed()) {
    c_.free_init(clones, "fp16_groups.drop_clones");
    c_.free_init(module, "fp16_groups.params_to_flat_views");
    // self.fp16_groups_flat[i].clone().float(): a 16-bit clone, then its fp32 copy (the master).
    clones = {c_.init_temp(Category::master_params, c_.md, psi, "fp16_groups_flat.clone")};
  }
  if (mixed()) {
    // FP16_Optimizer: (Ψ,) fp32 master copy and the states of Ψ params, unpartitioned.
    c_.states.master = c_.persistent(Category::master_params, Placement::device, BufferRole::master_partition,
                                     DType::fp32, psi, "master fp32 params", 0);
    c_.free_init(clones, "fp16_groups_flat.drop_clone");
    // initialize_optimizer_states: a zero fp32 gradient, a first optimizer step that creates
    // the states, the gradient dropped.
    const BufferId zeros = c_.init_temp(Category::grads, DType::fp32, psi, "initialize_optimizer_states.zero_grads");
    c_.optimizer_states(psi, "optimizer states", 0);
    c_.free_init({zeros}, "initialize_optimizer_states.drop_grads");
  } else {
    // The plain optimizer on the module's own params: its states are zeros_like(p), created
    // by its first step.
    c_.optimizer_states(psi, "optimizer states", 0, c_.md, true);
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
    // fused_optimizer.py step: a list of per-param fp32 copies of the grads (p.grad.to(fp32),
    // one tensor each: 4Ψ in all), flattened into one fp32 buffer (4Ψ more), the list
    // dropped; step; copy back to the 16-bit params; zero_grad. The per-param copies are the
    // caching allocator's requests; the flatten packs the same values from the grads.
    Event& cast = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "grads_to_fp32");
    cast.mem_bytes = Bytes{psi * (c_.b16() + 4)};
    cast.tensors = static_cast<std::int32_t>(c_.g.params.size());
    cast.copy_op = CopyOp::grads_to_list;
    cast.copy_kernel = CopyKernel::cast;
    cast.loop_kernels = static_cast<std::int32_t>(c_.g.params.size()) - 1;  // a .to() per gradient
    // Before them, inside step(): has_overflow over each 16-bit gradient one by one
    // (has_inf_or_nan: amax and amin read it; each isfinite is abs, two compares and a product
    // on the scalar; logical_and, logical_not; and the host reads the flag back before the
    // next: 13 kernels and copies). DeepSpeed's work alone (zeroplan's executor checks in its
    // update), and the device's while the host issues it (Context::host_step): what comes
    // after waits for the host's loop and its norm.
    cast.loop_kernels += 13 * static_cast<std::int32_t>(c_.g.params.size());
    cast.loop_bytes = Bytes{2 * psi * c_.b16()};
    std::vector<BufferId> list32;
    for (const auto& prm : c_.g.params) {
      // (numel,) fp32
      list32.push_back(b.buffer(Category::temporaries, Placement::device, BufferRole::step_temp, DType::fp32, prm.numel,
                                "fp32 grad " + prm.name, prm.id));
      b.alloc(list32.back());
      b.slice({prm.id, 0, prm.numel, -1});
    }
    if (c_.opt.host_work) b.next_waits_for(c_.at.host);
    Event& fl = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "flatten_grads_fp32");
    fl.mem_bytes = Bytes{psi * 8};
    // (Ψ,) fp32
    const BufferId flat32 = b.buffer(Category::temporaries, Placement::device, BufferRole::flat_grads32, DType::fp32,
                                     psi, "flat grads (fp32)");
    b.alloc(flat32);
    fl.copy_op = CopyOp::flatten_list;
    fl.dst_buf = flat32;
    for (const auto& prm : c_.g.params) b.slice({prm.id, 0, prm.numel, -1});
    for (BufferId id : list32) b.free(id);
    optimizer_event(c_, psi, Placement::device, "optimizer", c_.states.master, flat32);
    unscale_pass(c_.p.events.back(), psi);
    // The update checks for overflow (zeroplan's executor) and takes the norm of the flat fp32
    // gradients first.
    Event& opt = c_.p.events.back();
    opt.checks_overflow = true;
    opt.reduce_bytes = Bytes{psi * 4};
    opt.tensors = 1;
    b.free(flat32);
    Event& cp = b.begin(EventKind::copy, Stream::compute, Phase::step, -1, "master_to_params16");
    cp.mem_bytes = Bytes{psi * (4 + c_.b16())};
    // p.data.copy_(q.data) for each param and its view of the flat master: a cast per param.
    cp.loop_kernels = static_cast<std::int32_t>(c_.g.params.size()) - 1;
    params_from_master(c_, cp, 0, psi);
  } else {
    optimizer_event(c_, psi, Placement::device, "optimizer", c_.states.params, -1);
    // The norm over each parameter's gradient, inside step().
    c_.p.events.back().reduce_bytes = Bytes{psi * dtype_size(c_.md)};
    c_.p.events.back().tensors = static_cast<std::int32_t>(c_.g.params.size());
    // The engine's bookkeeping after the update's launch, beside it; the step ends with both
    // (DeepSpeed's throughput timer synchronises there).
    c_.host_step_rest();
  }
  b.begin(EventKind::marker, Stream::compute, Phase::step, -1, "zero_grad");
  grads_.free_all(b);
}

}  // namespace zp::zero::lowering
