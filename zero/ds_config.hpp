#pragma once
// A DeepSpeed configuration (ds_config JSON) as zeroplan understands it, with
// DeepSpeed's current defaults (REFERENCE.md §1). Sections that change neither
// memory nor communication are accepted and ignored; unknown keys are errors.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"

namespace zp::zero {

enum class OptimizerType {
  adam, adamw, sgd, lamb, adagrad, onebitadam, zerooneadam, onebitlamb,
  lion,  // DeepSpeed's FusedLion / CPULion: one fp32 state (exp_avg)
  muon,  // DeepSpeed's Muon: momentum buffer (the auxiliary Adam on non-matrix params is not modelled)
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adam;
  std::string type_name = "Adam";    // as written in the file
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;             // SGD
  double beta1 = 0.9, beta2 = 0.999; // Adam family
  double eps = 1e-8;
  // DeepSpeed's FusedAdam/CPUAdam default adam_w_mode = true: "Adam" decays weights
  // decoupled (AdamW) unless adam_w_mode (or adamw_mode) is false.
  bool adam_w_mode = true;
  // fp32 state bytes per parameter kept by the optimizer: Adam/AdamW/Lamb 8 (m, v),
  // SGD with momentum 4, SGD without 0, Adagrad 4, Lion 4, Muon 4.
  std::int64_t state_bytes_per_param() const;
  bool operator==(const OptimizerConfig&) const = default;
};

enum class OffloadDevice { none, cpu, nvme };

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::none;
  bool pin_memory = false;
  std::int64_t buffer_count = 4;     // offload_param only
  std::int64_t buffer_size = 100000000;
  std::int64_t max_in_cpu = 1000000000;
  double ratio = 1.0;                // offload_optimizer.ratio (ZeRO-Offload++)
  std::string nvme_path;             // required when device is nvme
  bool operator==(const OffloadConfig&) const = default;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_size = 500000000;     // elements
  std::int64_t allgather_bucket_size = 500000000;  // elements
  std::optional<bool> overlap_comm;                // default: true for stage 3, else false
  bool allgather_partitions = true;
  bool round_robin_gradients = false;
  bool use_multi_rank_bucket_allreduce = true;
  std::int64_t sub_group_size = 1000000000;
  std::int64_t stage3_prefetch_bucket_size = 50000000;
  std::int64_t stage3_param_persistence_threshold = 100000;
  std::int64_t stage3_model_persistence_threshold = INT64_MAX;
  std::int64_t stage3_max_live_parameters = 1000000000;
  std::int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  // Stage 3 runs nn.Linear through DeepSpeed's own autograd function (zero3_linear_wrap for
  // F.linear), which adds a 3-D input's bias by a kernel of its own (zero::Event::unfused_bias).
  bool memory_efficient_linear = true;
  std::int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;             // ZeRO++ qwZ (accepted; warned, not modelled)
  bool zero_quantized_gradients = false;           // ZeRO++ qgZ (accepted; warned, not modelled)
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;

  bool overlap() const { return overlap_comm.value_or(stage == 3); }
  bool operator==(const ZeroConfig&) const = default;
};

enum class Precision { fp32, fp16, bf16 };

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;           // 0 → dynamic
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  double min_loss_scale = 1.0;
  bool operator==(const Fp16Config&) const = default;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

// DeepSpeed's `sparse_attention` section (block-sparse attention layouts).
struct SparseAttentionConfig {
  bool present = false;
  std::string mode = "fixed";        // dense, fixed, variable, bigbird, bslongformer
  std::int64_t block = 16;
  bool different_layout_per_head = false;
  std::int64_t num_local_blocks = 4;
  std::int64_t num_global_blocks = 1;
  std::string attention = "bidirectional";  // or unidirectional
  bool horizontal_global_attention = false;
  std::int64_t num_different_global_patterns = 1;
  std::int64_t num_random_blocks = 0;
  std::vector<std::int64_t> local_window_blocks{4};
  std::vector<std::int64_t> global_block_indices{0};
  std::vector<std::int64_t> global_block_end_indices;
  std::int64_t num_sliding_window_blocks = 3;
  bool operator==(const SparseAttentionConfig&) const = default;
};

