#pragma once
// `zeroplan train`: lowers the model and ds_config into this rank's step program,
// interprets it for K optimizer steps on real data, and measures: loss per step,
// memory per category (the tracking allocator), bytes per collective kind, per-event
// times. The same program, replayed by the simulator, is the prediction it is compared
// with.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/units.hpp"
#include "exec/comm.hpp"

namespace zp::exec {

struct TrainOptions {
  std::string model;
  std::string ds_config;              // empty: DeepSpeed defaults
  std::int64_t steps = 10;
  std::uint64_t seed = 1234;
  std::string data = "synthetic";
  std::int64_t seq_len = 0;           // 0: the model's maximum
  std::optional<std::int64_t> micro_batch;  // overrides train_micro_batch_size_per_gpu
  bool activation_checkpointing = false;
  models::KernelVariants variants;     // zeroplan's fused variants of the graph
  std::string attention;              // eager | sdpa | flash_attention_2; empty: the config.json's, else sdpa
  std::string transformers;           // 5 | 4.46; empty: models::kDefaultTransformers
  bool keep_output = false;           // zero::LowerOptions::keep_output
  // The library workspaces a GPU's PyTorch keeps (zero::LowerOptions), allocated here too so
  // the bytes equal a prediction for that GPU (`train --workspaces-of GPU`); 0: none.
  Bytes cublas_workspace{0};
  Bytes cublaslt_workspace{0};
  Bytes memory_limit{0};              // device bytes live at once (0: none)
  std::string out;                    // measurements JSON (rank suffix when N > 1)
  std::string trace;                  // Chrome trace of the last step (rank suffix when N > 1)
  std::string checkpoint_dir;         // ZeRO-layout checkpoints (global_stepN/, latest)
  std::int64_t save_every = 0;        // save every K steps (0: at the end only)
  bool resume = false;                // continue from checkpoint_dir's latest
  bool quiet = false;
  std::string init_weights;           // safetensors: initial params by HF name (default: seeded random)
  std::string save_weights;           // safetensors: the params after training (rank 0; not stage 3 with N > 1)
  std::string save_batch;             // JSON: step 1's micro-batches of rank 0, by input name
  std::string device = "cpu";         // cpu | cuda (one GPU per rank: the local rank's)
  bool allow_tf32 = false;            // --device cuda: fp32 GEMMs on TF32 tensor cores
  std::string attention_kernel = "own";  // --device cuda: the fused attention's kernels, own or cudnn
  std::string comm = "auto";          // auto | nccl | mpi (auto: NCCL when every rank has its own GPU)
  double comm_timeout = 600.0;        // seconds a collective may take once the stream reaches it
};

// Runs training on this rank; returns the measurements document (also written to
// opt.out). Bad input → InputError (before any collective); failures during the run
// end the job on every rank through Comm::abort.
nlohmann::json train(const TrainOptions& opt, Comm& comm);

// The --out path of a rank: FILE.json for one rank, FILE.rankR.json for several.
std::string rank_path(const std::string& out, int rank, int world);

}  // namespace zp::exec
