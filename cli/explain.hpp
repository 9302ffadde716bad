#pragma once
// `zeroplan explain`: why two configurations differ in memory, cause by cause.
#include <array>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/simulate.hpp"

namespace zp::cli {

struct ExplainRequest {
  SimRequest base;                   // model, gpus, gpu, micro-batch, seq-len, ds_config (A)
  int stage_a = -1, stage_b = -1;    // --stage / --vs-stage
  std::string vs_ds_config;          // --vs-ds-config (B)
  bool suggest = true;               // re-simulate candidate changes
  // In-process callers (plan): the two configurations themselves, each with its title
  // and activation checkpointing; the stage and config flags are then not used.
  struct Given {
    std::string title;
    zero::DsConfig cfg;
    bool activation_checkpointing = false;
  };
  std::optional<std::array<Given, 2>> given;
};

struct Explanation {
  std::vector<std::string> warnings;  // from both configurations' inputs, once each
  std::string text;
  nlohmann::json json;
  nlohmann::json json_time;
};

Explanation explain(const ExplainRequest& req);

}  // namespace zp::cli
