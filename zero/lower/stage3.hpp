#pragma once
// Stage 3: DeepSpeedZeroOptimizer_Stage3 (runtime/zero/stage3.py). Each rank keeps the
// 16-bit partition of every param (ceil(numel/N) elements each), the persistent params
// whole, the fp32 master and optimizer states of its partition, a flat gradient partition
// and one reduce bucket allocated once. Params are fetched around each module by the
// coordinator (partitioned_param_coordinator.hpp). Each gradient hook copies the gradient
// into the bucket; a bucket that cannot take the next one is reduce-scattered (an
// interleaved copy per destination rank) and this rank's block accumulated into the
// partition. The step runs per sub-group of whole params, then refreshes the persistent
// params with one all-gather.
#include <vector>

#include "zero/lower/optimizer.hpp"
#include "zero/lower/partitioned_param_coordinator.hpp"

namespace zp::zero::lowering {

class Stage3Lowering : public OptimizerLowering {
 public:
  explicit Stage3Lowering(Context& c) : c_(c), coord_(c) {}
  void prologue() override;
  void begin_micro_step() override { coord_.begin_pass(); }
  // The submodule's fetch and release hooks, and DeepSpeed's own autograd function where the
  // op is an nn.Linear (F.linear replaced unless memory_efficient_linear is off; GPT-2's Conv1D
  // calls addmm itself).
  void before_op(models::OpId o, Phase ph) override;
  void op_issued(models::OpId o) override { coord_.wait_for_params(o); }
  // nn.Linear on a 3-D input with a bias: the bias added by a kernel of its own
  // (Event::unfused_bias; a 2-D input goes through addmm, fused), unless the config's
  // memory_efficient_linear is off (DeepSpeed then leaves F.linear as it is).
  void forward_compute(Event& e, const models::Op& op) override;
  void after_op(models::OpId o, Phase ph) override { coord_.after_op(o, ph); }
  void grad_produced(MicroState& st, models::ParamId p, models::OpId o) override;
  void grad_hook(MicroState& st, models::ParamId p) override;
  HostStep host_step() const override { return HostStep::zero3_optimizer; }
  std::int32_t host_step_tensors() const override { return static_cast<std::int32_t>(c_.g.params.size()); }
  void end_of_backward() override;
  void step() override;

 private:
  void flush(Trigger why);
  // stage3.py _create_fp16_sub_groups: the sizes of the sub-groups.
  std::vector<std::int64_t> sub_groups() const;
  void device_step_subgroup(std::int64_t gi, std::int64_t offset, std::int64_t n);
  void persistent_allgather();
  void overflow_scan();

  Context& c_;
  ParamCoordinator coord_;
  BufferId grad_partition_ = -1, bucket_ = -1;
  std::int64_t elements_ = 0;            // in the bucket
  std::vector<BucketSlice> params_;      // the bucket's slices
  std::vector<BufferId> loose_;          // gradients reduced from their own storage
  EventId last_reduce_ = -1;             // the reduction that last read the bucket
};

}  // namespace zp::zero::lowering
