#pragma once
// `zeroplan report`: one HTML page with the plots behind simulate, explain or plan (from
// their inputs or their --json output), and a measurement laid over its prediction.
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/plan.hpp"
#include "cli/simulate.hpp"
#include "report/report.hpp"

namespace zp::cli {

struct ReportRequest {
  SimRequest sim;                      // the inputs, as simulate takes them
  std::string stages;                  // --stages (default 0,1,2,3)
  std::optional<int> stage_a, stage_b; // --stage / --vs-stage: the pair of views 2 and 3
  std::string vs_ds_config;            // --vs-ds-config: config B against --ds-config (explain's other form)
  bool plan = false;                   // --plan: search as `zeroplan plan` does
  PlanRequest plan_req;                // its options (its base is `sim`)
  bool plan_top_given = false;
  std::string input;                   // --input: a simulate, explain or plan --json output
  std::string measured;                // --measured: a `train --out` measurement of one rank
  std::string out;                     // the page
  std::string command;                 // the command line, shown on the page
  bool model_given = false;
  report::PageOptions page;
};

// Registers `report` and its options on `app`; `req` receives them.
CLI::App* add_report_command(CLI::App& app, ReportRequest& req);

struct ReportOutcome {
  std::vector<std::string> warnings;
  std::string summary;                 // what was written, for the terminal
  report::PageStats stats;
};

// Builds the page and writes it atomically to req.out. Bad input (including an --out
// that cannot be written, checked before any work, and a measurement of another
// configuration than the prediction) → zp::InputError; nothing is written then.
ReportOutcome run_report(const ReportRequest& req, const char* argv0);

// "zeroplan report --model ..." as typed (quoted where a shell needs it).
std::string report_command_line(int argc, char** argv);

// The page without writing it (tests, benchmarks).
std::string build_report(const ReportRequest& req, const char* argv0, ReportOutcome* outcome = nullptr);

}  // namespace zp::cli
