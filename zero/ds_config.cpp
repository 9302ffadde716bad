// Reading a DeepSpeed ds_config the way DeepSpeed reads it (key names, aliases,
// defaults and cross-checks of runtime/config.py, runtime/zero/config.py,
// runtime/zero/offload_config.py, runtime/precision_config.py,
// runtime/activation_checkpointing/config.py), but strictly: every key is known,
// every value is type- and range-checked, and sections that change memory or
// communication without being modelled are reported in DsConfig::warnings.
#include "zero/ds_config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json_util.hpp"

namespace zp::zero {

namespace {

using nlohmann::json;
using zp::json::Reader;
using Keys = std::vector<std::string>;

constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();
constexpr double kMaxD = std::numeric_limits<double>::max();

// ---------------------------------------------------------------------------------
// Key tables

// Top-level keys whose value zeroplan reads.
const Keys& modelled_top_keys() {
  static const Keys k{
      "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
      "optimizer", "fp16", "bf16", "bfloat16", "zero_optimization", "gradient_clipping",
      "prescale_gradients", "gradient_predivide_factor", "communication_data_type", "data_types",
      "activation_checkpointing", "sparse_attention"};
  return k;
}

// Top-level keys DeepSpeed reads that change neither memory nor communication:
// accepted, contents not inspected.
const Keys& ignored_top_keys() {
  static const Keys k{
      "scheduler", "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state",
      "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger",
      "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "dataloader_drop_last",
      "autotuning", "checkpoint", "data_efficiency", "curriculum_learning", "disable_allgather",
      "seq_parallel_communication_data_type", "timers", "vocabulary_size", "log_level", "nebula",
      "datastates_ckpt", "aio", "eigenvalue", "graph_harvesting",
      "use_data_before_expert_parallelism",
      "allgather_size",  // legacy: read with "zero_optimization": true
  };
  return k;
}

// Top-level keys that may change memory or communication but are not modelled; each
// one is checked below and warned about when it takes effect.
const Keys& warned_top_keys() {
  static const Keys k{
      "pipeline", "compression_training", "quantize_training", "weight_quantization", "amp",
      "torch_autocast", "tensor_parallel", "sequence_parallel_size", "data_parallel_size", "moe",
      "expert_parallel", "hybrid_engine", "compile", "progressive_layer_drop", "elasticity",
      "sparse_gradients", "managed_gradient_accumulation", "gradient_allreduce_op"};
  return k;
}

Keys all_top_keys() {
  Keys k = modelled_top_keys();
  for (const auto* l : {&ignored_top_keys(), &warned_top_keys()}) k.insert(k.end(), l->begin(), l->end());
  return k;
}

// zero_optimization fields with a pydantic alias: both spellings are accepted; the
// first (the spelling DeepSpeed documents) is the one written back.
struct Alias {
  const char* canonical;
  const char* alt;
};
constexpr Alias kZeroAliases[] = {
    {"stage3_prefetch_bucket_size", "prefetch_bucket_size"},
    {"stage3_param_persistence_threshold", "param_persistence_threshold"},
    {"stage3_model_persistence_threshold", "model_persistence_threshold"},
    {"stage3_max_live_parameters", "max_live_parameters"},
    {"stage3_max_reuse_distance", "max_reuse_distance"},
    {"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"},
    {"stage3_module_granularity_threshold", "module_granularity_threshold"},
    {"stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"},
    {"stage3_allgather_sequential", "allgather_sequential"},
};

Keys zero_keys() {
  Keys k{"stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
         "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
         "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint", "offload_param",
         "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
         "cpu_offload_use_pin_memory", "cpu_offload", "stage3_gather_fp16_weights_on_model_save",
         "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
         "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
         "zero_quantized_gradients", "zeropp_loco_param", "mics_shard_size",
         "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
         "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
         "save_muon_momentum_buffer_in_memory", "leaf_module", "compute_grad_norm", "parameter_alignment",
         "grad_hooks"};  // legacy: DeepSpeed 0.19 refuses it (kRefusedByDeepSpeed), old examples carry it
  for (const auto& a : kZeroAliases) {
    k.emplace_back(a.canonical);
    k.emplace_back(a.alt);
  }
  return k;
}

const Keys kOffloadOptimizerKeys{"device",         "nvme_path",  "buffer_count", "pin_memory",
                                 "pipeline_read",  "pipeline_write", "fast_init", "ratio",
                                 "super_offload",  "cpuadam_cores_perc"};
const Keys kOffloadParamKeys{"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                             "pin_memory"};
const Keys kFp16Keys{"enabled",    "auto_cast",           "loss_scale",
                     "initial_scale_power", "loss_scale_window", "hysteresis",
                     "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"};
const Keys kBf16Keys{"enabled", "immediate_grad_update", "check_grad_overflow",
                     "bf16_master_weights_and_grads", "bf16_optimizer_states",
                     "check_overflow"};  // legacy spelling of check_grad_overflow
const Keys kActCkptKeys{"partition_activations", "cpu_checkpointing",
                        "contiguous_memory_optimization", "number_checkpoints",
                        "synchronize_checkpoint_boundary", "profile"};
const Keys kDataTypesKeys{"grad_accum_dtype", "param_dtype", "buffer_dtype"};
const Keys kOptimizerKeys{"type", "params", "legacy_fusion"};

// Sparse attention: the keys DeepSpeed reads for each mode (runtime/config.py).
const Keys& sparse_keys(std::string_view mode) {
  static const Keys dense{"mode", "block"};
  static const Keys fixed{"mode", "block", "different_layout_per_head", "num_local_blocks",
                          "num_global_blocks", "attention", "horizontal_global_attention",
                          "num_different_global_patterns"};
  static const Keys variable{"mode", "block", "different_layout_per_head", "num_random_blocks",
                             "local_window_blocks", "global_block_indices",
                             "global_block_end_indices", "attention",
                             "horizontal_global_attention"};
  static const Keys bigbird{"mode", "block", "different_layout_per_head", "num_random_blocks",
                            "num_sliding_window_blocks", "num_global_blocks"};
  static const Keys bslongformer{"mode", "block", "different_layout_per_head",
                                 "num_sliding_window_blocks", "global_block_indices",
                                 "global_block_end_indices"};
  if (mode == "dense") return dense;
  if (mode == "variable") return variable;
  if (mode == "bigbird") return bigbird;
  if (mode == "bslongformer") return bslongformer;
  return fixed;
}
const Keys kSparseModes{"dense", "fixed", "variable", "bigbird", "bslongformer"};

// Optimizers. DeepSpeed lower-cases the names of its own optimizers and hands any other
// name to torch.optim (case-sensitive there); zeroplan matches all of them case-insensitively.
struct OptimizerSpec {
  const char* name;       // canonical spelling
  OptimizerType type;
  Keys params;            // constructor keywords DeepSpeed may pass through
};

const std::vector<OptimizerSpec>& optimizer_specs() {
  // Adam/AdamW go to FusedAdam, DeepSpeedCPUAdam (offload) or torch.optim.Adam(W)
  // (torch_adam); the union of their keywords is accepted.
  static const Keys adam{"lr", "betas", "eps", "weight_decay", "bias_correction", "amsgrad",
                         "adam_w_mode", "adamw_mode", "torch_adam", "set_grad_none",
                         "fp32_optimizer_states", "foreach", "maximize", "capturable",
                         "differentiable", "fused"};
  static const Keys lamb{"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt",
                         "max_coeff", "min_coeff", "amsgrad"};
  static const Keys onebit{"lr", "betas", "eps", "weight_decay", "bias_correction",
                           "eps_inside_sqrt", "amsgrad", "cuda_aware", "comm_backend_name",
                           "freeze_step"};
  static const Keys zeroone{"lr", "betas", "eps", "weight_decay", "bias_correction",
                            "eps_inside_sqrt", "amsgrad", "cuda_aware", "comm_backend_name",
                            "var_freeze_step", "var_update_scaler", "local_step_scaler",
                            "local_step_clipper"};
  static const Keys onebitlamb{"lr", "betas", "eps", "weight_decay", "bias_correction",
                               "eps_inside_sqrt", "amsgrad", "cuda_aware", "comm_backend_name",
                               "freeze_step", "max_coeff", "min_coeff", "coeff_beta",
                               "factor_max", "factor_min", "factor_threshold"};
  static const Keys adagrad{"lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value",
                            "amsgrad", "fp32_optimizer_states", "foreach", "maximize",
                            "differentiable", "fused"};
  static const Keys sgd{"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                        "foreach", "differentiable", "fused"};
  static const Keys lion{"lr", "betas", "weight_decay", "set_grad_none", "fp32_optimizer_states"};
  static const Keys muon{"lr", "momentum", "weight_decay", "ns_method", "muon_lr", "adam_lr",
                         "betas", "eps"};
  static const std::vector<OptimizerSpec> specs{
      {"Adam", OptimizerType::adam, adam},
      {"AdamW", OptimizerType::adamw, adam},
      {"SGD", OptimizerType::sgd, sgd},
      {"Lamb", OptimizerType::lamb, lamb},
      {"Adagrad", OptimizerType::adagrad, adagrad},
      {"OneBitAdam", OptimizerType::onebitadam, onebit},
      {"ZeroOneAdam", OptimizerType::zerooneadam, zeroone},
      {"OneBitLamb", OptimizerType::onebitlamb, onebitlamb},
      {"Lion", OptimizerType::lion, lion},
      {"Muon", OptimizerType::muon, muon},
      // mup's optimizers keep the same states as their plain counterparts.
      {"MuAdam", OptimizerType::adam, adam},
      {"MuAdamW", OptimizerType::adamw, adam},
      {"MuSGD", OptimizerType::sgd, sgd},
  };
  return specs;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string join(const Keys& k) {
  std::string out;
  for (const auto& s : k) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// ---------------------------------------------------------------------------------
// Reading helpers

std::string display_file(const DsConfig& cfg) {
  return cfg.file.empty() ? std::string("ds_config (defaults)") : cfg.file;
}

void warn_not_modelled(DsConfig& cfg, const std::string& key, std::string_view what) {
  cfg.warnings.push_back(fmt::format("{}: {}: accepted but not modelled: {}", display_file(cfg), key, what));
}

// Keys DeepSpeed 0.19 refuses that older releases accepted (runtime/config.py's
// _REMOVED_TOP_LEVEL_CONFIG_KEYS and _REMOVED_ZERO_CONFIG_KEYS, raised as DeepSpeedConfigError;
// and keys that are not fields of its validated section models, whose unknown keys are errors).
// zeroplan still reads them, so that an old config keeps its meaning, but says so, and never
// writes them (to_json), so every ds_config it writes is one DeepSpeed 0.19 accepts.
struct RefusedKey {
  const char* section;   // "" for top-level keys
  const char* key;
  const char* reason;    // DeepSpeed's reason
  const char* accepted;  // which releases accepted it, as a clause
};
constexpr const char* kRemovedIn019 =
    "DeepSpeed 0.18 and older accepted it (it went with the removals of deepspeedai/DeepSpeed#8489)";
constexpr RefusedKey kRefusedByDeepSpeed[] = {
    {"", "sparse_attention", "DeepSpeed Sparse Attention has been removed", kRemovedIn019},
    {"", "nebula", "Nebula checkpointing has been removed", kRemovedIn019},
    {"", "compression_training", "the DeepSpeed compression library has been removed", kRemovedIn019},
    {"", "amp", "NVIDIA Apex AMP integration has been removed (use fp16, bf16 or torch_autocast)", kRemovedIn019},
    {"", "quantize_training", "Mixture-of-Quantization (quantize_training) has been removed", kRemovedIn019},
    {"", "sparse_gradients", "sparse compression of dense embedding gradients has been removed", kRemovedIn019},
    {"", "eigenvalue", "eigenvalue-based Mixture-of-Quantization has been removed", kRemovedIn019},
    {"", "elasticity", "elastic training has been removed (set the batch keys directly)", kRemovedIn019},
    {"", "graph_harvesting", "graph harvesting has been removed", kRemovedIn019},
    {"", "curriculum_learning",
     "top-level curriculum_learning has been removed (use data_efficiency.data_sampling.curriculum_learning)",
     kRemovedIn019},
    {"", "progressive_layer_drop", "Progressive Layer Dropping has been removed", kRemovedIn019},
    {"zero_optimization", "mics_shard_size", "MiCS ZeRO-3 sharding has been removed", kRemovedIn019},
    {"zero_optimization", "mics_hierarchical_params_gather", "MiCS ZeRO-3 sharding has been removed", kRemovedIn019},
    {"zero_optimization", "zeropp_loco_param", "LoCo-Zero++ has been removed", kRemovedIn019},
    {"zero_optimization", "grad_hooks",
     "not a field of its ZeRO config, which refuses unknown keys (extra keys are forbidden)",
     "releases from before DeepSpeed validated its ZeRO config (0.6, 2022) ignored it"},
    {"bf16", "check_overflow", "not a field of its bf16 config",
     "its spelling is check_grad_overflow"},
};

void warn_refused_by_deepspeed(const json& doc, DsConfig& cfg) {
  for (const auto& k : kRefusedByDeepSpeed) {
    const json* sec = &doc;
    if (*k.section != '\0') {
      auto it = doc.find(k.section);
      if (it == doc.end() || !it->is_object()) continue;
      sec = &*it;
    }
    if (!sec->contains(k.key)) continue;
    const std::string path = *k.section != '\0' ? fmt::format("{}.{}", k.section, k.key) : std::string(k.key);
    cfg.warnings.push_back(fmt::format(
        "{}: {}: DeepSpeed 0.19 refuses this key: {}; {}. Remove it to run DeepSpeed 0.19 "
        "(the ds_configs zeroplan writes leave it out)",
        display_file(cfg), path, k.reason, k.accepted));
  }
}

void erase_refused_keys(json& out) {
  for (const auto& k : kRefusedByDeepSpeed) {
    if (*k.section == '\0') {
      out.erase(k.key);
    } else if (auto it = out.find(k.section); it != out.end() && it->is_object()) {
      it->erase(k.key);
    }
  }
}

bool has(const json& obj, std::string_view key) {
  if (!obj.is_object()) return false;
  auto it = obj.find(std::string(key));
  return it != obj.end() && !it->is_null();
}

// The Hugging Face Trainer writes "auto" for values it fills in before DeepSpeed sees
// the file, and DeepSpeed's own config models drop "auto" values (they take the
// default). zeroplan does the same, and says so. Keys in `keep` hold sub-sections: an
// "auto" there is not a value and stays, to be reported as "must be a JSON object".
json without_auto(const json& obj, const Reader& r, DsConfig& cfg, const Keys& keep) {
  json out = obj;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(keep.begin(), keep.end(), it.key()) != keep.end()) continue;
    if (it->is_string() && it->get_ref<const std::string&>() == "auto") {
      out.erase(it.key());
      cfg.warnings.push_back(fmt::format(
          "{}: {}: \"auto\" (a placeholder the Hugging Face Trainer fills in) read as DeepSpeed's default",
          display_file(cfg), r.key_path(it.key())));
    }
  }
  return out;
}

// A sub-section: must be an object (null counts as absent → empty object) whose keys
// are all in `known` (checked before "auto" values are dropped, so that a misspelled
// key is an error whatever its value). `subsections`: its keys that hold objects.
json section(const json& parent, std::string_view key, const Reader& r, DsConfig& cfg, const Keys& known,
             const Keys& subsections = {}) {
  auto it = parent.find(std::string(key));
  if (it == parent.end() || it->is_null()) return json::object();
  r.require_object(*it, key);
  r.sub(key).reject_unknown(*it, known);
  return without_auto(*it, r.sub(key), cfg, subsections);
}

// Of an aliased pair, the spelling present (the canonical one when neither is).
std::string aliased(const json& obj, const Alias& a, const Reader& r) {
  const bool c = has(obj, a.canonical), s = has(obj, a.alt);
  if (c && s)
    throw InputError(r.file, r.key_path(a.alt),
                     fmt::format("given twice, also as '{}'; keep one", a.canonical));
  return s ? a.alt : a.canonical;
}

std::optional<DType> dtype_from(std::string_view s) {
  // DeepSpeed's DtypeEnum spellings.
  for (const char* n : {"fp16", "float16", "half", "torch.float16"})
    if (iequals(s, n)) return DType::fp16;
  for (const char* n : {"bf16", "bfloat16", "torch.bfloat16"})
    if (iequals(s, n)) return DType::bf16;
  for (const char* n : {"fp32", "float32", "float", "torch.float32"})
    if (iequals(s, n)) return DType::fp32;
  return std::nullopt;
}

std::optional<DType> read_dtype(const json& obj, std::string_view key, const Reader& r) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return std::nullopt;
  constexpr std::string_view allowed =
      "one of fp16 (float16, half), bf16 (bfloat16), fp32 (float32, float)";
  if (!it->is_string())
    throw InputError(r.file, r.key_path(key), fmt::format("must be {}, got {}", allowed, it->dump()));
  auto d = dtype_from(it->get_ref<const std::string&>());
  if (!d) throw InputError(r.file, r.key_path(key), fmt::format("must be {}, got {}", allowed, it->dump()));
  return d;
}

// A list of integers >= lo (integral floats accepted, like scalar integers).
std::vector<std::int64_t> get_int_list(const json& obj, std::string_view key,
                                       const std::vector<std::int64_t>& dflt, std::int64_t lo,
                                       bool allow_empty, const Reader& r) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return dflt;
  const std::string what = fmt::format("a {}list of integers >= {}", allow_empty ? "" : "non-empty ", lo);
  if (!it->is_array() || (!allow_empty && it->empty()))
    throw InputError(r.file, r.key_path(key), fmt::format("must be {}, got {}", what, it->dump()));
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json wrapped = json::object({{"v", (*it)[i]}});
    try {
      out.push_back(*Reader{r.file, ""}.get_opt_int(wrapped, "v", lo, kMaxI64));
    } catch (const InputError&) {
      throw InputError(r.file, fmt::format("{}[{}]", r.key_path(key), i),
                       fmt::format("must be an integer >= {}, got {}", lo, (*it)[i].dump()));
    }
  }
  return out;
}

bool section_enabled(const json& doc, std::string_view key, const Reader& r, bool dflt = false) {
  auto it = doc.find(std::string(key));
  if (it == doc.end() || it->is_null()) return false;
  r.require_object(*it, key);
  return r.sub(key).get_bool(*it, "enabled", dflt);
}

// ---------------------------------------------------------------------------------
// Sections

void read_optimizer(const json& doc, const Reader& root, DsConfig& cfg) {
  if (!has(doc, "optimizer")) return;
  const Reader r = root.sub("optimizer");
  const json opt = section(doc, "optimizer", root, cfg, kOptimizerKeys, {"params"});
  r.get_bool(opt, "legacy_fusion", false);

  Keys names;
  for (const auto& s : optimizer_specs()) names.emplace_back(s.name);
  if (!has(opt, "type"))
    throw InputError(r.file, r.key_path("type"), fmt::format("must be set, one of {}", join(names)));
  const std::string type = r.get_enum(opt, "type", "", names);
  const OptimizerSpec* spec = nullptr;
  for (const auto& s : optimizer_specs())
    if (type == s.name) spec = &s;
  if (spec == nullptr) throw InputError(r.file, r.key_path("type"), "internal: optimizer table");

  cfg.has_optimizer = true;
  cfg.optimizer = OptimizerConfig{};
  cfg.optimizer.type = spec->type;
  cfg.optimizer.type_name = opt.at("type").get<std::string>();
  if (spec->type == OptimizerType::adagrad) cfg.optimizer.lr = 1e-2;
  if (spec->type == OptimizerType::muon) {
    cfg.optimizer.lr = 0.02;
    cfg.optimizer.momentum = 0.95;
  }

  const Reader pr = r.sub("params");
  if (auto p = opt.find("params"); p != opt.end() && p->is_object() && p->contains("max_grad_norm"))
    throw InputError(pr.file, pr.key_path("max_grad_norm"),
                     "not an optimizer parameter in DeepSpeed; use the top-level \"gradient_clipping\"");
  const json params = section(opt, "params", r, cfg, spec->params);
  const bool sgd_like = spec->type == OptimizerType::sgd || spec->type == OptimizerType::muon;
  cfg.optimizer.lr = pr.get_double(params, "lr", cfg.optimizer.lr, 0.0, kMaxD);
  cfg.optimizer.weight_decay = pr.get_double(params, "weight_decay", 0.0, 0.0, kMaxD);
  if (sgd_like) cfg.optimizer.momentum = pr.get_double(params, "momentum", cfg.optimizer.momentum, 0.0, kMaxD);
  if (spec->type == OptimizerType::muon) {
    cfg.optimizer.lr = pr.get_double(params, "muon_lr", cfg.optimizer.lr, 0.0, kMaxD);
    pr.get_double(params, "adam_lr", 0.0, 0.0, kMaxD);
    pr.get_enum(params, "ns_method", "gram", {"gram", "standard"});
  }
  if (spec->type == OptimizerType::sgd) pr.get_double(params, "dampening", 0.0, 0.0, kMaxD);
  cfg.optimizer.eps = pr.get_double(params, "eps", cfg.optimizer.eps, 0.0, kMaxD);
  if (auto it = params.find("betas"); it != params.end() && !it->is_null()) {
    bool ok = it->is_array() && it->size() == 2;
    for (std::size_t i = 0; ok && i < 2; ++i) {
      const auto& b = (*it)[i];
      ok = b.is_number() && std::isfinite(b.get<double>()) && b.get<double>() >= 0.0 && b.get<double>() < 1.0;
    }
    if (!ok)
      throw InputError(pr.file, pr.key_path("betas"),
                       fmt::format("must be a list of two numbers in [0, 1), got {}", it->dump()));
    cfg.optimizer.beta1 = (*it)[0].get<double>();
    cfg.optimizer.beta2 = (*it)[1].get<double>();
  }
  for (const char* m : {"adam_w_mode", "adamw_mode"})
    if (params.contains(m)) cfg.optimizer.adam_w_mode = pr.get_bool(params, m, true);
  for (const char* b : {"bias_correction", "amsgrad", "adam_w_mode", "adamw_mode", "torch_adam",
                        "set_grad_none", "fp32_optimizer_states", "eps_inside_sqrt", "cuda_aware",
                        "nesterov", "maximize"})
    if (params.contains(b)) pr.get_bool(params, b, false);
  if (spec->type == OptimizerType::muon)
    warn_not_modelled(cfg, r.key_path("type"),
                      "Muon's auxiliary Adam states for non-matrix parameters (all parameters are "
                      "counted with one 4-byte momentum)");
}

void read_precision(const json& doc, const Reader& root, DsConfig& cfg) {
  // fp16
  const Reader fr = root.sub("fp16");
  const json fp = section(doc, "fp16", root, cfg, kFp16Keys);
  Fp16Config& f = cfg.fp16;
  f.enabled = fr.get_bool(fp, "enabled", false);
  fr.get_bool(fp, "auto_cast", false);
  f.loss_scale = fr.get_double(fp, "loss_scale", 0.0, 0.0, kMaxD);
  f.initial_scale_power = fr.get_int(fp, "initial_scale_power", 16, 0, 1023);
  const bool dynamic = f.enabled && f.loss_scale == 0.0;
  f.loss_scale_window = fr.get_int(fp, "loss_scale_window", 1000, dynamic ? 1 : 0, kMaxI64);
  f.hysteresis = fr.get_int(fp, "hysteresis", 2, 0, kMaxI64);
  fr.get_bool(fp, "consecutive_hysteresis", false);
  // Kept as a double: limited to integers a double holds exactly.
  f.min_loss_scale = static_cast<double>(
      fr.get_int(fp, "min_loss_scale", 1, dynamic ? 1 : 0, std::int64_t{1} << 53));
  const bool fp16_master = fr.get_bool(fp, "fp16_master_weights_and_grads", false);

  // bf16 (DeepSpeed reads "bf16", and the old "bfloat16" only when "bf16" is absent)
  std::string bkey = "bf16";
  if (has(doc, "bfloat16")) {
    if (has(doc, "bf16"))  // precision_config.py: "bfloat16" is read only when "bf16" is absent
      cfg.warnings.push_back(fmt::format("{}: bfloat16: ignored, as DeepSpeed ignores it when \"bf16\" is given too; "
                                         "keep one",
                                         display_file(cfg)));
    else
      bkey = "bfloat16";
  }
  const Reader br = root.sub(bkey);
  const json bf = section(doc, bkey, root, cfg, kBf16Keys);
  const bool bf16 = br.get_bool(bf, "enabled", false);
  cfg.bf16_immediate_grad_update = br.get_bool(bf, "immediate_grad_update", false);
  cfg.bf16_check_grad_overflow = br.get_bool(bf, "check_grad_overflow", true);
  br.get_bool(bf, "check_overflow", false);
  const bool bf16_master = br.get_bool(bf, "bf16_master_weights_and_grads", false);
  const bool bf16_states = br.get_bool(bf, "bf16_optimizer_states", false);

  if (f.enabled && bf16)
    throw InputError(root.file, br.key_path("enabled"), "fp16 and bf16 cannot both be enabled; enable one");
  cfg.precision = f.enabled ? Precision::fp16 : (bf16 ? Precision::bf16 : Precision::fp32);

  const int stage = cfg.zero.stage;
  if (fp16_master) {
    if (stage < 1)
      throw InputError(root.file, fr.key_path("fp16_master_weights_and_grads"),
                       "needs zero_optimization.stage 1, 2 or 3");
    warn_not_modelled(cfg, fr.key_path("fp16_master_weights_and_grads"),
                      "fp16 master weights and gradients (memory is predicted for fp32 ones)");
  }
  if (bf16_master) {
    if (stage < 1)
      throw InputError(root.file, br.key_path("bf16_master_weights_and_grads"),
                       "needs zero_optimization.stage 1, 2 or 3");
    warn_not_modelled(cfg, br.key_path("bf16_master_weights_and_grads"),
                      "bf16 master weights and gradients (memory is predicted for fp32 ones)");
  }
  if (bf16_states) {
    if (stage < 1 || !bf16_master)
      throw InputError(root.file, br.key_path("bf16_optimizer_states"),
                       "needs zero_optimization.stage 1, 2 or 3 and bf16_master_weights_and_grads true");
    warn_not_modelled(cfg, br.key_path("bf16_optimizer_states"),
                      "bf16 optimizer states (memory is predicted for fp32 ones)");
  }
}

OffloadConfig read_offload(const json& z, std::string_view key, bool is_param, const Reader& zr,
                           DsConfig& cfg) {
  OffloadConfig o;
  o.pin_memory = true;                 // DeepSpeed's default
  o.buffer_count = is_param ? 5 : 4;   // DeepSpeedZeroOffloadParamConfig / ...OptimizerConfig
  const Reader r = zr.sub(key);
  const json s = section(z, key, zr, cfg, is_param ? kOffloadParamKeys : kOffloadOptimizerKeys);
  // OffloadDeviceEnum: pydantic matches its values as spelt ("CPU" is refused).
  const std::string dev = r.get_enum(s, "device", "none", {"none", "cpu", "nvme"}, true);
  o.device = dev == "cpu" ? OffloadDevice::cpu : (dev == "nvme" ? OffloadDevice::nvme : OffloadDevice::none);
  o.nvme_path = r.get_string(s, "nvme_path", "");
  if (o.device == OffloadDevice::nvme && o.nvme_path.empty())
    throw InputError(r.file, r.key_path("nvme_path"), "must be set (a directory) when device is nvme");
  o.pin_memory = r.get_bool(s, "pin_memory", true);
  o.buffer_count = r.get_int(s, "buffer_count", o.buffer_count, 0, kMaxI64);
  if (is_param) {
    o.buffer_size = r.get_int(s, "buffer_size", 100000000, 0, kMaxI64);
    o.max_in_cpu = r.get_int(s, "max_in_cpu", 1000000000, 0, kMaxI64);
  } else {
    for (const char* b : {"pipeline_read", "pipeline_write", "fast_init"}) r.get_bool(s, b, false);
    o.ratio = r.get_double(s, "ratio", 1.0, 0.0, 1.0);
    if (r.get_bool(s, "super_offload", false))
      warn_not_modelled(cfg, r.key_path("super_offload"), "SuperOffload's CPU/GPU optimizer split on Superchips");
    r.get_double(s, "cpuadam_cores_perc", 0.8, 0.0, 1.0);
  }
  return o;
}

void read_zero(const json& doc, const Reader& root, DsConfig& cfg) {
  ZeroConfig& zc = cfg.zero;
  zc = ZeroConfig{};
  zc.offload_optimizer.pin_memory = zc.offload_param.pin_memory = true;
  zc.offload_param.buffer_count = 5;
  auto it = doc.find("zero_optimization");
  if (it == doc.end() || it->is_null()) return;

  // Legacy form: "zero_optimization": true → stage 1, allgather size from "allgather_size".
  if (it->is_boolean()) {
    zc.stage = it->get<bool>() ? 1 : 0;
    if (zc.stage > 0) zc.allgather_bucket_size = root.get_int(doc, "allgather_size", zc.allgather_bucket_size, 0, kMaxI64);
    return;
  }
  const Reader r = root.sub("zero_optimization");
  const json z = section(doc, "zero_optimization", root, cfg, zero_keys(),
                         {"offload_optimizer", "offload_param", "zenflow", "zeropp_loco_param", "leaf_module"});

  const ZeroConfig d;  // the header's defaults are DeepSpeed's (REFERENCE.md §1)
  zc.stage = static_cast<int>(r.get_int(z, "stage", d.stage, 0, 3));
  zc.contiguous_gradients = r.get_bool(z, "contiguous_gradients", d.contiguous_gradients);
  zc.reduce_scatter = r.get_bool(z, "reduce_scatter", d.reduce_scatter);
  zc.reduce_bucket_size = r.get_int(z, "reduce_bucket_size", d.reduce_bucket_size, 1, kMaxI64);
  // DeepSpeedZeroConfig bounds it at >= 0. (DeepSpeedZeroOptimizer, the ZeRO 1/2 wrapper unless
  // BF16_Optimizer runs, also asserts an even value at construction; that depends on the stage
  // and precision the planner may change after reading, so it is not checked here.)
  zc.allgather_bucket_size = r.get_int(z, "allgather_bucket_size", d.allgather_bucket_size, 0, kMaxI64);
  if (has(z, "overlap_comm")) zc.overlap_comm = r.get_bool(z, "overlap_comm", false);
  zc.allgather_partitions = r.get_bool(z, "allgather_partitions", d.allgather_partitions);
  zc.round_robin_gradients = r.get_bool(z, "round_robin_gradients", d.round_robin_gradients);
  zc.memory_efficient_linear = r.get_bool(z, "memory_efficient_linear", d.memory_efficient_linear);
  zc.use_multi_rank_bucket_allreduce =
      r.get_bool(z, "use_multi_rank_bucket_allreduce", d.use_multi_rank_bucket_allreduce);
  zc.sub_group_size = r.get_int(z, "sub_group_size", d.sub_group_size, 0, kMaxI64);  // 0: a sub-group per param
  zc.stage3_prefetch_bucket_size =
      r.get_int(z, aliased(z, kZeroAliases[0], r), d.stage3_prefetch_bucket_size, 0, kMaxI64);  // 0: no prefetch
  zc.stage3_param_persistence_threshold =
      r.get_int(z, aliased(z, kZeroAliases[1], r), d.stage3_param_persistence_threshold, 0, kMaxI64);
  zc.stage3_model_persistence_threshold =
      r.get_int(z, aliased(z, kZeroAliases[2], r), d.stage3_model_persistence_threshold, 0, kMaxI64);
  zc.stage3_max_live_parameters =
      r.get_int(z, aliased(z, kZeroAliases[3], r), d.stage3_max_live_parameters, 0, kMaxI64);
  zc.stage3_max_reuse_distance =
      r.get_int(z, aliased(z, kZeroAliases[4], r), d.stage3_max_reuse_distance, 0, kMaxI64);

  // gather_16bit_weights_on_model_save: two aliases plus a deprecated fp16 spelling.
  {
    const std::string k16 = aliased(z, kZeroAliases[5], r);
    const char* dep = "stage3_gather_fp16_weights_on_model_save";
    if (has(z, dep) && has(z, k16))
      throw InputError(r.file, r.key_path(dep), fmt::format("deprecated spelling given together with '{}'; keep '{}'", k16, k16));
    zc.stage3_gather_16bit_weights_on_model_save = r.get_bool(z, has(z, dep) ? dep : k16.c_str(), false);
  }

  if (r.get_int(z, aliased(z, kZeroAliases[6], r), 0, 0, kMaxI64) > 0 && zc.stage == 3)
    warn_not_modelled(cfg, r.key_path(aliased(z, kZeroAliases[6], r)),
                      "grouping of fine-grained modules into one fetch");
  if (r.get_bool(z, aliased(z, kZeroAliases[7], r), false) && zc.stage == 3)
    warn_not_modelled(cfg, r.key_path(aliased(z, kZeroAliases[7], r)),
                      "all-reduce instead of all-gather for parameter fetches");
  if (r.get_bool(z, aliased(z, kZeroAliases[8], r), false) && zc.stage == 3)
    warn_not_modelled(cfg, r.key_path(aliased(z, kZeroAliases[8], r)),
                      "per-parameter sequential all-gathers without a flat buffer");

  // 0 and 1 both leave hpZ off (DeepSpeed tests > 1).
  zc.zero_hpz_partition_size = r.get_int(z, "zero_hpz_partition_size", d.zero_hpz_partition_size, 0, kMaxI64);
  zc.zero_quantized_weights = r.get_bool(z, "zero_quantized_weights", false);
  zc.zero_quantized_gradients = r.get_bool(z, "zero_quantized_gradients", false);
  if (zc.zero_quantized_weights)
    warn_not_modelled(cfg, r.key_path("zero_quantized_weights"),
                      "ZeRO++ qwZ int8 weight all-gathers (volume and buffers predicted at 16 bits)");
  if (zc.zero_quantized_gradients)
    warn_not_modelled(cfg, r.key_path("zero_quantized_gradients"),
                      "ZeRO++ qgZ int4 all-to-all gradient reduction (predicted as reduce-scatter at 16 bits)");
  if (r.get_bool(z, "zero_quantized_nontrainable_weights", false))
    warn_not_modelled(cfg, r.key_path("zero_quantized_nontrainable_weights"),
                      "int8 storage of frozen weights");
  if (has(z, "zeropp_loco_param")) {
    r.require_object(z.at("zeropp_loco_param"), "zeropp_loco_param");
    warn_not_modelled(cfg, r.key_path("zeropp_loco_param"), "LoCo error-feedback buffers of ZeRO++");
  }
  if (r.get_int(z, "mics_shard_size", -1, -1, kMaxI64) > 0)
    warn_not_modelled(cfg, r.key_path("mics_shard_size"),
                      "MiCS sharding within groups (predicted as sharding over all ranks)");
  r.get_bool(z, "mics_hierarchical_params_gather", false);
  if (has(z, "zenflow")) {
    r.require_object(z.at("zenflow"), "zenflow");
    warn_not_modelled(cfg, r.key_path("zenflow"), "ZenFlow's selective CPU/GPU optimizer updates");
  }
  if (has(z, "leaf_module")) r.require_object(z.at("leaf_module"), "leaf_module");
  if (r.get_bool(z, "legacy_stage1", false))
    warn_not_modelled(cfg, r.key_path("legacy_stage1"), "the legacy stage-1 implementation");
  for (const char* b : {"load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
                        "pipeline_loading_checkpoint", "override_module_apply",
                        "log_trace_cache_warnings", "enable_sanity_checks",
                        "save_muon_momentum_buffer_in_memory", "grad_hooks", "cpu_offload_use_pin_memory"})
    r.get_bool(z, b, false);

  // Offload, with the deprecated boolean spellings.
  zc.offload_optimizer = read_offload(z, "offload_optimizer", false, r, cfg);
  zc.offload_param = read_offload(z, "offload_param", true, r, cfg);
  // DeepSpeedConfigModel refuses a deprecated key given together with its new one, whatever
  // its value (config_utils.py; an explicit null is taken as absent here).
  for (const auto& [old_key, new_key] : {std::pair{"cpu_offload", "offload_optimizer"},
                                         std::pair{"cpu_offload_param", "offload_param"}})
    if (has(z, old_key) && has(z, new_key))
      throw InputError(r.file, r.key_path(old_key),
                       fmt::format("deprecated; cannot be given together with {} (keep {})", new_key, new_key));
  if (r.get_bool(z, "cpu_offload", false)) zc.offload_optimizer.device = OffloadDevice::cpu;
  if (r.get_bool(z, "cpu_offload_param", false)) zc.offload_param.device = OffloadDevice::cpu;
  if (zc.offload_optimizer.ratio < 1.0 && zc.stage != 3)
    throw InputError(r.file, r.key_path("offload_optimizer.ratio"),
                     "partial offload (ratio < 1) needs zero_optimization.stage 3");
  if (zc.offload_param.device != OffloadDevice::none && zc.stage != 3)
    cfg.warnings.push_back(fmt::format("{}: {}: takes effect only with stage 3; ignored",
                                       display_file(cfg), r.key_path("offload_param")));
}

void read_sparse_attention(const json& doc, const Reader& root, DsConfig& cfg) {
  if (!has(doc, "sparse_attention")) return;
  const Reader r = root.sub("sparse_attention");
  // Keys of no mode get the closest-key message; keys of another mode their own.
  Keys any;
  for (const auto& m : kSparseModes)
    for (const auto& k : sparse_keys(m))
      if (std::find(any.begin(), any.end(), k) == any.end()) any.push_back(k);
  const json s = section(doc, "sparse_attention", root, cfg, any);
  SparseAttentionConfig& sa = cfg.sparse_attention;
  sa = SparseAttentionConfig{};
  sa.present = true;
  sa.mode = r.get_enum(s, "mode", "fixed", kSparseModes);
  const Keys& own = sparse_keys(sa.mode);
  for (auto it = s.begin(); it != s.end(); ++it)
    if (std::find(own.begin(), own.end(), it.key()) == own.end())
      throw InputError(r.file, r.key_path(it.key()),
                       fmt::format("not used by mode \"{}\" (its keys: {})", sa.mode, join(own)));

  sa.block = r.get_int(s, "block", 16, 1, kMaxI64);
  sa.different_layout_per_head = r.get_bool(s, "different_layout_per_head", false);
  sa.attention = r.get_enum(s, "attention", "bidirectional", {"bidirectional", "unidirectional"});
  sa.horizontal_global_attention = r.get_bool(s, "horizontal_global_attention", false);
  if (sa.horizontal_global_attention && sa.attention != "bidirectional")
    throw InputError(r.file, r.key_path("horizontal_global_attention"),
                     "true needs attention \"bidirectional\"");
  sa.num_local_blocks = r.get_int(s, "num_local_blocks", 4, 1, kMaxI64);
  sa.num_global_blocks = r.get_int(s, "num_global_blocks", 1, 1, kMaxI64);
  sa.num_different_global_patterns = r.get_int(s, "num_different_global_patterns", 1, 1, kMaxI64);
  sa.num_random_blocks = r.get_int(s, "num_random_blocks", 0, 0, kMaxI64);
  sa.num_sliding_window_blocks = r.get_int(s, "num_sliding_window_blocks", 3, 1, kMaxI64);
  sa.local_window_blocks = get_int_list(s, "local_window_blocks", {4}, 1, false, r);
  sa.global_block_indices = get_int_list(s, "global_block_indices", {0}, 0, true, r);
  sa.global_block_end_indices = get_int_list(s, "global_block_end_indices", {}, 1, true, r);

  if (sa.mode == "fixed") {
    if (sa.num_local_blocks % sa.num_global_blocks != 0)
      throw InputError(r.file, r.key_path("num_global_blocks"),
                       fmt::format("must divide num_local_blocks ({}), got {}", sa.num_local_blocks,
                                   sa.num_global_blocks));
    if (sa.num_different_global_patterns > 1 && !sa.different_layout_per_head)
      throw InputError(r.file, r.key_path("num_different_global_patterns"),
                       "more than 1 needs different_layout_per_head true");
    if (sa.num_different_global_patterns > sa.num_local_blocks / sa.num_global_blocks)
      throw InputError(r.file, r.key_path("num_different_global_patterns"),
                       fmt::format("must be at most num_local_blocks / num_global_blocks ({}), got {}",
                                   sa.num_local_blocks / sa.num_global_blocks,
                                   sa.num_different_global_patterns));
  }
  if (has(s, "global_block_end_indices")) {
    if (sa.global_block_end_indices.size() != sa.global_block_indices.size())
      throw InputError(r.file, r.key_path("global_block_end_indices"),
                       fmt::format("must have as many entries as global_block_indices ({}), got {}",
                                   sa.global_block_indices.size(), sa.global_block_end_indices.size()));
    for (std::size_t i = 0; i < sa.global_block_end_indices.size(); ++i)
      if (sa.global_block_end_indices[i] <= sa.global_block_indices[i])
        throw InputError(r.file, fmt::format("{}[{}]", r.key_path("global_block_end_indices"), i),
                         fmt::format("must be greater than global_block_indices[{}] ({}), got {}", i,
                                     sa.global_block_indices[i], sa.global_block_end_indices[i]));
  }
}

void read_activation_checkpointing(const json& doc, const Reader& root, DsConfig& cfg) {
  cfg.activation_checkpointing_present = has(doc, "activation_checkpointing");
  const Reader r = root.sub("activation_checkpointing");
  const json a = section(doc, "activation_checkpointing", root, cfg, kActCkptKeys);
  ActivationCheckpointingConfig& ac = cfg.activation_checkpointing;
  ac.partition_activations = r.get_bool(a, "partition_activations", false);
  ac.cpu_checkpointing = r.get_bool(a, "cpu_checkpointing", false);
  ac.contiguous_memory_optimization = r.get_bool(a, "contiguous_memory_optimization", false);
  ac.number_checkpoints = r.get_opt_int(a, "number_checkpoints", 1, kMaxI64);
  ac.synchronize_checkpoint_boundary = r.get_bool(a, "synchronize_checkpoint_boundary", false);
  ac.profile = r.get_bool(a, "profile", false);
}

void read_data_types(const json& doc, const Reader& root, DsConfig& cfg) {
  const Reader r = root.sub("data_types");
  const json d = section(doc, "data_types", root, cfg, kDataTypesKeys);
  cfg.grad_accum_dtype = read_dtype(d, "grad_accum_dtype", r);
  if (auto p = read_dtype(d, "param_dtype", r); p && *p != cfg.model_dtype())
    throw InputError(r.file, r.key_path("param_dtype"),
                     fmt::format("must match the enabled precision ({}), got {}",
                                 dtype_name(cfg.model_dtype()), dtype_name(*p)));
  read_dtype(d, "buffer_dtype", r);
  // DeepSpeed has no ZeRO-0 path for a gradient-accumulation dtype other than the model's.
  if (cfg.grad_accum_dtype && *cfg.grad_accum_dtype != cfg.model_dtype() && cfg.zero.stage == 0)
    throw InputError(r.file, r.key_path("grad_accum_dtype"),
                     fmt::format("{} with {} parameters needs zero_optimization.stage 1, 2 or 3",
                                 dtype_name(*cfg.grad_accum_dtype), dtype_name(cfg.model_dtype())));
}

// Sections that change memory or communication but are not modelled.
void read_unmodelled(const json& doc, const Reader& r, DsConfig& cfg) {
  struct Always {
    const char* key;
    const char* what;
  };
  static constexpr Always always[] = {
      {"pipeline", "pipeline parallelism (stage partitioning, activation send/receive)"},
      {"compression_training", "compression training (quantization, pruning, layer reduction)"},
      {"quantize_training", "MoQ quantize-training of weights"},
      {"weight_quantization", "quantized weight storage"},
      {"tensor_parallel", "tensor parallelism (AutoTP); only data parallelism is modelled"},
      {"moe", "mixture-of-experts layers and expert all-to-all"},
  };
  for (const auto& a : always)
    if (has(doc, a.key)) warn_not_modelled(cfg, a.key, a.what);

  if (section_enabled(doc, "amp", r)) {
    if (cfg.zero.stage > 0)
      throw InputError(r.file, "amp.enabled", "Apex AMP cannot be combined with ZeRO (stage > 0); use fp16 or bf16");
    if (cfg.precision != Precision::fp32)
      throw InputError(r.file, "amp.enabled", "Apex AMP cannot be combined with fp16 or bf16; enable one");
    warn_not_modelled(cfg, "amp", "Apex AMP mixed precision (predicted as fp32 training)");
  }
  if (section_enabled(doc, "torch_autocast", r))
    warn_not_modelled(cfg, "torch_autocast", "torch.autocast lower-precision compute and its casted copies");
  if (section_enabled(doc, "expert_parallel", r))
    warn_not_modelled(cfg, "expert_parallel", "expert parallelism (AutoEP) and its all-to-all");
  if (section_enabled(doc, "hybrid_engine", r))
    warn_not_modelled(cfg, "hybrid_engine", "the RLHF hybrid engine's inference containers");
  if (section_enabled(doc, "progressive_layer_drop", r))
    warn_not_modelled(cfg, "progressive_layer_drop", "skipped layers (compute and activations of all layers predicted)");
  if (section_enabled(doc, "elasticity", r))
    warn_not_modelled(cfg, "elasticity", "elastic batch sizes (the batch values in this file are used)");
  if (has(doc, "compile")) {
    r.require_object(doc.at("compile"), "compile");
    if (r.sub("compile").get_bool(doc.at("compile"), "deepcompile", false))
      warn_not_modelled(cfg, "compile.deepcompile", "DeepCompile's compiler-scheduled ZeRO and offloads");
  }
  if (const auto sp = r.get_opt_int(doc, "sequence_parallel_size", 1, kMaxI64); sp && *sp > 1)
    warn_not_modelled(cfg, "sequence_parallel_size",
                      "Ulysses sequence parallelism (DeepSpeed divides the world size by it)");
  if (r.get_opt_int(doc, "data_parallel_size", 1, kMaxI64))
    warn_not_modelled(cfg, "data_parallel_size", "the device mesh; the world size is taken from the command line");
  if (r.get_bool(doc, "sparse_gradients", false))
    warn_not_modelled(cfg, "sparse_gradients", "sparse embedding gradients (predicted as dense all-reduce)");
  if (!r.get_bool(doc, "managed_gradient_accumulation", true))
    warn_not_modelled(cfg, "managed_gradient_accumulation", "user-managed gradient accumulation");
  if (r.get_enum(doc, "gradient_allreduce_op", "mean", {"mean", "sum"}) == "sum" && cfg.zero.stage == 3)
    throw InputError(r.file, "gradient_allreduce_op", "\"sum\" is not supported with ZeRO stage 3; use \"mean\"");
}

void check_optimizer_vs_zero(const Reader& r, const DsConfig& cfg) {
  if (!cfg.has_optimizer || cfg.zero.stage == 0) return;
  const auto t = cfg.optimizer.type;
  if (t == OptimizerType::onebitadam || t == OptimizerType::zerooneadam || t == OptimizerType::onebitlamb)
    throw InputError(r.file, "optimizer.type",
                     fmt::format("{} is not compatible with ZeRO; use zero_optimization.stage 0",
                                 cfg.optimizer.type_name));
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& file, const std::string& key) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    throw InputError(file, key, fmt::format("{} × {} does not fit in a 64-bit integer", a, b));
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------

std::int64_t OptimizerConfig::state_bytes_per_param() const {
  switch (type) {
    case OptimizerType::adam:
    case OptimizerType::adamw:
    case OptimizerType::lamb:
    case OptimizerType::onebitadam:
    case OptimizerType::zerooneadam:
    case OptimizerType::onebitlamb: return 8;
    case OptimizerType::sgd: return momentum > 0.0 ? 4 : 0;
    case OptimizerType::adagrad: return 4;
    case OptimizerType::lion: return 4;
    case OptimizerType::muon: return 4;
  }
  return 8;
}

DType DsConfig::precision_dtype() const {
  switch (precision) {
    case Precision::fp16: return DType::fp16;
    case Precision::bf16: return DType::bf16;
    case Precision::fp32: return DType::fp32;
  }
  return DType::fp32;
}

DType DsConfig::model_dtype() const {
  if (precision == Precision::fp32 && module_dtype) return *module_dtype;
  return precision_dtype();
}

std::string apply_module_dtype(DsConfig& cfg, std::optional<DType> torch_dtype, const std::string& model_file,
                               const std::string& key) {
  if (cfg.precision != Precision::fp32 || !torch_dtype) return {};
  cfg.module_dtype = *torch_dtype;
  if (*torch_dtype == DType::fp32) return {};
  return fmt::format("{}: {} {}: with neither fp16 nor bf16 enabled in {}, DeepSpeed does not cast the model, so it "
                     "trains in {} as transformers builds it ({} params and activations; stage 0 runs the plain "
                     "optimizer on them, stages 1-3 keep fp32 master partitions and accumulate gradients in fp32)",
                     model_file, key, dtype_name(*torch_dtype), cfg.file.empty() ? "the ds_config" : cfg.file,
                     dtype_name(*torch_dtype), dtype_name(*torch_dtype));
}

DType DsConfig::grad_accum() const { return grad_accum_dtype.value_or(precision_dtype()); }

DType DsConfig::communication_data_type() const {
  return communication_data_type_override.value_or(precision_dtype());
}

DsConfig parse_ds_config(const std::string& file, const nlohmann::json& doc) {
  DsConfig cfg;
  cfg.file = file;
  const Reader r{file.empty() ? std::string("ds_config (defaults)") : file, ""};
  if (!doc.is_object())
    throw InputError(r.file, "", fmt::format("a ds_config must be a JSON object, got {}", doc.type_name()));
  cfg.raw = doc;
  r.reject_unknown(doc, all_top_keys());
  // Only the modelled scalar keys may be "auto" at the top level; sections keep theirs
  // (an ignored section is not inspected, a modelled one must be an object).
  Keys keep = all_top_keys();
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                        "gradient_clipping", "prescale_gradients", "gradient_predivide_factor",
                        "communication_data_type"})
    keep.erase(std::find(keep.begin(), keep.end(), k));
  const json top = without_auto(doc, r, cfg, keep);

  cfg.train_batch_size = r.get_opt_int(top, "train_batch_size", 1, kMaxI64);
  cfg.train_micro_batch_size_per_gpu = r.get_opt_int(top, "train_micro_batch_size_per_gpu", 1, kMaxI64);
  cfg.gradient_accumulation_steps = r.get_opt_int(top, "gradient_accumulation_steps", 1, kMaxI64);

  read_zero(top, r, cfg);
  read_precision(top, r, cfg);
  read_optimizer(top, r, cfg);
  check_optimizer_vs_zero(r, cfg);
  read_data_types(top, r, cfg);

  if (auto it = top.find("communication_data_type"); it != top.end() && !it->is_null()) {
    const std::string c = r.get_enum(top, "communication_data_type", "", {"fp16", "bf16", "fp32"});
    cfg.communication_data_type_override = c == "fp16" ? DType::fp16 : (c == "bf16" ? DType::bf16 : DType::fp32);
  }
  cfg.gradient_clipping = r.get_double(top, "gradient_clipping", 0.0, 0.0, kMaxD);  // constants.py: 0 (off)
  cfg.prescale_gradients = r.get_bool(top, "prescale_gradients", false);
  cfg.wall_clock_breakdown = r.get_bool(top, "wall_clock_breakdown", false);
  cfg.gradient_predivide_factor = r.get_double(top, "gradient_predivide_factor", 1.0, 0.0, kMaxD);
  if (cfg.gradient_predivide_factor <= 0.0)
    throw InputError(r.file, "gradient_predivide_factor", "must be a number > 0, got 0");

  read_activation_checkpointing(top, r, cfg);
  read_sparse_attention(top, r, cfg);
  read_unmodelled(top, r, cfg);
  warn_refused_by_deepspeed(doc, cfg);
  return cfg;
}

