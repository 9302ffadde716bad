#include "exec/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "core/error.hpp"

namespace zp::exec {

namespace {

using nlohmann::json;

double warmup_gamma(const LrSchedule& s, std::int64_t it) {
  const auto w = static_cast<double>(s.warmup_num_steps);
  return s.linear ? static_cast<double>(it) / w : std::log(static_cast<double>(it + 1)) / std::log(w);
}

std::string file_of(const zero::DsConfig& cfg) { return cfg.file.empty() ? "ds_config" : cfg.file; }

double number(const zero::DsConfig& cfg, const json& params, const char* key, double dflt) {
  if (!params.contains(key)) return dflt;
  const json& v = params.at(key);
  const std::string where = fmt::format("scheduler.params.{}", key);
  if (v.is_string() && v.get<std::string>() == "auto")
    throw InputError(file_of(cfg), where, "\"auto\" is filled in by the Hugging Face Trainer; give a number to train here");
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw InputError(file_of(cfg), where, fmt::format("must be a finite number, got {}", v.dump()));
  return v.get<double>();
}

std::int64_t integer(const zero::DsConfig& cfg, const json& params, const char* key, std::int64_t dflt) {
  const double d = number(cfg, params, key, static_cast<double>(dflt));
  if (d < 0 || d != std::floor(d) || d > 1e15)
    throw InputError(file_of(cfg), fmt::format("scheduler.params.{}", key),
                     fmt::format("must be an integer >= 0, got {}", params.at(key).dump()));
  return static_cast<std::int64_t>(d);
}

}  // namespace

double LrSchedule::get_lr(std::int64_t it) const {
  switch (type) {
    case Type::constant:
      return base_lr;
    case Type::warmup:
    case Type::warmup_decay: {
      if (it < 0) return min_lr;  // the constructor's rate
      double gamma = 1.0;
      if (it < warmup_num_steps) gamma = warmup_gamma(*this, it);
      else if (type == Type::warmup_decay)
        gamma = std::max(0.0, static_cast<double>(total_num_steps - it) /
                                  std::max(1.0, static_cast<double>(total_num_steps - warmup_num_steps)));
      return min_lr + (max_lr - min_lr) * gamma;
    }
    case Type::one_cycle: {
      if (it < 0) return cycle_min_lr;  // the constructor's rate
      const double total = cycle_first_step_size + cycle_second_step_size;
      if (static_cast<double>(it) < total) return cycle_min_lr + (cycle_max_lr - cycle_min_lr) * one_cycle_scale(it);
      if (decay_step_size == 0 || decay_lr_rate == 0) return cycle_min_lr;
      const double interval = (static_cast<double>(it) - total + 1) / decay_step_size;
      return cycle_min_lr / (1 + decay_lr_rate * interval);
    }
    case Type::lr_range_test: {
      const double x = static_cast<double>(it + 1) / static_cast<double>(range_step_size);
      return range_min_lr * (1 + range_step_rate * (range_staircase ? std::floor(x) : x));
    }
    case Type::warmup_cosine: {
      if (it < 0) return 0.0;  // WarmupCosineLR.get_lr before it has started
      double ratio;
      if (it < warmup_num_steps) {
        ratio = warmup_min_ratio + warmup_gamma(*this, it) * (1.0 - warmup_min_ratio);
      } else {
        const double last = static_cast<double>(it - warmup_num_steps + 1);
        const double total = static_cast<double>(total_num_steps - warmup_num_steps);
        const double c = (1.0 + std::cos(std::numbers::pi * last / total)) / 2.0;
        ratio = std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * c);
      }
      return base_lr * ratio;
    }
  }
  return base_lr;
}