struct DsConfig {
  std::string file;                  // where it was read from (for messages)
  nlohmann::json raw;                // the original document (the planner rewrites keys in it)

  // Batch: any two of the three determine the third (DeepSpeed's rule). Values as
  // written; resolve_batch() fills the rest for a world size.
  std::optional<std::int64_t> train_batch_size;
  std::optional<std::int64_t> train_micro_batch_size_per_gpu;
  std::optional<std::int64_t> gradient_accumulation_steps;

  OptimizerConfig optimizer;
  bool has_optimizer = false;        // no "optimizer" section: client optimizer, assume Adam
  Precision precision = Precision::fp32;
  Fp16Config fp16;
  bool bf16_immediate_grad_update = false;
  // bf16.check_grad_overflow (default true): stages 1/2 test every gradient for inf/NaN before
  // the step, as fp16 does, and skip the step on one (engine.py _configure_zero_optimizer).
  bool bf16_check_grad_overflow = true;
  // bf16 with "data_types": {"grad_accum_dtype": "fp32"} keeps fp32 gradient accumulation.
  std::optional<DType> grad_accum_dtype;
  DType communication_data_type() const;  // default: the precision's (engine.py communication_data_type)
  std::optional<DType> communication_data_type_override;
  double gradient_clipping = 0.0;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // wall_clock_breakdown (default false): DeepSpeed's timers synchronise the device at each
  // phase's start and end, so its iterations run with the phases apart (zero::phase_syncs_matter).
  bool wall_clock_breakdown = false;
  ZeroConfig zero;
  bool activation_checkpointing_present = false;
  ActivationCheckpointingConfig activation_checkpointing;
  SparseAttentionConfig sparse_attention;

  // Warnings for accepted-but-not-modelled sections (never silent); the CLI prints them.
  std::vector<std::string> warnings;

  // The dtype of the module DeepSpeed is handed, when neither fp16 nor bf16 is enabled: it
  // casts nothing then (engine.py _configure_distributed_model), so the model trains in the
  // dtype transformers built it in (models::ModelConfig::torch_dtype). Set by the caller
  // from the model config; not a DeepSpeed key.
  std::optional<DType> module_dtype;

  DType model_dtype() const;         // the params' and activations' dtype: the precision's, else module_dtype, else fp32
  DType precision_dtype() const;     // what the fp16/bf16 sections say (fp32 without either): engine.py's model_dtype
  DType grad_accum() const;          // data_types.grad_accum_dtype, else precision_dtype() (engine.py get_data_types)
};

// Sets cfg.module_dtype to the model config's torch_dtype when the ds_config enables neither
// fp16 nor bf16 (DeepSpeed then leaves the module in the dtype transformers built it in).
// Returns a note saying so when that is not fp32 (the caller prints it), else "".
std::string apply_module_dtype(DsConfig& cfg, std::optional<DType> torch_dtype, const std::string& model_file,
                               const std::string& key);

// The batch triple resolved for world size N (data-parallel degree).
struct Batch {
  std::int64_t train_batch_size = 0;
  std::int64_t micro_batch = 0;
  std::int64_t gas = 0;
};

// Parse a ds_config; `file` is used in messages. Bad input → zp::InputError.
DsConfig parse_ds_config(const std::string& file, const nlohmann::json& doc);
DsConfig load_ds_config(const std::string& path);
// A config with every default (no file): what `--ds-config` absent means.
DsConfig default_ds_config();

// DeepSpeed's consistency rule: train_batch_size == micro × GAS × N. Missing values are
// derived (GAS defaults to 1 when only train_batch_size is given...). Violations →
// InputError naming the keys and their values.
Batch resolve_batch(const DsConfig& cfg, std::int64_t world_size);

// Serialise back to ds_config JSON (raw with the modelled keys replaced by cfg's values).
nlohmann::json to_json(const DsConfig& cfg);
// Removes from a ds_config document the keys DeepSpeed 0.19 refuses (its removed features
// and legacy spellings; parse_ds_config warns about each), so that DeepSpeed accepts it.
void erase_refused_by_deepspeed(nlohmann::json& doc);

}  // namespace zp::zero