DsConfig load_ds_config(const std::string& path) {
  json doc;
  try {
    doc = zp::json::parse_file(path);
  } catch (const json::exception& e) {
    // parse_file reports syntax errors with line and column; nlohmann reports a number
    // too large for a double (1e400) as out_of_range, which must not escape either.
    std::string what = e.what();
    if (const auto p = what.find("] "); p != std::string::npos) what.erase(0, p + 2);
    throw InputError(path, "", fmt::format("malformed JSON: {}", what));
  }
  return parse_ds_config(path, doc);
}

DsConfig default_ds_config() { return parse_ds_config("", nlohmann::json::object()); }

Batch resolve_batch(const DsConfig& cfg, std::int64_t world_size) {
  const std::string file = display_file(cfg);
  if (world_size < 1)
    throw InputError(file, "world size", fmt::format("must be an integer >= 1, got {}", world_size));
  const auto& tb = cfg.train_batch_size;
  const auto& mb = cfg.train_micro_batch_size_per_gpu;
  const auto& ga = cfg.gradient_accumulation_steps;
  for (const auto& [v, k] : {std::pair{tb, "train_batch_size"}, std::pair{mb, "train_micro_batch_size_per_gpu"},
                             std::pair{ga, "gradient_accumulation_steps"}})
    if (v && *v < 1) throw InputError(file, k, fmt::format("must be an integer >= 1, got {}", *v));

  const std::string N = fmt::format("world size ({})", world_size);
  Batch b;
  if (tb && mb && ga) {
    const std::int64_t prod = checked_mul(checked_mul(*mb, *ga, file, "train_batch_size"), world_size, file,
                                          "train_batch_size");
    if (prod != *tb)
      throw InputError(file, "train_batch_size",
                       fmt::format("{} != train_micro_batch_size_per_gpu ({}) × gradient_accumulation_steps ({}) × "
                                   "{} = {}",
                                   *tb, *mb, *ga, N, prod));
    b = {*tb, *mb, *ga};
  } else if (tb && mb) {
    const std::int64_t d = checked_mul(*mb, world_size, file, "train_micro_batch_size_per_gpu");
    if (*tb % d != 0)
      throw InputError(file, "train_batch_size",
                       fmt::format("{} is not divisible by train_micro_batch_size_per_gpu ({}) × {}", *tb, *mb, N));
    b = {*tb, *mb, *tb / d};
  } else if (tb && ga) {
    const std::int64_t d = checked_mul(*ga, world_size, file, "gradient_accumulation_steps");
    if (*tb % d != 0)
      throw InputError(file, "train_batch_size",
                       fmt::format("{} is not divisible by gradient_accumulation_steps ({}) × {}", *tb, *ga, N));
    b = {*tb, *tb / d, *ga};
  } else if (mb && ga) {
    const std::int64_t t = checked_mul(checked_mul(*mb, *ga, file, "train_micro_batch_size_per_gpu"), world_size,
                                       file, "train_micro_batch_size_per_gpu");
    b = {t, *mb, *ga};
  } else if (tb) {
    if (*tb % world_size != 0)
      throw InputError(file, "train_batch_size", fmt::format("{} is not divisible by {}", *tb, N));
    b = {*tb, *tb / world_size, 1};
  } else if (mb) {
    b = {checked_mul(*mb, world_size, file, "train_micro_batch_size_per_gpu"), *mb, 1};
  } else {
    // Hugging Face's "auto" placeholders read as absent: say so, and what to pass instead.
    const auto was_auto = [&](std::string_view key) {
      for (const auto& w : cfg.warnings)
        if (w.find(fmt::format(": {}: \"auto\"", key)) != std::string::npos) return true;
      return false;
    };
    if (was_auto("train_batch_size") || was_auto("train_micro_batch_size_per_gpu"))
      throw InputError(file, "train_batch_size",
                       "the batch sizes are \"auto\" (placeholders the Hugging Face Trainer fills in from its own "
                       "arguments), so no batch size is set; pass --micro-batch B (or, for plan, --global-batch G), or "
                       "write the numbers into the file");
    throw InputError(file, "train_batch_size", "train_batch_size or train_micro_batch_size_per_gpu must be set");
  }
  // A step program numbers its micro-steps in 16 bits.
  constexpr std::int64_t kMaxGas = 32767;
  if (b.gas > kMaxGas)
    throw InputError(file, "gradient_accumulation_steps",
                     fmt::format("{} micro-steps per optimizer step; at most {} are supported", b.gas, kMaxGas));
  return b;
}

