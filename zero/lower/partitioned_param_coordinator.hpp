#pragma once
// Stage 3's parameter fetching (runtime/zero/partitioned_param_coordinator.py): before a
// module runs, its params that are not available are all-gathered; along the module trace
// recorded in earlier steps, params of the modules ahead are prefetched up to
// min(stage3_prefetch_bucket_size, stage3_max_live_parameters - live) elements; after the
// module, its params are released unless persistent, used again within
// stage3_max_reuse_distance elements of the trace, or already passed by the prefetcher for a
// later use. A module visit is a maximal run of consecutive ops of one module.
// hpZ: the forward gather also leaves a secondary partition (1/h of each param) from which
// the backward gathers within the h-rank group.
#include <cstdint>
#include <vector>

#include "zero/lower/context.hpp"

namespace zp::zero::lowering {

class ParamCoordinator {
 public:
  explicit ParamCoordinator(Context& c);

  // Whether params are gathered at all: a partition world of one gathers nothing
  // (partition_parameters.py all_gather_coalesced → _no_gather_coalesced: param.data is
  // pointed at its partition, ds_tensor), unless the partitions live on the host
  // (offload_param: then each is copied in, as a gather).
  bool gathers() const { return gathers_; }
  // Persistent params (numel <= stage3_param_persistence_threshold, while the total stays
  // within stage3_model_persistence_threshold) are kept whole on every rank; with nothing
  // gathered there are none beside the partitions.
  bool persistent(models::ParamId p) const { return persistent_[static_cast<std::size_t>(p)] != 0; }
  std::int64_t persistent_elements() const { return persistent_total_; }

  // The module trace of one micro-step (call once the persistent buffers exist).
  void build_trace();
  // A new forward/backward pass along the trace.
  void begin_pass();
  // Before op o's event: fetch the visit it starts, and prefetch.
  void before_op(models::OpId o, Phase ph);
  // Op o's event (open) waits for the gathers of its params.
  void wait_for_params(models::OpId o);
  // After op o: release the params of the visit it ends.
  void after_op(models::OpId o, Phase ph);
  // End of the backward: anything still gathered is released.
  void end_pass();
  // The step: hpZ secondary partitions are dropped.
  void release_secondary_partitions();

 private:
  struct Visit {
    models::OpId first = -1, last = -1;
    std::vector<models::ParamId> params;
    std::int64_t numel = 0;
  };
  struct TraceStep {
    std::int32_t visit;
    Phase phase;
  };
  struct ParamUse {
    std::int32_t step;
    models::ParamId param;
  };

  void build_visits();
  bool available(models::ParamId p) const;
  std::string module_name(const Visit& v) const;
  // Gather `params` into full tensors; `key` names the gather within a micro-step (visit
  // or prefetch) so its labels are formatted once. Returns the last event.
  template <class What>
  EventId gather(const std::vector<models::ParamId>& params, Trigger why, Phase ph, std::int64_t key, What&& what);
  void prefetch(Phase ph);
  // The params of the visit at trace step t to release now.
  std::vector<models::ParamId> to_release(std::size_t t) const;

  Context& c_;
  bool gathers_ = true;
  std::vector<char> persistent_;            // per param
  std::int64_t persistent_total_ = 0;
  std::vector<Visit> visits_;               // in forward order
  std::vector<std::int32_t> visit_of_first_op_, visit_of_last_op_;
  std::vector<TraceStep> trace_;            // forward visits, then backward (with recomputation)
  std::vector<ParamUse> param_trace_;       // the params of each trace step, flattened
  std::vector<std::int64_t> trace_prefix_;  // numel before each trace step
  std::vector<std::size_t> trace_param_begin_;
  std::vector<std::int32_t> next_use_;      // per param use: the trace step of the param's next use
  std::size_t trace_pos_ = 0, param_q_ = 0; // where the pass and the prefetcher stand
  std::vector<BufferId> full_;              // per param: its gathered full buffer, -1 none
  std::vector<BufferId> secondary_;         // hpZ, per param: its secondary partition
  std::vector<EventId> inflight_from_;      // per param: the gather its users wait for
  std::vector<std::int32_t> fetched_for_;   // per param: the trace step the prefetcher passed it for
  std::vector<std::int32_t> full_label_;    // per param: "full <name>"
  std::int64_t live_ = 0;                   // gathered elements
  int gather_seq_ = 0, prefetch_seq_ = 0;   // within the micro-step
};

}  // namespace zp::zero::lowering
