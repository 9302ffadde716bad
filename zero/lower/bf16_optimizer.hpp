#pragma once
// BF16_Optimizer (runtime/bf16_optimizer.py), which engine.py runs for stage 1 with bf16
// and fp32 gradient accumulation (no CPU offload): flat 16-bit params and a flat fp32
// gradient buffer, both padded to 2N as ZeRO-1/2 pad; fp32 master and optimizer states of
// this rank's partition. Each gradient hook adds the param's gradient into the fp32 buffer
// and drops it; the boundary all-reduces the buffer (engine_allreduce.hpp); the step
// updates the partition, casts it into the 16-bit params and all-gathers them.
#include "zero/lower/optimizer.hpp"

namespace zp::zero::lowering {

class Bf16OptimizerLowering : public OptimizerLowering {
 public:
  explicit Bf16OptimizerLowering(Context& c) : c_(c) {}
  void prologue() override;
  void grad_produced(MicroState& st, models::ParamId p, models::OpId o) override;
  void grad_hook(MicroState& st, models::ParamId p) override;
  HostStep host_step() const override { return HostStep::bf16_optimizer; }
  std::int32_t host_step_tensors() const override { return static_cast<std::int32_t>(c_.g.params.size()); }
  void end_of_backward() override;
  void step() override;

 private:
  Context& c_;
};

}  // namespace zp::zero::lowering
