#pragma once
// Readers that turn the files users already have into observations. Bad input (a file that
// is not what it claims, a table without the columns it needs, NaN or negative times) is an
// InputError naming the file, the line and what is expected; data that can still be used
// with care (a truncated last line, a row with wrong results) is a warning in
// Dataset::warnings.
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "calibration/observation.hpp"
#include "sim/cluster.hpp"

namespace zp::calibration {

// nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf,
// reduce_perf, alltoall_perf), one or several tests in one file: the header (nThread, nGpus,
// the "#  Rank" device lines, the nccl-tests and NCCL versions) and the table, out-of-place
// time per size (in-place where out-of-place is blank). `kind` names the collective when the
// output does not ("# Collective test starting:" is printed by nccl-tests 2.14 and later; the
// file name is tried next).
Dataset read_nccl_tests(const std::string& path, std::optional<zero::CollKind> kind = std::nullopt);
Dataset parse_nccl_tests(const std::string& path, const std::string& text, std::optional<zero::CollKind> kind);
// "all_reduce=FILE" or "FILE" (the kind from the output or the file name).
Dataset read_nccl_tests_arg(const std::string& arg);

// DeepSpeed's wall_clock_breakdown lines (runtime/engine.py, utils/timer.py, 0.19):
//   [Rank 0] time (ms) | fwd: 20.11 | bwd: 28.16 | bwd_inner: 27.01 | bwd_allreduce: 1.12 | step: 27.34
// printed at every gradient-accumulation boundary (the *_microstep lines every micro-step are
// read for their count only), plus what DeepSpeed prints at start-up (its version, the
// engine configuration: world_size, micro-batch, GAS, ZeRO stage, wall_clock_breakdown).
struct DeepSpeedLog {
  struct Step {
    int line = 0;
    double fwd_ms = -1, bwd_ms = -1, bwd_inner_ms = -1, bwd_allreduce_ms = -1, step_ms = -1;
  };
  std::vector<Step> steps;           // the global timer lines of the lowest rank that printed them
  int rank = 0;
  std::string version;               // "0.19.8"
  std::optional<int> world_size, micro_batch, gas, stage;
  std::optional<bool> wall_clock_breakdown;
  std::string optimizer;             // "DeepSpeed Final Optimizer = ..."
  std::vector<std::string> warnings;
};
DeepSpeedLog parse_deepspeed_log(const std::string& path, const std::string& text);

// What a DeepSpeed log ran: the run's model, ds_config and shape (the command line's, or a
// runs file's entry), cross-checked against what the log says.
struct RunArgs {
  std::string name;
  std::string model;
  std::string ds_config;             // path
  std::optional<std::int64_t> seq_len, micro_batch;
  std::string attention;
  bool activation_checkpointing = false;
  int world_size = 0;                // 0: the log's, else the cluster's
  int skip_steps = 1;                // warm-up steps left out
};
Dataset read_deepspeed_log(const std::string& log_path, const RunArgs& args, const sim::ClusterSpec& cluster);

// A runs file: {"meta": {...}, "runs": [...]} as tools/deepspeed_compare.py --write-reference
// writes it (tests/data/deepspeed/*.json: per run its model, ds_config, shape, phase times
// and GPU busy time), or entries that name a DeepSpeed log instead of phase times:
//   {"runs": [{"name": "a", "log": "run_a.log", "model": "gpt2", "ds_config": "a.json", "seq_len": 1024}]}
// Paths are relative to the runs file.
Dataset read_deepspeed_runs(const std::string& path, const sim::ClusterSpec& cluster, int skip_steps = 1);

// `zeroplan train --out` measurements (exec/trainer.cpp): per-event times of one rank, as
// kernel and collective observations priced event by event (tagged with the run's tags and
// the timer phase they fall in), and per phase the sum of its device events' times
// (Quantity::events: reported, not fitted, as the events themselves are). `args` overrides what the file does not record (the attention, the
// ds_config's path when it moved).
Dataset read_train_out(const std::string& path, const RunArgs& args, const sim::ClusterSpec& cluster);

// Kernel and collective observations as JSON ({"format": "zeroplan-observations", "version": 1,
// "environment": {...}, "observations": [...]}), and read back: what `calibrate
// --save-observations` writes so that the device's micro-benchmarks, measured once on the GPU
// machine, can be refitted anywhere (`--observations FILE`). Phases and a training run's events
// are left out (their run files are the record); `left_out` counts them.
nlohmann::json observations_to_json(const Dataset& data, int* left_out = nullptr);
void save_observations(const Dataset& data, const std::string& path, const std::string& flag, int* left_out = nullptr);
Dataset read_observations(const std::string& path);

// Shared by the readers of training runs. A model's short name ("gpt2", a config.json's stem).
std::string model_stem(const std::string& model);
// A run's configuration with the tags `--fit-where` selects its observations by (run, model,
// stage, dtype, attention, micro_batch, gas, world_size, overlap_comm, seq_len).
RunConfig make_run(const std::string& name, const std::string& source, const std::string& model,
                   const zero::DsConfig& cfg, std::int64_t seq_len, models::Attention att, int world, bool ckpt);
// The median of the values (NaN for none).
double median(std::vector<double> v);
// A ds_config enabling neither fp16 nor bf16 trains the model in the dtype its config.json names
// (zero::apply_module_dtype): applied to `cfg`; the note saying so, when there is one, joins the
// dataset's warnings.
void apply_module_dtype(Dataset& ds, zero::DsConfig& cfg, const models::ModelConfig& mc);
// One phase observation of run `run` of `ds`, tagged with the run's tags.
void add_phase(Dataset& ds, int run, PhaseName ph, Quantity q, double seconds, double rel_spread, int repeats,
               bool fit, const std::string& source, const std::string& src_tag);

}  // namespace zp::calibration
