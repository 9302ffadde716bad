// libFuzzer target: bytes → JSON → parse_ds_config → resolve_batch, plus the to_json
// round trip (a structure-aware mutator is at the end of the file). Bad input must
// surface as zp::InputError; any other exception, a sanitizer report, or a round trip
// that changes a field is a bug.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "zero/ds_config.hpp"

namespace {

using nlohmann::json;

// Keys and values the mutator draws from (the reader's vocabulary).
const std::vector<std::string>& fuzz_keys() {
  static const std::vector<std::string> k{
      "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "type",
      "params", "lr", "betas", "eps", "weight_decay", "momentum", "muon_lr", "max_grad_norm", "fp16", "enabled",
      "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale",
      "fp16_master_weights_and_grads", "bf16", "bfloat16", "immediate_grad_update", "bf16_master_weights_and_grads",
      "bf16_optimizer_states", "zero_optimization", "stage", "contiguous_gradients", "reduce_scatter",
      "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "allgather_partitions", "round_robin_gradients",
      "use_multi_rank_bucket_allreduce", "sub_group_size", "stage3_prefetch_bucket_size", "prefetch_bucket_size",
      "stage3_param_persistence_threshold", "param_persistence_threshold", "stage3_model_persistence_threshold",
      "stage3_max_live_parameters", "max_live_parameters", "stage3_max_reuse_distance", "max_reuse_distance",
      "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
      "gather_16bit_weights_on_model_save", "zero_hpz_partition_size", "zero_quantized_weights",
      "zero_quantized_gradients", "offload_optimizer", "offload_param", "device", "nvme_path", "pin_memory",
      "buffer_count", "buffer_size", "max_in_cpu", "ratio", "cpu_offload", "cpu_offload_param", "mics_shard_size",
      "allgather_size", "gradient_clipping", "prescale_gradients", "gradient_predivide_factor",
      "communication_data_type", "data_types", "grad_accum_dtype", "param_dtype", "activation_checkpointing",
      "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization", "number_checkpoints",
      "sparse_attention", "mode", "block", "different_layout_per_head", "num_local_blocks", "num_global_blocks",
      "attention", "horizontal_global_attention", "num_different_global_patterns", "num_random_blocks",
      "local_window_blocks", "global_block_indices", "global_block_end_indices", "num_sliding_window_blocks",
      "scheduler", "amp", "pipeline", "moe", "compile", "deepcompile", "sequence_parallel_size",
      "gradient_allreduce_op", "sparse_gradients", "managed_gradient_accumulation", "elasticity"};
  return k;
}

const std::vector<json>& fuzz_values() {
  static const std::vector<json> v{
      0, 1, -1, 2, 3, 4, 8, 64, 4096, 1.5, 0.5, 5e8, 1e9, 100000, 1e300, -1e300, 9007199254740993.0,
      std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
      std::numeric_limits<std::uint64_t>::max(), true, false, nullptr, "auto", "none", "cpu", "nvme", "fp16",
      "bf16", "fp32", "bfloat16", "float32", "half", "Adam", "adamw", "SGD", "Lamb", "Adagrad", "OneBitAdam",
      "Lion", "Muon", "fixed", "dense", "variable", "bigbird", "bslongformer", "unidirectional", "bidirectional",
      "mean", "sum", "", json::array(), json::object(), json::array({0}), json::array({4, 8}),
      json::array({0, 1}), json::array({1, 2}), json::array({0.9, 0.999}), json::object({{"enabled", true}}),
      json::object({{"stage", 3}}), json::object({{"device", "cpu"}}),
      json::object({{"device", "nvme"}, {"nvme_path", "/nvme"}})};
  return v;
}

using namespace zp::zero;

[[noreturn]] void bug(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_ds_config: %s: %s\n", what, detail.c_str());
  std::abort();
}

// One scratch file per process (parallel fuzzing jobs must not share it).
const std::string& scratch_path() {
  static const std::string p = "/tmp/fuzz_ds_config." + std::to_string(::getpid()) + ".json";
  return p;
}

bool same_fields(const DsConfig& a, const DsConfig& b) {
  return a.train_batch_size == b.train_batch_size &&
         a.train_micro_batch_size_per_gpu == b.train_micro_batch_size_per_gpu &&
         a.gradient_accumulation_steps == b.gradient_accumulation_steps &&
         a.has_optimizer == b.has_optimizer && a.optimizer == b.optimizer && a.precision == b.precision &&
         a.fp16 == b.fp16 && a.bf16_immediate_grad_update == b.bf16_immediate_grad_update &&
         a.bf16_check_grad_overflow == b.bf16_check_grad_overflow &&
         a.grad_accum_dtype == b.grad_accum_dtype &&
         a.communication_data_type_override == b.communication_data_type_override &&
         a.gradient_clipping == b.gradient_clipping && a.prescale_gradients == b.prescale_gradients &&
         a.gradient_predivide_factor == b.gradient_predivide_factor && a.zero == b.zero &&
         a.activation_checkpointing_present == b.activation_checkpointing_present &&
         a.activation_checkpointing == b.activation_checkpointing && a.sparse_attention == b.sparse_attention;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  json doc;
  try {
    doc = json::parse(data, data + size);
  } catch (const json::exception&) {
    // Not JSON: load_ds_config must still answer with an InputError (line and column
    // for syntax errors, and no leaked nlohmann exception for e.g. 1e400).
    const std::string path = scratch_path();
    if (FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(data, 1, size, f);
      std::fclose(f);
      try {
        (void)load_ds_config(path);
        bug("load_ds_config accepted what json::parse rejected", std::string(data, data + size));
      } catch (const zp::InputError& e) {
        if (std::string_view(e.what()).find(path) != 0) bug("error does not name the file", e.what());
      }
    }
    return 0;
  }

  DsConfig cfg;
  try {
    cfg = parse_ds_config("fuzz.json", doc);
  } catch (const zp::InputError&) {
    return 0;
  }

  for (const std::int64_t n : {1, 3, 64}) {
    try {
      const Batch b = resolve_batch(cfg, n);
      if (b.train_batch_size != b.micro_batch * b.gas * n || b.micro_batch < 1 || b.gas < 1)
        bug("resolve_batch broke train == micro * gas * N", doc.dump());
    } catch (const zp::InputError&) {
    }
  }
  (void)cfg.optimizer.state_bytes_per_param();
  (void)cfg.communication_data_type();

  // What to_json writes must be accepted again and read back to the same fields.
  const json out = to_json(cfg);
  DsConfig back;
  try {
    back = parse_ds_config("fuzz.json", out);
  } catch (const zp::InputError& e) {
    bug("to_json output rejected", std::string(e.what()) + "\n  input: " + doc.dump() + "\n  output: " + out.dump());
  }
  if (!same_fields(cfg, back)) bug("to_json round trip changed a field", doc.dump() + "\n  output: " + out.dump());
  return 0;
}

#include "fuzz/json_mutator.hpp"