// OneCycle._get_scale_factor with last_batch_iteration = it.
double LrSchedule::one_cycle_scale(std::int64_t it) const {
  const double bi = static_cast<double>(it + 1);
  const double total = cycle_first_step_size + cycle_second_step_size;
  const double ratio = cycle_first_step_size / total;
  const double cycle = std::floor(1 + bi / total);
  const double x = 1.0 + bi / total - cycle;
  double scale;
  std::int64_t stairs;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = cycle_first_stair_count;
  } else {
    scale = (x - 1) / (ratio - 1);
    stairs = cycle_second_stair_count;
  }
  if (stairs > 0) {
    // Quantised from the integer offset in the cycle (lr_schedules.py does the same).
    const double ci = std::fmod(bi, total);
    const double pos = ci <= cycle_first_step_size
                           ? ci * static_cast<double>(stairs) / cycle_first_step_size
                           : (total - ci) * static_cast<double>(stairs) / cycle_second_step_size;
    scale = std::floor(pos) / static_cast<double>(stairs);
  }
  return scale;
}

std::optional<std::pair<double, double>> LrSchedule::get_betas(std::int64_t it) const {
  if (type != Type::one_cycle || !cycle_momentum) return std::nullopt;
  constexpr double kBeta2 = 0.99;
  if (it < 0) return std::pair{cycle_min_mom, kBeta2};
  const double total = cycle_first_step_size + cycle_second_step_size;
  if (static_cast<double>(it) < total)
    return std::pair{cycle_max_mom - (cycle_max_mom - cycle_min_mom) * one_cycle_scale(it), kBeta2};
  if (decay_step_size == 0 || decay_mom_rate == 0) return std::pair{cycle_max_mom, kBeta2};
  const double interval = (static_cast<double>(it) - total + 1) / decay_step_size;
  return std::pair{cycle_max_mom * (1 + decay_mom_rate * interval), kBeta2};
}

