#pragma once
// `zeroplan calibrate`: reads measurements (nccl-tests tables, DeepSpeed logs and recorded
// runs, train --out files) or takes them on this machine's GPUs (--device cuda), fits the
// simulator's coefficients to them through the simulator itself, reports the fit, and writes a
// cluster profile that simulate, explain, plan and report take with --profile.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/device_bench.hpp"
#include "calibration/fit.hpp"
#include "calibration/observation.hpp"
#include "calibration/profile.hpp"
#include "sim/cluster.hpp"

namespace zp::cli {

struct CalibrateRequest {
  std::vector<std::string> nccl_tests;      // FILE or KIND=FILE
  std::vector<std::string> deepspeed_logs;  // with --model, --ds-config, ...
  std::vector<std::string> deepspeed_runs;  // runs files (tests/data/deepspeed/*.json's format)
  std::vector<std::string> train_out;       // zeroplan train --out files
  std::vector<std::string> observations;    // --observations: files --save-observations wrote
  std::string save_observations;            // --save-observations FILE: the kernel and collective observations
  std::string device;                       // "cuda": micro-benchmarks on this machine's GPUs
  double budget_minutes = 5;                // --device: the longest it may take
  // What a DeepSpeed log or a train --out ran, and the model the device benchmarks measure.
  std::string model, ds_config, attention;
  std::optional<std::int64_t> seq_len, micro_batch;
  bool activation_checkpointing = false;
  int skip_steps = 1;
  // The cluster the measurements ran on.
  std::string cluster;
  std::optional<int> nodes;
  std::optional<double> nic_gbps;
  std::optional<int> gpus;
  std::string gpu;
  // The fit.
  std::string fit;                          // --fit: parameter names and groups; empty: for the data
  std::string fit_where;                    // --fit-where KEY=V1|V2,...;...: the observations fitted; the rest held out
  std::string start_profile;                // --profile: start from a previous calibration
  int threads = 0;
  std::string out;                          // the cluster profile
  bool report = false;
  bool json = false;
};

struct CalibrateOutput {
  std::vector<std::string> warnings;
  std::string text;
  nlohmann::json json;
  calibration::Dataset data;
  calibration::FitResult fit;
  calibration::ClusterProfile profile;
  sim::ClusterSpec cluster;
};

// Bad input → zp::InputError (one line: file, key, what is allowed).
CalibrateOutput run_calibrate(const CalibrateRequest& req, const calibration::Progress& progress = {});

// `--fit-where KEY=V1|V2,KEY2=V3;KEY4=V5`: sets Observation::fit (within an alternative all keys
// must match, values are alternatives; alternatives are separated by ';'). Unknown keys →
// InputError listing the keys the observations carry.
void select_fitted(calibration::Dataset& data, const std::string& where);

// `calibrate --list-params`: every parameter with its unit, bounds, what it is and what determines it.
std::string params_table();

}  // namespace zp::cli
