#pragma once
// DeepSpeed's learning-rate schedulers (deepspeed/runtime/lr_schedules.py) as the executor
// applies them: the `scheduler` section of a ds_config, read strictly (the simulator
// accepts the section as it is, since it changes neither memory nor communication).
//
// DeepSpeed steps the scheduler after every optimizer step whose update was applied
// (an fp16 overflow skips both). Its iteration counter starts at -1, and the constructor
// sets the initial rate from get_lr() at -1; so the k-th applied update (k = 0, 1, ...)
// runs with get_lr(k - 1).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "zero/ds_config.hpp"

namespace zp::exec {

struct LrSchedule {
  enum class Type { constant, warmup, warmup_decay, warmup_cosine, one_cycle, lr_range_test };
  Type type = Type::constant;
  double base_lr = 1e-3;             // the optimizer's lr (constant; WarmupCosineLR's org_lr)
  double min_lr = 0.0, max_lr = 1e-3;// WarmupLR, WarmupDecayLR
  std::int64_t warmup_num_steps = 1000;  // DeepSpeed clamps it to >= 2
  bool linear = false;               // warmup_type "linear" (default "log")
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0, cos_min_ratio = 1e-4;  // WarmupCosineLR
  // OneCycle: the learning rate rises from cycle_min_lr to cycle_max_lr over the first
  // step size and falls back over the second (staircase when a stair count is set), then
  // decays; Adam's beta1 cycles inversely between cycle_max_mom and cycle_min_mom, and its
  // beta2 is set to 0.99 (DeepSpeed builds the betas as (momentum, 0.99)). The constructor
  // sets (cycle_min_lr, (cycle_min_mom, 0.99)), not the cycle's value at -1.
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0, decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000, cycle_second_step_size = 2000;
  std::int64_t cycle_first_stair_count = 0, cycle_second_stair_count = 0;
  double decay_step_size = 0;
  bool cycle_momentum = true;        // only for optimizers with betas (Adam, AdamW)
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0.0;
  // LRRangeTest: lr_range_test_min_lr · (1 + step_rate · (it + 1) / step_size), floored
  // to whole step sizes with the staircase.
  double range_min_lr = 1e-3, range_step_rate = 1.0;
  std::int64_t range_step_size = 2000;
  bool range_staircase = false;

  // DeepSpeed's get_lr() at iteration `it` (>= -1).
  double get_lr(std::int64_t it) const;
  // The rate of the update that follows `applied` applied updates.
  double lr_for(std::int64_t applied) const { return get_lr(applied - 1); }
  // OneCycle with cycle_momentum: the Adam betas at iteration `it` (DeepSpeed's get_mom()),
  // else none (the optimizer's own).
  std::optional<std::pair<double, double>> get_betas(std::int64_t it) const;
  std::optional<std::pair<double, double>> betas_for(std::int64_t applied) const { return get_betas(applied - 1); }

 private:
  double one_cycle_scale(std::int64_t it) const;
};

// The schedule of `cfg` (no `scheduler` section: the optimizer's constant lr). Unknown
// types or params, "auto" values and out-of-range values → InputError naming the key and
// what is allowed.
LrSchedule parse_lr_schedule(const zero::DsConfig& cfg);

}  // namespace zp::exec