LrSchedule parse_lr_schedule(const zero::DsConfig& cfg) {
  LrSchedule s;
  s.base_lr = cfg.optimizer.lr;
  if (!cfg.raw.is_object() || !cfg.raw.contains("scheduler")) return s;
  const json& sec = cfg.raw.at("scheduler");
  const std::string file = file_of(cfg);
  if (!sec.is_object()) throw InputError(file, "scheduler", "must be an object {\"type\": ..., \"params\": {...}}");
  for (const auto& [k, v] : sec.items())
    if (k != "type" && k != "params")
      throw InputError(file, fmt::format("scheduler.{}", k), "unknown key; allowed: type, params");
  const std::string type = sec.value("type", std::string());
  const json params = sec.contains("params") ? sec.at("params") : json::object();
  if (!params.is_object()) throw InputError(file, "scheduler.params", "must be an object");
  std::vector<std::string> allowed;
  if (type == "WarmupLR") {
    s.type = LrSchedule::Type::warmup;
    allowed = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
  } else if (type == "WarmupDecayLR") {
    s.type = LrSchedule::Type::warmup_decay;
    allowed = {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
               "last_batch_iteration"};
  } else if (type == "WarmupCosineLR") {
    s.type = LrSchedule::Type::warmup_cosine;
    allowed = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
               "last_batch_iteration"};
  } else if (type == "OneCycle") {
    s.type = LrSchedule::Type::one_cycle;
    allowed = {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
               "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
               "cycle_min_mom", "cycle_max_mom", "decay_mom_rate", "last_batch_iteration"};
  } else if (type == "LRRangeTest") {
    s.type = LrSchedule::Type::lr_range_test;
    allowed = {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase",
               "last_batch_iteration"};
  } else {
    throw InputError(file, "scheduler.type",
                     fmt::format("unknown scheduler '{}'; allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
                                 "LRRangeTest", type));
  }
  for (const auto& [k, v] : params.items())
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw InputError(file, fmt::format("scheduler.params.{}", k), fmt::format("unknown key for {}; allowed: {}", type, list));
    }
  if (params.contains("last_batch_iteration") && number(cfg, params, "last_batch_iteration", -1.0) != -1.0)
    throw InputError(file, "scheduler.params.last_batch_iteration",
                     "only the default (-1: a fresh schedule) is supported; --resume restores the position");
  auto boolean = [&](const char* key, bool dflt) {
    if (!params.contains(key)) return dflt;
    const json& v = params.at(key);
    if (!v.is_boolean())
      throw InputError(file, fmt::format("scheduler.params.{}", key), fmt::format("must be true or false, got {}", v.dump()));
    return v.get<bool>();
  };
  if (s.type == LrSchedule::Type::one_cycle) {
    for (const char* k : {"cycle_min_lr", "cycle_max_lr"})
      if (!params.contains(k)) throw InputError(file, fmt::format("scheduler.params.{}", k), "required by OneCycle");
    s.cycle_min_lr = number(cfg, params, "cycle_min_lr", 0.0);
    s.cycle_max_lr = number(cfg, params, "cycle_max_lr", 0.0);
    s.decay_lr_rate = number(cfg, params, "decay_lr_rate", 0.0);
    s.cycle_first_step_size = static_cast<double>(integer(cfg, params, "cycle_first_step_size", 2000));
    if (s.cycle_first_step_size <= 0)
      throw InputError(file, "scheduler.params.cycle_first_step_size", "must be positive, got 0");
    s.cycle_second_step_size = params.contains("cycle_second_step_size") && !params.at("cycle_second_step_size").is_null()
                                   ? static_cast<double>(integer(cfg, params, "cycle_second_step_size", 0))
                                   : s.cycle_first_step_size;
    s.cycle_first_stair_count = integer(cfg, params, "cycle_first_stair_count", 0);
    s.cycle_second_stair_count =
        params.contains("cycle_second_stair_count") && !params.at("cycle_second_stair_count").is_null()
            ? integer(cfg, params, "cycle_second_stair_count", 0)
            : s.cycle_first_stair_count;
    s.decay_step_size = static_cast<double>(integer(cfg, params, "decay_step_size", 0));
    // DeepSpeed cycles momentum only for an optimizer with betas (it warns and skips for SGD).
    s.cycle_momentum = boolean("cycle_momentum", true) && cfg.optimizer.type != zero::OptimizerType::sgd;
    s.cycle_min_mom = number(cfg, params, "cycle_min_mom", 0.8);
    s.cycle_max_mom = number(cfg, params, "cycle_max_mom", 0.9);
    s.decay_mom_rate = number(cfg, params, "decay_mom_rate", 0.0);
    return s;
  }
  if (s.type == LrSchedule::Type::lr_range_test) {
    s.range_min_lr = number(cfg, params, "lr_range_test_min_lr", 1e-3);
    s.range_step_rate = number(cfg, params, "lr_range_test_step_rate", 1.0);
    s.range_step_size = integer(cfg, params, "lr_range_test_step_size", 2000);
    if (s.range_step_size <= 0)
      throw InputError(file, "scheduler.params.lr_range_test_step_size", "must be a positive integer, got 0");
    s.range_staircase = boolean("lr_range_test_staircase", false);
    return s;
  }
  s.min_lr = number(cfg, params, "warmup_min_lr", 0.0);
  s.max_lr = number(cfg, params, "warmup_max_lr", 0.001);
  s.warmup_num_steps = std::max<std::int64_t>(2, integer(cfg, params, "warmup_num_steps", 1000));
  if (params.contains("warmup_type")) {
    const json& wt = params.at("warmup_type");
    if (!wt.is_string() || (wt.get<std::string>() != "log" && wt.get<std::string>() != "linear"))
      throw InputError(file, "scheduler.params.warmup_type", fmt::format("must be \"log\" or \"linear\", got {}", wt.dump()));
    s.linear = wt.get<std::string>() == "linear";
  }
  if (s.type != LrSchedule::Type::warmup) {
    if (!params.contains("total_num_steps"))
      throw InputError(file, "scheduler.params.total_num_steps", fmt::format("required by {}", type));
    s.total_num_steps = integer(cfg, params, "total_num_steps", 0);
  }
  if (s.type == LrSchedule::Type::warmup_cosine) {
    s.warmup_min_ratio = number(cfg, params, "warmup_min_ratio", 0.0);
    s.cos_min_ratio = number(cfg, params, "cos_min_ratio", 1e-4);
    if (s.total_num_steps <= s.warmup_num_steps)
      throw InputError(file, "scheduler.params.total_num_steps",
                       fmt::format("must exceed warmup_num_steps ({}) for WarmupCosineLR, got {}", s.warmup_num_steps,
                                   s.total_num_steps));
  }
  return s;
}

}  // namespace zp::exec