// ---------------------------------------------------------------------------------
// Writing back

namespace {

// Writes `v` under `key` when it differs from the default or the key was already there.
template <class T>
void put(json& obj, const std::string& key, const T& v, const T& dflt) {
  if (obj.contains(key) || !(v == dflt)) obj[key] = v;
}

json offload_json(const json& old, const OffloadConfig& o, bool is_param) {
  json s = old.is_object() ? old : json::object();
  s["device"] = o.device == OffloadDevice::cpu ? "cpu" : (o.device == OffloadDevice::nvme ? "nvme" : "none");
  if (o.nvme_path.empty()) s.erase("nvme_path");
  else s["nvme_path"] = o.nvme_path;
  put(s, "pin_memory", o.pin_memory, true);
  put(s, "buffer_count", o.buffer_count, std::int64_t{is_param ? 5 : 4});
  if (is_param) {
    put(s, "buffer_size", o.buffer_size, std::int64_t{100000000});
    put(s, "max_in_cpu", o.max_in_cpu, std::int64_t{1000000000});
  } else {
    put(s, "ratio", o.ratio, 1.0);
  }
  return s;
}

}  // namespace

void erase_refused_by_deepspeed(nlohmann::json& doc) { erase_refused_keys(doc); }

nlohmann::json to_json(const DsConfig& cfg) {
  json out = cfg.raw.is_object() ? cfg.raw : json::object();

  // Batch triple.
  const std::pair<const char*, const std::optional<std::int64_t>*> batch[] = {
      {"train_batch_size", &cfg.train_batch_size},
      {"train_micro_batch_size_per_gpu", &cfg.train_micro_batch_size_per_gpu},
      {"gradient_accumulation_steps", &cfg.gradient_accumulation_steps}};
  for (const auto& [k, v] : batch) {
    if (*v) out[k] = **v;
    else out.erase(k);
  }

  // zero_optimization.
  {
    const ZeroConfig& zc = cfg.zero;
    const ZeroConfig dz;
    json z = out.contains("zero_optimization") && out["zero_optimization"].is_object()
                 ? out["zero_optimization"]
                 : json::object();
    if (out.contains("zero_optimization") && out["zero_optimization"].is_boolean()) out.erase("allgather_size");
    // Every spelling of an aliased key is written back as the canonical one.
    for (const auto& a : kZeroAliases)
      if (z.contains(a.alt)) {
        z[a.canonical] = z[a.alt];
        z.erase(a.alt);
      }
    if (z.contains("stage3_gather_fp16_weights_on_model_save")) {
      z["stage3_gather_16bit_weights_on_model_save"] = z["stage3_gather_fp16_weights_on_model_save"];
      z.erase("stage3_gather_fp16_weights_on_model_save");
    }
    for (const char* k : {"cpu_offload", "cpu_offload_param"}) z.erase(k);

    z["stage"] = zc.stage;
    put(z, "contiguous_gradients", zc.contiguous_gradients, dz.contiguous_gradients);
    put(z, "reduce_scatter", zc.reduce_scatter, dz.reduce_scatter);
    put(z, "reduce_bucket_size", zc.reduce_bucket_size, dz.reduce_bucket_size);
    put(z, "allgather_bucket_size", zc.allgather_bucket_size, dz.allgather_bucket_size);
    if (zc.overlap_comm) z["overlap_comm"] = *zc.overlap_comm;
    else z.erase("overlap_comm");
    put(z, "allgather_partitions", zc.allgather_partitions, dz.allgather_partitions);
    put(z, "round_robin_gradients", zc.round_robin_gradients, dz.round_robin_gradients);
    put(z, "memory_efficient_linear", zc.memory_efficient_linear, dz.memory_efficient_linear);
    put(z, "use_multi_rank_bucket_allreduce", zc.use_multi_rank_bucket_allreduce, dz.use_multi_rank_bucket_allreduce);
    put(z, "sub_group_size", zc.sub_group_size, dz.sub_group_size);
    put(z, "stage3_prefetch_bucket_size", zc.stage3_prefetch_bucket_size, dz.stage3_prefetch_bucket_size);
    put(z, "stage3_param_persistence_threshold", zc.stage3_param_persistence_threshold,
        dz.stage3_param_persistence_threshold);
    put(z, "stage3_model_persistence_threshold", zc.stage3_model_persistence_threshold,
        dz.stage3_model_persistence_threshold);
    put(z, "stage3_max_live_parameters", zc.stage3_max_live_parameters, dz.stage3_max_live_parameters);
    put(z, "stage3_max_reuse_distance", zc.stage3_max_reuse_distance, dz.stage3_max_reuse_distance);
    put(z, "stage3_gather_16bit_weights_on_model_save", zc.stage3_gather_16bit_weights_on_model_save,
        dz.stage3_gather_16bit_weights_on_model_save);
    put(z, "zero_hpz_partition_size", zc.zero_hpz_partition_size, dz.zero_hpz_partition_size);
    put(z, "zero_quantized_weights", zc.zero_quantized_weights, dz.zero_quantized_weights);
    put(z, "zero_quantized_gradients", zc.zero_quantized_gradients, dz.zero_quantized_gradients);
    const std::pair<const char*, const OffloadConfig*> offs[] = {{"offload_optimizer", &zc.offload_optimizer},
                                                                 {"offload_param", &zc.offload_param}};
    for (const auto& [k, o] : offs) {
      const bool is_param = std::string_view(k) == "offload_param";
      if (o->device != OffloadDevice::none || has(z, k)) z[k] = offload_json(z.value(k, json()), *o, is_param);
    }
    out["zero_optimization"] = z;
  }

  // Precision: fp16 / bf16 ("bfloat16" is written back as "bf16").
  {
    json fp = out.contains("fp16") && out["fp16"].is_object() ? out["fp16"] : json::object();
    const Fp16Config df;
    fp["enabled"] = cfg.precision == Precision::fp16;
    put(fp, "loss_scale", cfg.fp16.loss_scale, df.loss_scale);
    put(fp, "initial_scale_power", cfg.fp16.initial_scale_power, df.initial_scale_power);
    put(fp, "loss_scale_window", cfg.fp16.loss_scale_window, df.loss_scale_window);
    put(fp, "hysteresis", cfg.fp16.hysteresis, df.hysteresis);
    if (fp.contains("min_loss_scale") || cfg.fp16.min_loss_scale != df.min_loss_scale)
      fp["min_loss_scale"] = static_cast<std::int64_t>(cfg.fp16.min_loss_scale);
    if (cfg.precision == Precision::fp16 || out.contains("fp16") || fp.size() > 1) out["fp16"] = fp;

    json bf = json::object();
    if (out.contains("bf16") && out["bf16"].is_object()) bf = out["bf16"];
    else if (out.contains("bfloat16") && out["bfloat16"].is_object()) bf = out["bfloat16"];
    const bool had_bf = out.contains("bf16") || out.contains("bfloat16");
    out.erase("bfloat16");
    bf["enabled"] = cfg.precision == Precision::bf16;
    put(bf, "immediate_grad_update", cfg.bf16_immediate_grad_update, false);
    put(bf, "check_grad_overflow", cfg.bf16_check_grad_overflow, true);
    if (cfg.precision == Precision::bf16 || had_bf) out["bf16"] = bf;
  }

  // Gradient and communication settings.
  if (cfg.communication_data_type_override)
    out["communication_data_type"] = std::string(dtype_name(*cfg.communication_data_type_override));
  else out.erase("communication_data_type");
  if (cfg.grad_accum_dtype) {
    if (!out.contains("data_types") || !out["data_types"].is_object()) out["data_types"] = json::object();
    out["data_types"]["grad_accum_dtype"] = std::string(dtype_name(*cfg.grad_accum_dtype));
  } else if (out.contains("data_types") && out["data_types"].is_object()) {
    out["data_types"].erase("grad_accum_dtype");
  }
  put(out, "gradient_clipping", cfg.gradient_clipping, 0.0);
  put(out, "prescale_gradients", cfg.prescale_gradients, false);
  put(out, "wall_clock_breakdown", cfg.wall_clock_breakdown, false);
  put(out, "gradient_predivide_factor", cfg.gradient_predivide_factor, 1.0);

  // Activation checkpointing.
  {
    const ActivationCheckpointingConfig& ac = cfg.activation_checkpointing;
    if (cfg.activation_checkpointing_present || !(ac == ActivationCheckpointingConfig{})) {
      json a = out.contains("activation_checkpointing") && out["activation_checkpointing"].is_object()
                   ? out["activation_checkpointing"]
                   : json::object();
      a["partition_activations"] = ac.partition_activations;
      a["cpu_checkpointing"] = ac.cpu_checkpointing;
      a["contiguous_memory_optimization"] = ac.contiguous_memory_optimization;
      if (ac.number_checkpoints) a["number_checkpoints"] = *ac.number_checkpoints;
      else a.erase("number_checkpoints");
      a["synchronize_checkpoint_boundary"] = ac.synchronize_checkpoint_boundary;
      a["profile"] = ac.profile;
      out["activation_checkpointing"] = a;
    } else {
      out.erase("activation_checkpointing");
    }
  }

  // Optimizer.
  if (cfg.has_optimizer) {
    json o = out.contains("optimizer") && out["optimizer"].is_object() ? out["optimizer"] : json::object();
    o["type"] = cfg.optimizer.type_name;
    json p = o.contains("params") && o["params"].is_object() ? o["params"] : json::object();
    const OptimizerType t = cfg.optimizer.type;
    if (t == OptimizerType::muon) p.erase("muon_lr");
    p["lr"] = cfg.optimizer.lr;
    put(p, "weight_decay", cfg.optimizer.weight_decay, 0.0);
    if (t == OptimizerType::sgd || t == OptimizerType::muon) p["momentum"] = cfg.optimizer.momentum;
    o["params"] = p;
    out["optimizer"] = o;
  } else {
    out.erase("optimizer");
  }

  // Keys DeepSpeed 0.19 refuses (sparse_attention among them) are never written.
  erase_refused_keys(out);
  return out;
}

}  // namespace zp::zero
