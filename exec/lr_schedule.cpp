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
  } else if (type == "OneCycle" || type == "LRRangeTest") {
    throw InputError(file, "scheduler.type",
                     fmt::format("{} is not run by the executor (it runs WarmupLR, WarmupDecayLR, WarmupCosineLR); "
                                 "simulate and plan accept it, since it changes neither memory nor communication",
                                 type));
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
  if (params.contains("last_batch_iteration") && integer(cfg, params, "last_batch_iteration", 0) != 0)
    throw InputError(file, "scheduler.params.last_batch_iteration",
                     "only the default (-1: a fresh schedule) is supported; --resume restores the position");
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
