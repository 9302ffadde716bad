#pragma once
// The optimizer wrapper DeepSpeed chose (engine.py _configure_optimizer), as the lowering
// sees it: the persistent model states it holds, what it does when autograd produces a
// gradient and when a param's gradient is complete (its hook), how it reduces at the end
// of a backward, and its step. Stage 3's wrapper also fetches params around each op.
// The forward/backward walk (walk.hpp) calls these hooks in issue order.
#include <memory>

#include "zero/lower/autograd.hpp"
#include "zero/lower/context.hpp"

namespace zp::zero::lowering {

class OptimizerLowering {
 public:
  virtual ~OptimizerLowering() = default;
  // The persistent model states (prologue events).
  virtual void prologue() = 0;
  // The micro-step's batch is in; its forward is about to start.
  virtual void begin_micro_step() {}
  // Around each op of the walk (forward, recomputation, backward): before its event is
  // issued, once it is issued (open: it may add dependencies), after its buffers are done.
  virtual void before_op(models::OpId, Phase) {}
  virtual void op_issued(models::OpId) {}
  // A forward or recomputed op's compute event, while it is the newest event: what the wrapper
  // changes about how the op runs (stage 3's linear function).
  virtual void forward_compute(Event&, const models::Op&) {}
  virtual void after_op(models::OpId, Phase) {}
  // Autograd writes param p's gradient at op o's backward (several times when the param is
  // read by several ops).
  virtual void grad_produced(MicroState& st, models::ParamId p, models::OpId o) = 0;
  // Param p's gradient is complete: DeepSpeed's gradient hook.
  virtual void grad_hook(MicroState& st, models::ParamId p) = 0;
  // The backward is done: the reduction epilogue.
  virtual void end_of_backward() = 0;
  // The optimizer step after the last micro-step.
  virtual void step() = 0;
  // The host loop of that step (HostWork::step) and the parameter tensors it visits.
  virtual HostStep host_step() const = 0;
  virtual std::int32_t host_step_tensors() const = 0;
};

// FP16_Optimizer (stage 0), BF16_Optimizer, DeepSpeedZeroOptimizer (stages 1/2) or
// DeepSpeedZeroOptimizer_Stage3, as engine.py picks it for `c.cfg`.
std::unique_ptr<OptimizerLowering> make_optimizer(Context& c);

}  // namespace zp::zero::lowering
