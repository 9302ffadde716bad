// DeepSpeed's learning-rate schedulers as the executor applies them: golden values from
// the formulas of deepspeed/runtime/lr_schedules.py, the off-by-one of its iteration
// counter, and the bad inputs.
#include <doctest/doctest.h>

#include <cmath>

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
  CHECK(s.lr_for(2) == doctest::Approx(0.001 * std::log(2.0) / std::log(1000.0)).epsilon(1e-15));
  CHECK(s.get_lr(999) == doctest::Approx(0.001).epsilon(1e-15));
  CHECK(s.get_lr(1000) == 0.001);
  CHECK(s.get_lr(5000) == 0.001);
  const auto l = schedule(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1,
      "warmup_max_lr": 1.1, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  CHECK(l.get_lr(5) == doctest::Approx(0.6).epsilon(1e-15));
  CHECK(l.get_lr(10) == 1.1);
  // warmup_num_steps is clamped to 2, as DeepSpeed does (log(1) would divide by zero).
  CHECK(schedule(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1}}})").warmup_num_steps == 2);
}

TEST_CASE("WarmupDecayLR and WarmupCosineLR") {
  const auto d = schedule(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 20,
      "warmup_min_lr": 0, "warmup_max_lr": 1, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  CHECK(d.get_lr(9) == doctest::Approx(0.9));
  CHECK(d.get_lr(10) == 1.0);
  CHECK(d.get_lr(15) == 0.5);
  CHECK(d.get_lr(25) == 0.0);
  const auto c = schedule(R"({"optimizer": {"type": "AdamW", "params": {"lr": 2.0}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20, "warmup_num_steps": 10,
      "warmup_type": "linear"}}})");
  CHECK(c.lr_for(0) == 0.0);  // WarmupCosineLR.get_lr before it has started
  CHECK(c.get_lr(5) == doctest::Approx(2.0 * 0.5));
  const double cosv = (1.0 + std::cos(3.14159265358979323846 * 0.1)) / 2.0;
  CHECK(c.get_lr(10) == doctest::Approx(2.0 * (1e-4 + (1.0 - 1e-4) * cosv)).epsilon(1e-14));
  CHECK(c.get_lr(19) == doctest::Approx(2.0 * 1e-4).epsilon(1e-12));  // cos(pi) = -1: the floor ratio
  CHECK(c.get_lr(29) == doctest::Approx(2.0));  // DeepSpeed's cosine goes on past total_num_steps
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
  CHECK(err(R"({"scheduler": {"type": "OneCycle", "params": {}}})").find("not run by the executor") != std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -3}}})").find("integer >= 0") !=
        std::string::npos);
  CHECK(err(R"({"scheduler": {"type": "WarmupLR", "extra": 1}})").find("scheduler.extra") != std::string::npos);
}
