#pragma once
// `zeroplan report`: one self-contained HTML page (inline SVG and CSS, no script, no
// network) with the plots behind an answer of simulate, explain or plan, and a
// measurement laid over its prediction. The numbers shown come from the same JSON
// documents the `--json` outputs print; the series (memory over the step, the timeline)
// come from the step programs behind them.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/units.hpp"
#include "sim/engine.hpp"
#include "zero/program.hpp"

namespace zp::report {

// One configuration's prediction: a bar of view 1, a panel of views 2 and 3.
struct Column {
  std::string title;                   // "stage 1", "A: cfg.json"
  std::string note;                    // a second line under the bar: "winner", "runner-up"
  nlohmann::json result;               // one element of `simulate --json`'s results
  // The step program and its run; null when the column comes from a --json file (no
  // event-level views then).
  const zero::Program* program = nullptr;
  const sim::TimeReport* time = nullptr;
};

struct Device {
  std::string name;
  Bytes memory{};                      // capacity
  Bytes limit{};                       // what a plan may use (headroom × capacity); 0: the capacity
};

// View 4: the planner's candidates.
struct PlanPoint {
  int stage = 0;
  std::int64_t micro_batch = 0;
  Bytes device_used{};
  double samples_per_s = 0;
  bool fits = false;
};
struct PlanView {
  nlohmann::json plan;                 // `plan --json` (ranked, best with its ds_config)
  std::vector<PlanPoint> simulated;    // every candidate the search simulated (may be empty)
};

// View 5: a measurement (`train --out`) and its comparison (`compare --json`).
struct MeasuredView {
  std::string file;
  nlohmann::json measured;
  nlohmann::json comparison;
  int column = -1;                     // the predicted column (its program, when it has one)
};

struct Report {
  std::string title;                   // first line of the page
  std::vector<std::string> facts;      // lines under it (inputs, device, batch)
  std::vector<std::string> warnings;
  std::string command;                 // the command line that made it
  std::string source_kind;             // "simulate", "explain", "plan" or "file"
  std::string source_file;             // --input, when the numbers come from a file
  Device device;
  std::vector<Column> columns;         // view 1
  int a = -1, b = -1;                  // the pair of views 2 and 3 (b = -1: one column)
  std::optional<PlanView> plan;
  std::optional<MeasuredView> measured;
  nlohmann::json source;               // the --json document of the numbers, embedded in the page
};

struct PageOptions {
  std::size_t memory_samples = 700;    // per panel of view 2
  std::size_t timeline_bins = 2000;    // per lane of view 3 (half-pixel at its width)
  std::size_t scatter_events = 4000;   // per-event points of view 5
};

// Figures of a rendered page, for the command's summary line and the docs.
struct PageStats {
  std::size_t bytes = 0;
  std::int64_t events = 0;             // step events drawn in views 2 and 3 (both columns)
  std::size_t timeline_slices = 0;     // rectangles drawn for them
  bool aggregated = false;             // some view aggregated or sampled its events
  std::vector<std::string> views;      // ids of the views present
};

std::string render_html(const Report& r, const PageOptions& opt = {}, PageStats* stats = nullptr);

}  // namespace zp::report
