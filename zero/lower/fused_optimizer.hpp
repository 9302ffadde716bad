#pragma once
// Stage 0 (no ZeRO). 16-bit training runs FP16_Optimizer (runtime/fp16/fused_optimizer.py),
// for fp16 and bf16 alike: flat 16-bit params, fp32 master and optimizer states, all
// unpartitioned; param.grad accumulates across micro-steps; the gradients are all-reduced
// at the GAS boundary (engine_allreduce.hpp); the step casts them to fp32, updates the
// master and copies it back. fp32 training runs the plain torch optimizer on the params.
#include "zero/lower/autograd.hpp"
#include "zero/lower/optimizer.hpp"

namespace zp::zero::lowering {

class FusedOptimizerLowering : public OptimizerLowering {
 public:
  explicit FusedOptimizerLowering(Context& c) : c_(c) {}
  void prologue() override;
  void grad_produced(MicroState& st, models::ParamId p, models::OpId o) override;
  void grad_hook(MicroState&, models::ParamId) override {}
  void end_of_backward() override;
  void step() override;

 private:
  Context& c_;
  AccumulatedGrads grads_;  // param.grad across micro-steps
};

}  // namespace zp::zero::lowering
