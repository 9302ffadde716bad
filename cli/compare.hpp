#pragma once
// `zeroplan compare`: lays a prediction (`simulate --json`) beside a measurement
// (`train --out`) of the same configuration: memory per category at the peak, bytes per
// collective kind, and time per phase.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace zp::cli {

struct CompareRequest {
  std::string predicted;  // `zeroplan simulate --json` output
  std::string measured;   // `zeroplan train --out` measurements of one rank
  bool json = false;
};

struct Comparison {
  bool exact_memory = false;  // every category at the peak, the peak, reserved, host and the peak event agree
  bool exact_comm = false;    // bytes and calls of every collective kind agree
  // A GPU run predicted with `simulate --executor cuda` on a GPU whose figures are measured:
  // whether the predicted device-used bytes are within 1% of the driver's peak.
  std::optional<bool> device_used_within_1pct;
  std::string text;           // the report people read
  nlohmann::json json;        // the same, machine-readable
};

// Reads both files and compares the prediction's result for the measured stage.
// A file that cannot be read, is not JSON or lacks a key, a prediction without the
// measured stage, or two runs of different configurations (model, world size, rank,
// micro-batch, GAS, seq-len) → zp::InputError naming the file(s), the key and the values.
Comparison compare(const CompareRequest& req);

// The same from parsed documents; the names are used in messages.
Comparison compare_documents(const nlohmann::json& predicted, const std::string& predicted_name,
                             const nlohmann::json& measured, const std::string& measured_name);

}  // namespace zp::cli
