#pragma once
// `zeroplan simulate` and the pieces explain, tests and benchmarks share: load the
// inputs once, lower and replay one configuration per stage.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace CLI {
class App;
}  // namespace CLI

#include <memory>

#include "exec/cuda_memory.hpp"
#include "models/graph.hpp"

#include "sim/cluster.hpp"
#include "sim/collective_model.hpp"
#include "sim/device.hpp"
#include "sim/memory.hpp"
#include "sim/predict.hpp"
#include "sim/timing.hpp"
#include "sim/trace.hpp"
#include "zero/ds_config.hpp"
#include "zero/lower.hpp"
#include "zero/program.hpp"

namespace zp::cli {

struct SimRequest {
  std::string model = "bert-large-uncased";
  std::string ds_config;                 // path; empty → DeepSpeed defaults
  std::optional<int> gpus;               // ranks; default: the cluster's size
  std::string gpu;                       // --gpus N: default A100-80GB; --cluster: an NCCL XML's GPU type
  std::string cluster;                   // preset, JSON or NCCL topology XML; empty → --gpus × --gpu
  std::optional<int> nodes;
  std::optional<double> nic_gbps;
  std::string trace;                     // Chrome trace output path
  std::optional<double> interference;    // overrides the device profile's
  std::optional<double> host_probe_us;   // --host-probe-us: the host's probe; scales the host costs
  std::vector<int> stages;               // empty → the ds_config's stage
  std::optional<std::int64_t> micro_batch;
  std::optional<std::int64_t> seq_len;
  bool activation_checkpointing = false;
  std::optional<int> rank;               // default: the rank with the most rank-dependent bytes
  std::string attention;                 // eager | sdpa | flash_attention_2; empty: the config.json's, else sdpa
  std::string transformers;              // 5 | 4.46; empty: models::kDefaultTransformers
  bool keep_output = false;              // the caller keeps the model output until the micro-step ends
  models::KernelVariants variants;        // zeroplan's fused variants of the graph (all off: HF's)
  bool json = false;
  bool critical_path = false;            // --critical-path: the path event by event
  bool check_batch = true;               // false: the caller sets the batch (plan)
  std::string profile;                   // --profile: a cluster profile (zeroplan calibrate --out)
  std::string executor;                  // --executor: cuda | cuda-mpi (zeroplan's own executor's device memory); empty: none
  bool executor_workspaces = false;      // --executor-workspaces: the run holds PyTorch's workspaces (train --workspaces-of)
  int ranks_per_gpu = 1;                 // --ranks-per-gpu: ranks 0..K-1 share GPU 0 (--executor cuda-mpi): its whole figure
  std::string attention_kernel = "own";  // --attention-kernel: the executor's fused attention (train's flag): own | cudnn
};

// Everything one configuration's prediction needs, loaded and validated once.
struct Inputs {
  models::ModelConfig model;
  zero::DsConfig cfg;
  const sim::DeviceSpec* device = nullptr;
  // zeroplan's CUDA executor's figures on this GPU: the device database's, or --profile's.
  sim::DeviceSpec::ExecutorMemory executor_memory;
  sim::ClusterSpec cluster;
  std::shared_ptr<const sim::CollectiveModel> collectives;  // built once from `cluster`
  sim::DeviceProfile profile;
  int world_size = 1;
  std::int64_t seq_len = 0;
  bool activation_checkpointing = false;
  std::optional<int> rank;
  models::Attention attention = models::kDefaultAttention;
  models::Transformers transformers = models::kDefaultTransformers;
  bool keep_output = false;
  models::KernelVariants variants;
  std::vector<std::string> warnings;
  // --profile: its file and the relative standard deviation its predictions carry (0: none).
  std::string profile_file;
  double profile_rel_sd = 0;     // the profile's (or the preset's, measured) iteration uncertainty
  std::string profile_basis;
  std::string uncertainty_source;  // "profile FILE" or "the <device> preset"; empty: none known
  // --host-probe-us: this host's probe, the profile's, and the factor the host costs took (0: not given).
  double host_probe_us = 0, profile_probe_us = 0, host_probe_scale = 0;
};

// `--executor cuda`: the device memory of `zeroplan train --device cuda` on this program
// (exec/cuda_memory.hpp): what its own scratch takes, and its device-used figure.
struct ExecutorMemory {
  bool nccl = true;  // the communicator: NCCL (train's default on GPUs), else MPI (--comm mpi)
  // PyTorch's cuBLAS/cuBLASLt workspaces among the program's buffers: none as `train` runs by
  // default; the simulated GPU's under --executor-workspaces (train --workspaces-of that GPU).
  Bytes library_workspaces{};
  // The program's own memory as `train` lowers it (the result's, or the one lowered again
  // without the workspaces): what `compare` holds a GPU run's categories, peak and reserved to.
  sim::MemoryReport memory;
  std::string peak_event;
  exec::CudaScratchPrediction scratch;
  exec::CudaDeviceUsed used;
  // --ranks-per-gpu K > 1: ranks 0..K-1 on the one GPU, each with its own context, libraries,
  // program and scratch: the device-used bytes of each and of the whole GPU (their sum).
  std::vector<exec::CudaDeviceUsed> gpu_ranks;
  Bytes gpu_total{};
  // --executor cuda (NCCL, a GPU each), with time: the step as the executor runs it (sim::Target
  // deepspeed false: none of DeepSpeed's Python, per-tensor loops or separate bias adds; cuDNN's
  // attention where --attention-kernel cudnn), which `compare` holds a GPU run's times to.
  std::optional<sim::TimeSummary> time;
};

struct StageResult {
  int stage = 0;
  int rank = 0;
  zero::Batch batch;
  zero::Program program;
  sim::MemoryReport memory;
  sim::TimeSummary time;
  std::optional<sim::Unsynchronised> unsynchronised;  // the iteration without the phases' syncs
  std::optional<ExecutorMemory> executor;
  std::vector<sim::OpTraceInfo> ops;  // the graph's ops, for the trace (sim::op_trace_info)
  sim::ElementwisePricing update;         // the fused optimizer update's, for the trace's kernel classes
};

// Validates flags (N >= 1, stages in 0..3, micro-batch >= 1, seq-len within the model's
// positions), loads model, ds_config and device. Bad input → zp::InputError.
Inputs load_inputs(const SimRequest& req);

// The ds_config for `stage` with the request's overrides applied (micro-batch keeps
// train_batch_size and changes GAS, as DeepSpeed requires).
zero::DsConfig config_for_stage(const Inputs& in, const SimRequest& req, int stage);

// The op graph this configuration needs (micro-batch, seq-len, dtype, attention).
models::GraphOptions graph_options(const Inputs& in, const zero::DsConfig& cfg, const zero::Batch& batch);

// The prediction target of these inputs (device, profile, collectives, N, rank, checkpointing).
sim::Target target(const Inputs& in);

// Lower one configuration for its heaviest rank, replay its memory and run it in time.
StageResult simulate_one(const Inputs& in, const zero::DsConfig& cfg, const models::OpGraph* graph = nullptr,
                         bool with_time = true);

std::vector<StageResult> simulate(const Inputs& in, const SimRequest& req);

// `critical_path` (`--critical-path`): the JSON lists every event of the critical path
// (by default only its length by kind and its longest events), and the table shows it.
nlohmann::json result_json(const StageResult& r, bool full_critical_path = false);
nlohmann::json simulate_json(const Inputs& in, const std::vector<StageResult>& rs, bool full_critical_path = false);
std::string simulate_table(const Inputs& in, const std::vector<StageResult>& rs, bool critical_path = false);
// The Chrome trace of every result (one process per stage and rank).
nlohmann::json simulate_trace(const std::vector<StageResult>& rs);

// --attention's help, with the default read from the code (models::kDefaultAttention).
std::string attention_help();
// --transformers's and --keep-output's help (one string for every subcommand).
std::string transformers_help();
// --fused-gelu, --fused-loss, ... (models::kernel_variants()) on a subcommand.
void add_variant_flags(CLI::App* c, models::KernelVariants& v);
// The variants that are on, for a heading: ", fused_gelu (zeroplan's kernel variants, ...)".
std::string variant_names(const models::KernelVariants& v);
std::string keep_output_help();
// --host-probe-us's help.
std::string host_probe_help();
// The files a request reads, as (flag, path) for zp::io::refuse_same_file.
std::vector<std::pair<std::string, std::string>> input_files(const SimRequest& req, const Inputs& in);
// An output named by `flag` (--trace, --out): refused when it is one of the inputs or cannot
// be written (checked before any work, the file itself untouched). Empty path: nothing.
void check_output(const std::string& path, const std::string& flag, const SimRequest& req, const Inputs& in);

// Human-readable sizes: "1.23 GiB", "512.0 MiB".
std::string human_bytes(Bytes b);

}  // namespace zp::cli
