#pragma once
// One configuration's prediction, start to end: lower the op graph for one rank, replay
// its memory, price its events and run them in time. `simulate`, `explain` and the
// planner all go through here, so they cannot disagree.
#include <optional>

#include "models/graph.hpp"
#include "sim/collective_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/device.hpp"
#include "sim/memory.hpp"
#include "sim/timing.hpp"
#include "zero/ds_config.hpp"
#include "zero/lower.hpp"
#include "zero/program.hpp"

namespace zp::sim {

// What one prediction is made for, besides the graph and the config.
struct Target {
  const DeviceSpec* device = nullptr;
  const DeviceProfile* profile = nullptr;
  const CollectiveModel* collectives = nullptr;
  int world_size = 1;
  std::optional<int> rank;           // default: zero::heaviest_rank
  bool activation_checkpointing = false;
  bool keep_output = false;          // zero::LowerOptions::keep_output
  // What runs the program: DeepSpeed (its Python's host work, per-tensor loops and stage 3's
  // separate bias adds priced: ComputeModel::deepspeed), or zeroplan's executor (false:
  // it does none of that work; `plan --verify` predicts its candidates so too).
  bool deepspeed = true;
  // With `deepspeed` off: the executor runs cuDNN's fused attention (ComputeModel::cudnn_attention).
  bool cudnn_attention = false;
  // With `deepspeed` off: the executor runs on GPUs, which stage large products with an odd
  // output width (ComputeModel::stages_products); its CPU device does not.
  bool stages_products = true;
  // PyTorch's cuBLAS/cuBLASLt workspaces (the device's sizes) among the program's buffers:
  // DeepSpeed's runs hold them; zeroplan's executor allocates them only under
  // `train --workspaces-of` (false: none, as `train` runs by default).
  bool library_workspaces = true;
};

// The iteration as training runs it where the phases' synchronisations change it
// (free_running_program): the program lowered without them and its timing, whose makespan is
// TimeSummary::iteration.
struct Unsynchronised {
  zero::Program program;
  TimeReport report;
};

struct Prediction {
  int rank = 0;
  zero::Batch batch;
  zero::Program program;
  MemoryReport memory;
  TimeSummary time;                  // empty when `with_time` is false
  std::optional<Unsynchronised> unsynchronised;
};

// The op graph's options for a configuration on a target: the batch's micro-batch, the
// config's model dtype, and the target's checkpointing (the graph and the lowering must agree
// on it: transformers builds no KV cache under gradient checkpointing).
models::GraphOptions graph_options(const zero::DsConfig& cfg, const zero::Batch& batch, std::int64_t seq_len,
                                   models::Attention attention, models::Transformers transformers, const Target& t);

// The lowering's options for a target: its world size and rank (the heaviest when unset),
// checkpointing, the kept model output, the device's library workspaces.
zero::LowerOptions lower_options(const models::OpGraph& g, const zero::DsConfig& cfg, const Target& t);

// Where the phases' synchronisations change DeepSpeed's iteration (zero::phase_syncs_matter,
// t.deepspeed), the program lowered without them (zero::LowerOptions::phase_syncs): its makespan
// is the iteration training runs; otherwise none.
std::optional<zero::Program> free_running_program(const models::OpGraph& g, const zero::DsConfig& cfg,
                                                  const zero::Batch& batch, const Target& t);

// `g` must be built for `batch.micro_batch` and the config's model dtype. The phases are
// timed with a synchronisation between them (DeepSpeed's wall_clock_breakdown); the iteration
// without (free_running_program's, where it differs; `free_iteration` false: the phases' sum, for
// a caller that reads the phases alone, such as the planner's point it extrapolates GAS from).
Prediction predict(const models::OpGraph& g, const zero::DsConfig& cfg, const zero::Batch& batch, const Target& t,
                   bool with_time = true, bool free_iteration = true);

}  // namespace zp::sim
