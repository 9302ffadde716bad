#pragma once
// Stages 1 and 2: DeepSpeedZeroOptimizer (runtime/zero/stage_1_and_2.py). Flat 16-bit params
// padded to 2N, fp32 master and optimizer states of this rank's partition. Gradient hooks
// (installed with partitioned gradients, overlap_comm or contiguous_gradients) copy each
// gradient into the "ipg" bucket (reduce_bucket_size elements, a second one under
// overlap_comm); a bucket that cannot take the next gradient is reduced, and this rank's
// slices are copied into grads_in_partition. Stage 2 reduces in every backward; stage 1
// keeps param.grad and reduces once, at the GAS boundary. The step flattens the partition's
// gradients to fp32, updates the partition and all-gathers the 16-bit params.
#include <vector>

#include "zero/lower/autograd.hpp"
#include "zero/lower/optimizer.hpp"

namespace zp::zero::lowering {

class ZeroOptimizerLowering : public OptimizerLowering {
 public:
  explicit ZeroOptimizerLowering(Context& c) : c_(c) {}
  void prologue() override;
  void grad_produced(MicroState& st, models::ParamId p, models::OpId o) override;
  void grad_hook(MicroState& st, models::ParamId p) override;
  HostStep host_step() const override { return HostStep::zero_optimizer; }
  // stage_1_and_2.py step: has_overflow_partitioned_grads_serial (fp16; bf16 unless its
  // check_grad_overflow is off) and get_grad_norm_direct (always: an fp32 run's kernel profile
  // has its fp64 cast and norm per gradient) loop over the gradients. One per-tensor host cost,
  // fitted with both loops, shared between them as their launches are (Context::host_step).
  std::int32_t host_step_tensors() const override { return static_cast<std::int32_t>(c_.g.params.size()); }
  void end_of_backward() override;
  void step() override;

 private:
  bool hooks_installed() const;
  void setup_buckets();
  void release_ipg_buffers();
  void ipg_add(MicroState* st, models::ParamId p, bool at_boundary_pass);
  BufferId take_grad(MicroState* st, models::ParamId p);
  void flush_ipg(Trigger why);
  // The reduction of the bucket's slices, by one all-reduce or one reduce per owner rank;
  // returns the last collective.
  EventId reduce_bucket(Stream rs, Phase ph, int bucket_no, Trigger why, std::int64_t elements, BufferId reduced);
  void copy_to_partition(Stream rs, Phase ph, int bucket_no, EventId after, BufferId reduced);
  void accumulate_partition();
  void reduce_at_boundary();
  // Elements of [lo, hi) of the flat buffer that land in rank r's partition.
  std::int64_t overlap_with_rank(std::int64_t lo, std::int64_t hi, int r) const;
  std::int64_t mine(int r) const;  // Σ over the bucket's slices of overlap_with_rank
  // average_tensor's rank_and_offsets: the bucket's slices split at partition boundaries,
  // consecutive pieces bound for the same rank merged; how many there are.
  int merged_slices() const;

  Context& c_;
  AccumulatedGrads grads_;                    // stage 1: param.grad until the boundary
  // the ipg buckets
  bool ipg_ready_ = false;
  BufferId ipg_buf_[2] = {-1, -1};
  int ipg_index_ = 0;                         // the bucket being filled
  std::int64_t ipg_elements_ = 0;
  std::vector<BucketSlice> ipg_params_;       // the slices in the bucket being filled
  std::vector<BufferId> ipg_loose_grads_;     // contiguous_gradients false: grads reduced from their storage
  std::vector<BufferId> ipg_large_grads_;     // a grad larger than the bucket, reduced on its own
  EventId ipg_last_reduce_[2] = {-1, -1};     // per bucket buffer, the reduction that last read it
  bool boundary_pass_ = false;                // stage 1: the reduction pass after the last backward
  BufferId grads_in_partition_ = -1;
  BufferId accumulated_partition_ = -1;       // stage 2: all_grad_tensors across micro-steps
};

}  // namespace zp::zero::lowering
