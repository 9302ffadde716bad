// DeepSpeed's learning-rate schedulers as the executor applies them: golden values from
// the formulas of deepspeed/runtime/lr_schedules.py, the off-by-one of its iteration
// counter, and the bad inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "exec/lr_schedule.hpp"
#include "test_util.hpp"
#include "zero/ds_config.hpp"

using namespace zp;

namespace {
exec::LrSchedule schedule(const std::string& text) {
  return exec::parse_lr_schedule(zero::parse_ds_config("cfg.json", nlohmann::json::parse(text)));
}
}  // namespace

TEST_CASE("no scheduler: the optimizer's lr, every step") {
  const auto s = schedule(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.003}}})");
  CHECK(s.lr_for(0) == 0.003);
  CHECK(s.lr_for(1000) == 0.003);
}

TEST_CASE("WarmupLR: log warm-up by default; the first two updates run at warmup_min_lr") {
  const auto s = schedule(R"({"scheduler": {"type": "WarmupLR"}})");  // min 0, max 1e-3, 1000 steps, log
  CHECK(s.lr_for(0) == 0.0);  // the constructor's rate: get_lr(-1) = min
  CHECK(s.lr_for(1) == 0.0);  // after the first scheduler.step(): iteration 0, log(1) = 0
  CHECK(s.lr_for(2) == zp::test::approx(0.001 * std::log(2.0) / std::log(1000.0)).epsilon(1e-15));
  CHECK(s.get_lr(999) == zp::test::approx(0.001).epsilon(1e-15));
  CHECK(s.get_lr(1000) == 0.001);
  CHECK(s.get_lr(5000) == 0.001);
  const auto l = schedule(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1,
      "warmup_max_lr": 1.1, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  CHECK(l.get_lr(5) == zp::test::approx(0.6).epsilon(1e-15));
  CHECK(l.get_lr(10) == 1.1);
  // warmup_num_steps is clamped to 2, as DeepSpeed does (log(1) would divide by zero).
  CHECK(schedule(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1}}})").warmup_num_steps == 2);
}

TEST_CASE("WarmupDecayLR and WarmupCosineLR") {
  const auto d = schedule(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 20,
      "warmup_min_lr": 0, "warmup_max_lr": 1, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  CHECK(d.get_lr(9) == zp::test::approx(0.9));
  CHECK(d.get_lr(10) == 1.0);
  CHECK(d.get_lr(15) == 0.5);
  CHECK(d.get_lr(25) == 0.0);
  const auto c = schedule(R"({"optimizer": {"type": "AdamW", "params": {"lr": 2.0}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20, "warmup_num_steps": 10,
      "warmup_type": "linear"}}})");
  CHECK(c.lr_for(0) == 0.0);  // WarmupCosineLR.get_lr before it has started
  CHECK(c.get_lr(5) == zp::test::approx(2.0 * 0.5));
  const double cosv = (1.0 + std::cos(3.14159265358979323846 * 0.1)) / 2.0;
  CHECK(c.get_lr(10) == zp::test::approx(2.0 * (1e-4 + (1.0 - 1e-4) * cosv)).epsilon(1e-14));
  CHECK(c.get_lr(19) == zp::test::approx(2.0 * 1e-4).epsilon(1e-12));  // cos(pi) = -1: the floor ratio
  CHECK(c.get_lr(29) == zp::test::approx(2.0));  // DeepSpeed's cosine goes on past total_num_steps
}

TEST_CASE("scheduler: bad input names the key and what is allowed") {
  auto err = [](const std::string& text) { return test::input_error([&] { (void)schedule(text); }); };
  CHECK(err(R"({"scheduler": {"type": "Warmup"}})").find("scheduler.type: unknown scheduler 'Warmup'; allowed: WarmupLR") !=
        std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max": 1}}})")
            .find("scheduler.params.warmup_max: unknown key for WarmupLR; allowed: warmup_min_lr") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}})").find("\"auto\"") !=
        std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})")
            .find("must be \"log\" or \"linear\"") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupDecayLR"}})").find("total_num_steps: required") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "OneCycle", "params": {}}})").find("scheduler.params.cycle_min_lr: required by OneCycle") !=
        std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1,
      "cycle_first_step_size": 0}}})").find("cycle_first_step_size: must be positive") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1,
      "cycle_momentum": "yes"}}})").find("cycle_momentum: must be true or false") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}}})")
            .find("lr_range_test_step_size: must be a positive integer") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_max_lr": 1}}})")
            .find("unknown key for LRRangeTest; allowed: lr_range_test_min_lr") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 5}}})")
            .find("only the default (-1") != std::string::npos);
  CHECK_NOTHROW(schedule(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": -1}}})"));
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -3}}})").find("integer >= 0") !=
        std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "extra": 1}})").find("scheduler.extra") != std::string::npos);
}

