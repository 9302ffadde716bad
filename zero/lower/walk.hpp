#pragma once
// The forward and backward walk of one micro-step, as autograd runs it: the batch is
// loaded, each op's outputs allocated in forward order and freed after their last use
// unless an op saves them; backward in reverse, each op allocating its inputs' gradients
// and freeing what it consumed; per-layer activation checkpointing keeps each layer's tensor
// arguments and recomputes the layer before its backward (torch.utils.checkpoint). The
// optimizer wrapper's hooks are called where DeepSpeed's run (optimizer.hpp).
#include <vector>

#include "zero/lower/autograd.hpp"
#include "zero/lower/context.hpp"
#include "zero/lower/optimizer.hpp"

namespace zp::zero::lowering {

class Walk {
 public:
  Walk(Context& c, OptimizerLowering& optimizer);
  // Micro-step m: batch, forward, backward, the optimizer's reduction epilogue, the batch
  // freed.
  void micro_step(int m);

 private:
  void load_batch(MicroState& st);
  void forward(MicroState& st);
  void backward(MicroState& st);
  // Forward of op o (or its recomputation): allocate its outputs, free what is dead.
  void forward_op(MicroState& st, models::OpId o, Phase ph, bool recomputing);
  void backward_op(MicroState& st, models::OpId o);
  void recompute_layer(MicroState& st, std::int32_t layer);
  void release_checkpoint(MicroState& st, std::int32_t layer);
  void release_tensor(MicroState& st, models::TensorId t);
  // Whether tensor t is dead after op o (its last forward use) in this pass.
  bool dead_after(models::TensorId t, models::OpId o, bool recomputing) const;
  bool in_ckpt_layer(models::OpId o) const;
  bool is_ckpt_input(models::TensorId t) const;
  bool kept_for_backward(models::TensorId t, bool recomputing) const;
  // The caller drops the model's output after the forward (unless LowerOptions::keep_output):
  // what it referenced and no op saved goes.
  void drop_output(MicroState& st);
  bool held_by_output(models::TensorId t) const { return t >= 0 && held_[static_cast<std::size_t>(t)] != 0; }
  models::OpId layer_last_op(std::int32_t l) const;

  Context& c_;
  OptimizerLowering& opt_;
  std::vector<char> ckpt_input_;    // per tensor: a checkpointed layer's argument
  std::vector<char> held_;          // per tensor: the model's output references it (OpGraph::outputs)
  std::int32_t recompute_layer_ = -1;
};

}  // namespace zp::zero::lowering
