#pragma once
// Stage 0 (no ZeRO). 16-bit training runs FP16_Optimizer (runtime/fp16/fused_optimizer.py),
// for fp16 and bf16 alike: flat 16-bit params, fp32 master and optimizer states, all
// unpartitioned; param.grad accumulates across micro-steps; the gradients are all-reduced
// at the GAS boundary (engine_allreduce.hpp); the step casts them to fp32, updates the
// master and copies it back. Without fp16 or bf16 enabled, the plain optimizer runs on the
// module's params (fp32, or the 16-bit dtype the model was built in: DsConfig::module_dtype).
#include "zero/lower/autograd.hpp"
#include "zero/lower/optimizer.hpp"

namespace zp::zero::lowering {

class FusedOptimizerLowering : public OptimizerLowering {
 public:
  explicit FusedOptimizerLowering(Context& c) : c_(c) {}
  void prologue() override;
  void grad_produced(MicroState& st, models::ParamId p, models::OpId o) override;
  void grad_hook(MicroState&, models::ParamId) override {}
  // fused_optimizer.py step: has_overflow_serial's per-gradient inf/NaN check (an .item()
  // each), the per-param fp32 copies; with fp32 params the torch optimizer alone.
  HostStep host_step() const override {
    return c_.cfg.precision == Precision::fp32 ? HostStep::plain : HostStep::fp16_optimizer;
  }
  std::int32_t host_step_tensors() const override { return static_cast<std::int32_t>(c_.g.params.size()); }
  void end_of_backward() override;
  void step() override;

 private:
  // engine.py _do_optimizer_sanity_check: FP16_Optimizer when fp16 or bf16 is enabled.
  bool mixed() const { return c_.cfg.precision != Precision::fp32; }
  Context& c_;
  AccumulatedGrads grads_;  // param.grad across micro-steps
};

}  // namespace zp::zero::lowering