// Golden values: DeepSpeed's own OneCycle and LRRangeTest (lr_schedules.py) stepped after
// every update on a one-group optimizer, recording the lr and betas each update runs with.
namespace {
struct Golden {
  double lr, beta1, beta2;
};
void check_golden(const exec::LrSchedule& s, const std::vector<Golden>& g) {
  for (std::size_t k = 0; k < g.size(); ++k) {
    CAPTURE(k);
    const auto applied = static_cast<std::int64_t>(k);
    CHECK(s.lr_for(applied) == zp::test::approx(g[k].lr).epsilon(1e-12));
    const auto b = s.betas_for(applied);
    if (g[k].beta1 < 0) {
      CHECK_FALSE(b.has_value());
      continue;
    }
    REQUIRE(b.has_value());
    CHECK(b->first == zp::test::approx(g[k].beta1).epsilon(1e-12));
    CHECK(b->second == zp::test::approx(g[k].beta2).epsilon(1e-12));
  }
}
}  // namespace

TEST_CASE("OneCycle: the cycle, the decay, momentum cycled inversely with beta2 = 0.99, stairs; as DeepSpeed steps it") {
  // The constructor sets cycle_min_lr and (cycle_min_mom, 0.99); from the second update on,
  // the cycle's values (whose momentum at scale 0 is cycle_max_mom).
  check_golden(schedule(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.5}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01,
      "cycle_first_step_size": 4, "cycle_second_step_size": 6, "decay_lr_rate": 0.5, "decay_step_size": 2,
      "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.1}}})"),
               {{0.001, 0.85, 0.99}, {0.0032500000000000025, 0.9249999999999999, 0.99}, {0.0055, 0.9, 0.99},
                {0.007750000000000002, 0.875, 0.99}, {0.009999999999999998, 0.85, 0.99},
                {0.0085, 0.8666666666666667, 0.99}, {0.006999999999999999, 0.8833333333333333, 0.99},
                {0.005500000000000001, 0.8999999999999999, 0.99}, {0.004, 0.9166666666666666, 0.99},
                {0.0025000000000000014, 0.9333333333333332, 0.99}, {0.001, 0.95, 0.99},
                {0.0008, 0.9974999999999999, 0.99}, {0.0006666666666666666, 1.045, 0.99},
                {0.0005714285714285715, 1.0924999999999998, 0.99}});
  check_golden(schedule(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.5}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01,
      "cycle_first_step_size": 4, "cycle_first_stair_count": 2, "cycle_second_step_size": 5,
      "cycle_second_stair_count": 3}}})"),
               {{0.001, 0.8, 0.99}, {0.001, 0.9, 0.99}, {0.0055000000000000005, 0.8500000000000001, 0.99},
                {0.0055000000000000005, 0.8500000000000001, 0.99}, {0.010000000000000002, 0.8, 0.99},
                {0.007, 0.8333333333333334, 0.99}, {0.004, 0.8666666666666667, 0.99},
                {0.004, 0.8666666666666667, 0.99}, {0.001, 0.9, 0.99}, {0.001, 0.9, 0.99}, {0.001, 0.9, 0.99},
                {0.001, 0.9, 0.99}});
  // SGD has no betas: DeepSpeed turns cycle_momentum off; the lr still cycles.
  check_golden(schedule(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.5}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 0.3,
      "cycle_first_step_size": 2}}})"),
               {{0.1, -1, -1}, {0.2, -1, -1}, {0.3, -1, -1}, {0.2, -1, -1}, {0.1, -1, -1}});
}

TEST_CASE("LRRangeTest: linear growth per step size, or whole steps with the staircase") {
  check_golden(schedule(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.002,
      "lr_range_test_step_size": 2, "lr_range_test_step_rate": 0.5}}})"),
               {{0.002, -1, -1}, {0.0025, -1, -1}, {0.003, -1, -1}, {0.0035, -1, -1}, {0.004, -1, -1},
                {0.0045000000000000005, -1, -1}});
  check_golden(schedule(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.002,
      "lr_range_test_step_size": 2, "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": true}}})"),
               {{0.002, -1, -1}, {0.002, -1, -1}, {0.003, -1, -1}, {0.003, -1, -1}, {0.004, -1, -1}, {0.004, -1, -1}});
}
