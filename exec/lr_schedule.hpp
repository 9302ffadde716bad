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
#include <string>

#include "zero/ds_config.hpp"

namespace zp::exec {

struct LrSchedule {
  enum class Type { constant, warmup, warmup_decay, warmup_cosine };
  Type type = Type::constant;
  double base_lr = 1e-3;             // the optimizer's lr (constant; WarmupCosineLR's org_lr)
  double min_lr = 0.0, max_lr = 1e-3;// WarmupLR, WarmupDecayLR
  std::int64_t warmup_num_steps = 1000;  // DeepSpeed clamps it to >= 2
  bool linear = false;               // warmup_type "linear" (default "log")
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0, cos_min_ratio = 1e-4;  // WarmupCosineLR

  // DeepSpeed's get_lr() at iteration `it` (>= -1).
  double get_lr(std::int64_t it) const;
  // The rate of the update that follows `applied` applied updates.
  double lr_for(std::int64_t applied) const { return get_lr(applied - 1); }
};

// The schedule of `cfg` (no `scheduler` section: the optimizer's constant lr). Unknown
// types or params, "auto" values and the schedulers the executor does not run (OneCycle,
// LRRangeTest) → InputError naming the key and what is allowed.
LrSchedule parse_lr_schedule(const zero::DsConfig& cfg);

}  // namespace zp::exec
