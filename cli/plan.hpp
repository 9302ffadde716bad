#pragma once
// `zeroplan plan`: the best ZeRO configuration for a model on a cluster, ranked, with
// the winning ds_config and why it wins.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/simulate.hpp"
#include "planner/plan.hpp"

namespace zp::cli {

struct PlanRequest {
  SimRequest base;                    // model, cluster or gpus, ds_config (BASE.json), seq-len, attention
  std::optional<std::int64_t> global_batch;  // default: BASE.json's train_batch_size
  std::string objective = "throughput";
  double headroom = 0.9;
  double price = 1.0;                 // per GPU-hour, for --objective cost
  std::string search;                 // comma-separated dimensions; empty: all
  int top = 10;
  std::string out;                    // the winner's ds_config
  int threads = 0;                    // 0: every core
  bool exhaustive = false;            // simulate the whole grid instead of searching
  bool explain = false;               // the full explain of the winner vs the runner-up
  bool verify = false;
  int verify_top = 3;
  int verify_steps = 3;
  double verify_max_minutes = 10.0;   // skip candidates the CPU executor would take longer on
  std::string verify_device = "auto";  // cpu | cuda | auto (cuda when a GPU is visible)
  std::string verify_attention_kernel = "own";  // on a GPU: train --attention-kernel (own | cudnn)
  std::string verify_launcher;        // how to start ranks; default: mpirun (see docs/planner.md)
};

struct PlanOutput {
  std::vector<std::string> warnings;
  std::string text;
  nlohmann::json json;
  int exit_code = 0;
  planner::Problem problem;           // what was searched, and how (for `zeroplan report`)
  planner::PlanResult result;
};

// Validates the request (headroom in (0, 1], known search keys and objective, a global
// batch N divides), searches and reports. Bad input → zp::InputError.
planner::Problem plan_problem(const PlanRequest& req, Inputs* inputs_out = nullptr);
PlanOutput run_plan(const PlanRequest& req, const char* self_exe);

}  // namespace zp::cli
