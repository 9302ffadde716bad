// ds_config parsing: DeepSpeed's defaults, aliases, the batch rule, every kind of bad
// input (one line naming file and key), and the round trip through to_json().
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include <doctest/doctest.h>

#include "test_util.hpp"
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "zero/ds_config.hpp"

using nlohmann::json;
using zp::DType;
using zp::InputError;
using namespace zp::zero;

namespace {

DsConfig parse(const std::string& text) { return parse_ds_config("cfg.json", json::parse(text)); }

// The InputError message for `text` (fails the test when there is none).
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for " << text);
  return {};
}

std::string batch_error(const DsConfig& cfg, std::int64_t n) {
  try {
    resolve_batch(cfg, n);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for world size " << n);
  return {};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every field parse() fills (not file, raw, warnings).
void check_same_fields(const DsConfig& a, const DsConfig& b) {
  CHECK(a.train_batch_size == b.train_batch_size);
  CHECK(a.train_micro_batch_size_per_gpu == b.train_micro_batch_size_per_gpu);
  CHECK(a.gradient_accumulation_steps == b.gradient_accumulation_steps);
  CHECK(a.has_optimizer == b.has_optimizer);
  CHECK(a.optimizer == b.optimizer);
  CHECK(a.precision == b.precision);
  CHECK(a.fp16 == b.fp16);
  CHECK(a.bf16_immediate_grad_update == b.bf16_immediate_grad_update);
  CHECK(a.grad_accum_dtype == b.grad_accum_dtype);
  CHECK(a.communication_data_type_override == b.communication_data_type_override);
  CHECK(a.gradient_clipping == b.gradient_clipping);
  CHECK(a.prescale_gradients == b.prescale_gradients);
  CHECK(a.gradient_predivide_factor == b.gradient_predivide_factor);
  CHECK(a.zero == b.zero);
  CHECK(a.activation_checkpointing_present == b.activation_checkpointing_present);
  CHECK(a.activation_checkpointing == b.activation_checkpointing);
  // sparse_attention is read but never written: DeepSpeed 0.19 refuses it.
  CHECK_FALSE(b.sparse_attention.present);
}

void check_round_trip(const std::string& text) {
  INFO(text);
  const DsConfig a = parse(text);
  const json out = to_json(a);
  const DsConfig b = parse_ds_config("out.json", out);
  check_same_fields(a, b);
  // Writing again gives the same document.
  CHECK(to_json(b) == out);
}

const std::string kExample = std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json";

}  // namespace

TEST_CASE("defaults are DeepSpeed's (REFERENCE.md §1)") {
  const DsConfig d = default_ds_config();
  const ZeroConfig& z = d.zero;
  CHECK(z.stage == 0);
  CHECK(z.contiguous_gradients == true);
  CHECK(z.reduce_scatter == true);
  CHECK(z.reduce_bucket_size == 500000000);
  CHECK(z.allgather_bucket_size == 500000000);
  CHECK_FALSE(z.overlap_comm.has_value());
  CHECK(z.overlap() == false);
  CHECK(z.round_robin_gradients == false);
  CHECK(z.memory_efficient_linear == true);  // DeepSpeed's default: stage 3's own linear function
  CHECK(z.use_multi_rank_bucket_allreduce == true);
  CHECK(z.sub_group_size == 1000000000);
  CHECK(z.stage3_prefetch_bucket_size == 50000000);
  CHECK(z.stage3_param_persistence_threshold == 100000);
  CHECK(z.stage3_model_persistence_threshold == std::numeric_limits<std::int64_t>::max());
  CHECK(z.stage3_max_live_parameters == 1000000000);
  CHECK(z.stage3_max_reuse_distance == 1000000000);
  CHECK(z.zero_hpz_partition_size == 1);
  CHECK(z.allgather_partitions == true);
  CHECK(z.stage3_gather_16bit_weights_on_model_save == false);
  CHECK(z.zero_quantized_weights == false);
  CHECK(z.zero_quantized_gradients == false);
  // Offload sections (offload_config.py).
  CHECK(z.offload_optimizer.device == OffloadDevice::none);
  CHECK(z.offload_param.device == OffloadDevice::none);
  CHECK(z.offload_optimizer.pin_memory == true);
  CHECK(z.offload_optimizer.buffer_count == 4);
  CHECK(z.offload_optimizer.ratio == 1.0);
  CHECK(z.offload_param.buffer_count == 5);
  CHECK(z.offload_param.buffer_size == 100000000);
  CHECK(z.offload_param.max_in_cpu == 1000000000);
  // Top level.
  CHECK_FALSE(d.train_batch_size);
  CHECK_FALSE(d.train_micro_batch_size_per_gpu);
  CHECK_FALSE(d.gradient_accumulation_steps);
  CHECK(d.precision == Precision::fp32);
  CHECK(d.model_dtype() == DType::fp32);
  CHECK(d.communication_data_type() == DType::fp32);
  CHECK(d.gradient_clipping == 0.0);  // runtime/constants.py GRADIENT_CLIPPING_DEFAULT = 0 (off)
  CHECK(d.gradient_predivide_factor == 1.0);
  CHECK(d.prescale_gradients == false);
  CHECK_FALSE(d.has_optimizer);
  CHECK(d.optimizer.type == OptimizerType::adam);
  CHECK(d.fp16 == Fp16Config{});
  CHECK(d.bf16_immediate_grad_update == false);
  CHECK_FALSE(d.activation_checkpointing_present);
  CHECK(d.activation_checkpointing == ActivationCheckpointingConfig{});
  CHECK_FALSE(d.sparse_attention.present);
  CHECK(d.warnings.empty());
  // An empty file, or empty sections, give the same.
  check_same_fields(parse("{}"), d);
  check_same_fields(parse(R"({"zero_optimization": {}, "fp16": {}, "bf16": {}, "data_types": {}})"), d);
  check_same_fields(parse(R"({"zero_optimization": {"offload_optimizer": {}, "offload_param": {}}})"), d);
}

TEST_CASE("overlap_comm default depends on the stage") {
  for (int s = 0; s <= 3; ++s) {
    const DsConfig c = parse(R"({"zero_optimization": {"stage": )" + std::to_string(s) + "}}");
    CHECK(c.zero.stage == s);
    CHECK_FALSE(c.zero.overlap_comm.has_value());
    CHECK(c.zero.overlap() == (s == 3));
  }
  CHECK(parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})").zero.overlap() == false);
  CHECK(parse(R"({"zero_optimization": {"stage": 1, "overlap_comm": true}})").zero.overlap() == true);
}

TEST_CASE("the BERT-large example parses") {
  const DsConfig c = load_ds_config(kExample);
  CHECK(c.file == kExample);
  CHECK(c.zero.stage == 1);
  CHECK(c.precision == Precision::fp16);
  CHECK(c.model_dtype() == DType::fp16);
  CHECK(c.communication_data_type() == DType::fp16);
  CHECK(c.fp16.enabled);
  CHECK(c.fp16.loss_scale == 0.0);
  CHECK(c.zero.reduce_bucket_size == 500000000);
  CHECK(c.zero.allgather_bucket_size == 500000000);
  CHECK(c.zero.overlap_comm == false);
  CHECK(c.zero.reduce_scatter);
  CHECK(c.zero.contiguous_gradients);
  CHECK(c.has_optimizer);
  CHECK(c.optimizer.type == OptimizerType::adam);
  CHECK(c.optimizer.lr == zp::test::approx(6e-3));
  CHECK(c.optimizer.weight_decay == zp::test::approx(0.01));
  CHECK(c.optimizer.state_bytes_per_param() == 8);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.train_batch_size == 4096);
  CHECK(c.train_micro_batch_size_per_gpu == 32);
  CHECK_FALSE(c.gradient_accumulation_steps);
  CHECK(c.sparse_attention.present);
  CHECK(c.sparse_attention.mode == "fixed");
  CHECK(c.sparse_attention.block == 16);
  CHECK(c.sparse_attention.different_layout_per_head);
  CHECK(c.sparse_attention.num_different_global_patterns == 4);
  // Only the two keys DeepSpeed 0.19 refuses are warned about (the last test case says how).
  REQUIRE(c.warnings.size() == 2);
  CHECK(has(c.warnings[0], "sparse_attention: DeepSpeed 0.19 refuses this key"));
  CHECK(has(c.warnings[1], "zero_optimization.grad_hooks: DeepSpeed 0.19 refuses this key"));

  const Batch b = resolve_batch(c, 4);
  CHECK(b.train_batch_size == 4096);
  CHECK(b.micro_batch == 32);
  CHECK(b.gas == 32);
  DsConfig m = c;
  m.train_micro_batch_size_per_gpu = 64;
  CHECK(resolve_batch(m, 4).gas == 16);
}

TEST_CASE("batch rule: any two determine the third") {
  auto batch = [](const std::string& text, std::int64_t n) { return resolve_batch(parse(text), n); };
  // All three, consistent.
  Batch b = batch(R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4})", 8);
  CHECK(b.train_batch_size == 256);
  CHECK(b.micro_batch == 8);
  CHECK(b.gas == 4);
  // train + micro.
  b = batch(R"({"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 32})", 4);
  CHECK(b.gas == 32);
  // train + gas.
  b = batch(R"({"train_batch_size": 4096, "gradient_accumulation_steps": 8})", 4);
  CHECK(b.micro_batch == 128);
  CHECK(b.gas == 8);
  // micro + gas.
  b = batch(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})", 5);
  CHECK(b.train_batch_size == 60);
  // Only train: GAS 1.
  b = batch(R"({"train_batch_size": 64})", 8);
  CHECK(b.micro_batch == 8);
  CHECK(b.gas == 1);
  // Only micro: GAS 1.
  b = batch(R"({"train_micro_batch_size_per_gpu": 6})", 3);
  CHECK(b.train_batch_size == 18);
  CHECK(b.gas == 1);
  // Integral floats are integers.
  b = batch(R"({"train_batch_size": 1.024e3, "train_micro_batch_size_per_gpu": 16.0})", 1);
  CHECK(b.gas == 64);
}

TEST_CASE("batch rule violations name the file, the keys and the values") {
  std::string m = batch_error(parse(R"({"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 48})"), 4);
  CHECK(m == "cfg.json: train_batch_size: 4096 is not divisible by train_micro_batch_size_per_gpu (48) × world size (4)");

  m = batch_error(parse(R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2})"), 8);
  INFO(m);
  CHECK(has(m, "cfg.json: train_batch_size: 256 != train_micro_batch_size_per_gpu (8) × gradient_accumulation_steps (2) × world size (8) = 128"));

  m = batch_error(parse(R"({"train_batch_size": 100, "gradient_accumulation_steps": 3})"), 4);
  CHECK(m == "cfg.json: train_batch_size: 100 is not divisible by gradient_accumulation_steps (3) × world size (4)");

  m = batch_error(parse(R"({"train_batch_size": 10})"), 4);
  CHECK(m == "cfg.json: train_batch_size: 10 is not divisible by world size (4)");

  m = batch_error(parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 40000})"), 4);
  CHECK(m == "cfg.json: gradient_accumulation_steps: 40000 micro-steps per optimizer step; at most 32767 are supported");
  CHECK(resolve_batch(parse(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 32767})"), 4).gas == 32767);

  m = batch_error(parse(R"({"gradient_accumulation_steps": 2})"), 4);
  CHECK(m == "cfg.json: train_batch_size: train_batch_size or train_micro_batch_size_per_gpu must be set");
  m = batch_error(parse("{}"), 1);
  CHECK(has(m, "train_batch_size or train_micro_batch_size_per_gpu must be set"));

  m = batch_error(parse(R"({"train_micro_batch_size_per_gpu": 4})"), 0);
  CHECK(m == "cfg.json: world size: must be an integer >= 1, got 0");
  m = batch_error(parse(R"({"train_micro_batch_size_per_gpu": 4})"), -3);
  CHECK(has(m, "world size: must be an integer >= 1"));

  // Products that do not fit are errors, not wrap-around.
  m = batch_error(parse(R"({"train_micro_batch_size_per_gpu": 4611686018427387904, "gradient_accumulation_steps": 4})"), 2);
  CHECK(has(m, "cfg.json: train_micro_batch_size_per_gpu:"));

  // Batch values themselves are integers >= 1.
  m = error_of(R"({"train_batch_size": 0})");
  CHECK(m == "cfg.json: train_batch_size: must be an integer >= 1, got 0");
  m = error_of(R"({"train_micro_batch_size_per_gpu": 2.5})");
  CHECK(has(m, "cfg.json: train_micro_batch_size_per_gpu: must be an integer >= 1"));
  m = error_of(R"({"gradient_accumulation_steps": "4"})");
  CHECK(has(m, "cfg.json: gradient_accumulation_steps: must be an integer >= 1"));
}

TEST_CASE("malformed JSON names the file, line and column") {
  const std::string path = "/tmp/zeroplan_test_ds_config_bad.json";
  {
    std::ofstream f(path);
    f << "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\"stage\": 2,}\n}\n";
  }
  std::string m;
  try {
    load_ds_config(path);
  } catch (const InputError& e) {
    m = e.what();
  }
  std::remove(path.c_str());
  INFO(m);
  CHECK(has(m, path + ": malformed JSON at line 3 column"));

  // A number beyond double range is bad input too (nlohmann: out_of_range, not parse_error).
  const std::string big = "/tmp/zeroplan_test_ds_config_big.json";
  {
    std::ofstream f(big);
    f << "{\"train_batch_size\": 1e400}";
  }
  m.clear();
  try {
    load_ds_config(big);
  } catch (const InputError& e) {
    m = e.what();
  }
  std::remove(big.c_str());
  CHECK(m == big + ": malformed JSON: number overflow parsing '1e400'");

  try {
    load_ds_config("/tmp/zeroplan_no_such_file.json");
    FAIL("no error for a missing file");
  } catch (const InputError& e) {
    CHECK(has(e.what(), "/tmp/zeroplan_no_such_file.json"));
  }

  m = error_of("[1, 2]");
  CHECK(m == "cfg.json: a ds_config must be a JSON object, got array");
}

TEST_CASE("misspelled keys get the closest known key") {
  std::string m = error_of(R"({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5e8}})");
  CHECK(m == "cfg.json: zero_optimization.reduce_bucket_sise: unknown key (did you mean 'reduce_bucket_size'?)");
  m = error_of(R"({"train_batch_sise": 8})");
  CHECK(m == "cfg.json: train_batch_sise: unknown key (did you mean 'train_batch_size'?)");
  m = error_of(R"({"fp16": {"enabeld": true}})");
  CHECK(m == "cfg.json: fp16.enabeld: unknown key (did you mean 'enabled'?)");
  m = error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memroy": true}}})");
  CHECK(m == "cfg.json: zero_optimization.offload_optimizer.pin_memroy: unknown key (did you mean 'pin_memory'?)");
  m = error_of(R"({"optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}}})");
  CHECK(m == "cfg.json: optimizer.params.weight_decy: unknown key (did you mean 'weight_decay'?)");
  m = error_of(R"({"activation_checkpointing": {"partition_activation": true}})");
  CHECK(has(m, "cfg.json: activation_checkpointing.partition_activation: unknown key (did you mean 'partition_activations'?)"));
  m = error_of(R"({"completely_unrelated_thing_xyz": 1})");
  CHECK(m == "cfg.json: completely_unrelated_thing_xyz: unknown key");
}

TEST_CASE("bucket sizes: integers within DeepSpeedZeroConfig's bounds") {
  // reduce_bucket_size is gt=0 there; allgather_bucket_size, sub_group_size, prefetch_bucket_size
  // and zero_hpz_partition_size ge=0.
  for (const char* key : {"reduce_bucket_size"}) {
    for (const char* bad : {"0", "-1", "1.5", "\"big\"", "true", "[1]", "1e300"}) {
      const std::string m =
          error_of(std::string(R"({"zero_optimization": {"stage": 3, ")") + key + "\": " + bad + "}}");
      INFO(m);
      CHECK(has(m, std::string("cfg.json: zero_optimization.") + key + ": must be an integer >= 1, got "));
    }
  }
  for (const char* key : {"allgather_bucket_size", "sub_group_size", "stage3_prefetch_bucket_size",
                          "prefetch_bucket_size", "zero_hpz_partition_size"}) {
    for (const char* bad : {"-1", "1.5", "\"big\"", "true", "[1]", "1e300"}) {
      const std::string m =
          error_of(std::string(R"({"zero_optimization": {"stage": 3, ")") + key + "\": " + bad + "}}");
      INFO(m);
      CHECK(has(m, std::string("cfg.json: zero_optimization.") + key + ": must be an integer >= 0, got "));
    }
  }
  CHECK(parse(R"({"zero_optimization": {"reduce_bucket_size": 2e8}})").zero.reduce_bucket_size == 200000000);
  CHECK(parse(R"({"zero_optimization": {"reduce_bucket_size": 1}})").zero.reduce_bucket_size == 1);
  // 0 is DeepSpeed's (no prefetch, a sub-group per parameter, hpZ off), and thresholds may be 0.
  const DsConfig z = parse(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0,
      "sub_group_size": 0, "zero_hpz_partition_size": 0, "allgather_bucket_size": 0,
      "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0,
      "stage3_model_persistence_threshold": 0}})");
  for (std::int64_t ZeroConfig::*f :
       {&ZeroConfig::stage3_prefetch_bucket_size, &ZeroConfig::sub_group_size,
        &ZeroConfig::zero_hpz_partition_size, &ZeroConfig::allgather_bucket_size,
        &ZeroConfig::stage3_param_persistence_threshold, &ZeroConfig::stage3_max_live_parameters,
        &ZeroConfig::stage3_max_reuse_distance, &ZeroConfig::stage3_model_persistence_threshold})
    CHECK(z.zero.*f == 0);
  CHECK(parse(R"({"zero_optimization": {"stage": 2, "allgather_bucket_size": 0}})").zero.allgather_bucket_size == 0);
  // The legacy form's allgather_size too.
  CHECK(parse(R"({"zero_optimization": true, "allgather_size": 0})").zero.allgather_bucket_size == 0);
  std::string m = error_of(R"({"zero_optimization": true, "allgather_size": -1})");
  CHECK(m == "cfg.json: allgather_size: must be an integer >= 0, got -1");
  m = error_of(R"({"zero_optimization": {"stage3_param_persistence_threshold": -1}})");
  CHECK(m == "cfg.json: zero_optimization.stage3_param_persistence_threshold: must be an integer >= 0, got -1");
}

TEST_CASE("bad values name the file, the key and what is allowed") {
  std::string m = error_of(R"({"zero_optimization": {"stage": 4}})");
  CHECK(m == "cfg.json: zero_optimization.stage: must be an integer in [0, 3], got 4");
  m = error_of(R"({"zero_optimization": {"stage": "3"}})");
  CHECK(has(m, "cfg.json: zero_optimization.stage: must be an integer in [0, 3]"));
  m = error_of(R"({"zero_optimization": 3})");
  CHECK(has(m, "cfg.json: zero_optimization: must be a JSON object"));

  m = error_of(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  CHECK(m == "cfg.json: bf16.enabled: fp16 and bf16 cannot both be enabled; enable one");
  m = error_of(R"({"fp16": {"enabled": true}, "bfloat16": {"enabled": true}})");
  CHECK(has(m, "cfg.json: bfloat16.enabled: fp16 and bf16 cannot both be enabled"));
  m = error_of(R"({"fp16": {"enabled": "yes"}})");
  CHECK(m == "cfg.json: fp16.enabled: must be true or false, got \"yes\"");

  m = error_of(R"({"optimizer": {"type": "Adamm"}})");
  INFO(m);
  CHECK(has(m, "cfg.json: optimizer.type: must be one of Adam, AdamW, SGD, Lamb, Adagrad, OneBitAdam, "
               "ZeroOneAdam, OneBitLamb"));
  CHECK(has(m, "got \"Adamm\""));
  m = error_of(R"({"optimizer": {"type": "FusedAdam"}})");
  CHECK(has(m, "cfg.json: optimizer.type: must be one of"));
  m = error_of(R"({"optimizer": {"params": {"lr": 1e-3}}})");
  CHECK(has(m, "cfg.json: optimizer.type: must be set"));
  m = error_of(R"({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})");
  CHECK(has(m, "cfg.json: optimizer.params.max_grad_norm:"));
  CHECK(has(m, "gradient_clipping"));
  m = error_of(R"({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}})");
  CHECK(m == "cfg.json: optimizer.type: OneBitAdam is not compatible with ZeRO; use zero_optimization.stage 0");

  m = error_of(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})");
  CHECK(m == "cfg.json: zero_optimization.offload_optimizer.device: must be one of none, cpu, nvme, got \"gpu\"");
  m = error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})");
  CHECK(m == "cfg.json: zero_optimization.offload_param.nvme_path: must be set (a directory) when device is nvme");
  m = error_of(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  CHECK(has(m, "cfg.json: zero_optimization.offload_optimizer.ratio: partial offload"));
  m = error_of(R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})");
  CHECK(has(m, "cfg.json: zero_optimization.cpu_offload: deprecated"));
  // Whatever the deprecated key's value (DeepSpeedConfigModel refuses the pair).
  m = error_of(R"({"zero_optimization": {"cpu_offload": false, "offload_optimizer": {"device": "cpu"}}})");
  CHECK(m == "cfg.json: zero_optimization.cpu_offload: deprecated; cannot be given together with offload_optimizer "
             "(keep offload_optimizer)");
  m = error_of(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": false, "offload_param": {"device": "cpu"}}})");
  CHECK(m == "cfg.json: zero_optimization.cpu_offload_param: deprecated; cannot be given together with offload_param "
             "(keep offload_param)");
  // OffloadDeviceEnum is matched as spelt.
  m = error_of(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "CPU"}}})");
  CHECK(m == "cfg.json: zero_optimization.offload_optimizer.device: must be one of none, cpu, nvme, got \"CPU\"");

  m = error_of(R"({"gradient_clipping": -1})");
  CHECK(has(m, "cfg.json: gradient_clipping: must be a number in [0, "));
  m = error_of(R"({"communication_data_type": "int8"})");
  CHECK(m == "cfg.json: communication_data_type: must be one of fp16, bf16, fp32, got \"int8\"");
  m = error_of(R"({"data_types": {"grad_accum_dtype": "fp64"}})");
  CHECK(has(m, "cfg.json: data_types.grad_accum_dtype: must be one of fp16"));
  m = error_of(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})");
  CHECK(has(m, "cfg.json: data_types.grad_accum_dtype: fp32 with bf16 parameters needs zero_optimization.stage"));
  m = error_of(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})");
  CHECK(m == "cfg.json: zero_optimization.prefetch_bucket_size: given twice, also as 'stage3_prefetch_bucket_size'; keep one");
  m = error_of(R"({"zero_optimization": {"stage": 3}, "gradient_allreduce_op": "sum"})");
  CHECK(has(m, "cfg.json: gradient_allreduce_op:"));
  m = error_of(R"({"amp": {"enabled": true}, "zero_optimization": {"stage": 1}})");
  CHECK(has(m, "cfg.json: amp.enabled: Apex AMP cannot be combined with ZeRO"));
  m = error_of(R"({"fp16": {"enabled": true, "loss_scale_window": 0}})");
  CHECK(has(m, "cfg.json: fp16.loss_scale_window: must be an integer >= 1"));
}

TEST_CASE("sparse_attention is read and checked per mode") {
  const DsConfig v = parse(R"({"sparse_attention": {"mode": "variable", "block": 32, "num_random_blocks": 2,
      "local_window_blocks": [4, 8], "global_block_indices": [0, 4], "global_block_end_indices": [2, 6],
      "attention": "unidirectional"}})");
  CHECK(v.sparse_attention.present);
  CHECK(v.sparse_attention.mode == "variable");
  CHECK(v.sparse_attention.block == 32);
  CHECK(v.sparse_attention.num_random_blocks == 2);
  CHECK(v.sparse_attention.local_window_blocks == std::vector<std::int64_t>{4, 8});
  CHECK(v.sparse_attention.global_block_end_indices == std::vector<std::int64_t>{2, 6});
  CHECK(v.sparse_attention.attention == "unidirectional");

  const DsConfig bb = parse(R"({"sparse_attention": {"mode": "bigbird", "num_sliding_window_blocks": 5}})");
  CHECK(bb.sparse_attention.mode == "bigbird");
  CHECK(bb.sparse_attention.num_sliding_window_blocks == 5);

  std::string m = error_of(R"({"sparse_attention": {"mode": "dense", "num_local_blocks": 4}})");
  CHECK(m == "cfg.json: sparse_attention.num_local_blocks: not used by mode \"dense\" (its keys: mode, block)");
  m = error_of(R"({"sparse_attention": {"mode": "fixed", "num_local_block": 4}})");
  CHECK(m == "cfg.json: sparse_attention.num_local_block: unknown key (did you mean 'num_local_blocks'?)");
  m = error_of(R"({"sparse_attention": {"mode": "sliding"}})");
  CHECK(has(m, "cfg.json: sparse_attention.mode: must be one of dense, fixed, variable, bigbird, bslongformer"));
  m = error_of(R"({"sparse_attention": {"block": 0}})");
  CHECK(m == "cfg.json: sparse_attention.block: must be an integer >= 1, got 0");
  m = error_of(R"({"sparse_attention": {"num_local_blocks": 4, "num_global_blocks": 3}})");
  CHECK(has(m, "cfg.json: sparse_attention.num_global_blocks: must divide num_local_blocks (4)"));
  m = error_of(R"({"sparse_attention": {"num_different_global_patterns": 2}})");
  CHECK(has(m, "cfg.json: sparse_attention.num_different_global_patterns: more than 1 needs different_layout_per_head"));
  m = error_of(R"({"sparse_attention": {"different_layout_per_head": true, "num_different_global_patterns": 5}})");
  CHECK(has(m, "sparse_attention.num_different_global_patterns: must be at most num_local_blocks / num_global_blocks (4)"));
  m = error_of(R"({"sparse_attention": {"attention": "unidirectional", "horizontal_global_attention": true}})");
  CHECK(has(m, "cfg.json: sparse_attention.horizontal_global_attention:"));
  m = error_of(R"({"sparse_attention": {"mode": "variable", "local_window_blocks": []}})");
  CHECK(has(m, "cfg.json: sparse_attention.local_window_blocks: must be a non-empty list of integers >= 1"));
  m = error_of(R"({"sparse_attention": {"mode": "variable", "local_window_blocks": [4, 0]}})");
  CHECK(m == "cfg.json: sparse_attention.local_window_blocks[1]: must be an integer >= 1, got 0");
  m = error_of(R"({"sparse_attention": {"mode": "bslongformer", "global_block_indices": [0, 3], "global_block_end_indices": [1]}})");
  CHECK(has(m, "cfg.json: sparse_attention.global_block_end_indices: must have as many entries"));
  m = error_of(R"({"sparse_attention": {"mode": "bslongformer", "global_block_indices": [3], "global_block_end_indices": [3]}})");
  CHECK(has(m, "cfg.json: sparse_attention.global_block_end_indices[0]: must be greater than"));
}

TEST_CASE("DeepSpeed's alias and legacy spellings are accepted") {
  const DsConfig a = parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1e7,
      "param_persistence_threshold": 1e4, "model_persistence_threshold": 1e6, "max_live_parameters": 3e8,
      "max_reuse_distance": 2e8, "gather_16bit_weights_on_model_save": true}})");
  CHECK(a.zero.stage3_prefetch_bucket_size == 10000000);
  CHECK(a.zero.stage3_param_persistence_threshold == 10000);
  CHECK(a.zero.stage3_model_persistence_threshold == 1000000);
  CHECK(a.zero.stage3_max_live_parameters == 300000000);
  CHECK(a.zero.stage3_max_reuse_distance == 200000000);
  CHECK(a.zero.stage3_gather_16bit_weights_on_model_save);

  CHECK(parse(R"({"zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true}})")
            .zero.stage3_gather_16bit_weights_on_model_save);
  CHECK(parse(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": true}})")
            .zero.stage3_gather_16bit_weights_on_model_save);

  const DsConfig b = parse(R"({"bfloat16": {"enabled": true, "immediate_grad_update": true}})");
  CHECK(b.precision == Precision::bf16);
  CHECK(b.model_dtype() == DType::bf16);
  CHECK(b.bf16_immediate_grad_update);

  const DsConfig c = parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  CHECK(c.zero.offload_optimizer.device == OffloadDevice::cpu);
  const DsConfig cp = parse(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})");
  CHECK(cp.zero.offload_param.device == OffloadDevice::cpu);

  // "zero_optimization": true is the pre-0.3 spelling of stage 1.
  const DsConfig l = parse(R"({"zero_optimization": true, "allgather_size": 2e8})");
  CHECK(l.zero.stage == 1);
  CHECK(l.zero.allgather_bucket_size == 200000000);
  CHECK(parse(R"({"zero_optimization": false})").zero.stage == 0);

  // Case-insensitive names, as DeepSpeed lower-cases them.
  const DsConfig o = parse(R"({"optimizer": {"type": "adamw"}, "communication_data_type": "FP32",
      "fp16": {"enabled": true}})");
  CHECK(o.optimizer.type == OptimizerType::adamw);
  CHECK(o.optimizer.type_name == "adamw");
  CHECK(o.communication_data_type() == DType::fp32);
  CHECK(o.model_dtype() == DType::fp16);
  CHECK(parse(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})").zero.offload_optimizer.device ==
        OffloadDevice::cpu);
  CHECK(parse(R"({"zero_optimization": {"stage": 1}, "bf16": {"enabled": true},
      "data_types": {"grad_accum_dtype": "torch.float32"}})").grad_accum_dtype == DType::fp32);
  // "bf16" and the old "bfloat16" together: DeepSpeed reads "bf16" and ignores the other.
  const DsConfig both = parse(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": false, "no_such_key": 1}})");
  CHECK(both.model_dtype() == DType::bf16);
  REQUIRE(both.warnings.size() == 1);
  CHECK(both.warnings[0] == "cfg.json: bfloat16: ignored, as DeepSpeed ignores it when \"bf16\" is given too; keep one");
  // The legacy grad_hooks of the published BERT example.
  CHECK(parse(R"({"zero_optimization": {"grad_hooks": true}})").zero.stage == 0);
}

TEST_CASE("optimizer state bytes per parameter") {
  auto bytes = [](const std::string& type, const std::string& params = "{}") {
    return parse(R"({"optimizer": {"type": ")" + type + R"(", "params": )" + params + "}}")
        .optimizer.state_bytes_per_param();
  };
  CHECK(bytes("Adam") == 8);
  CHECK(bytes("AdamW") == 8);
  CHECK(bytes("Lamb") == 8);
  CHECK(bytes("OneBitAdam") == 8);
  CHECK(bytes("ZeroOneAdam") == 8);
  CHECK(bytes("OneBitLamb") == 8);
  CHECK(bytes("SGD") == 0);
  CHECK(bytes("SGD", R"({"lr": 0.1, "momentum": 0.9})") == 4);
  CHECK(bytes("sgd", R"({"lr": 0.1, "momentum": 0})") == 0);
  CHECK(bytes("Adagrad") == 4);
  CHECK(bytes("Lion") == 4);
  CHECK(bytes("Muon") == 4);
  CHECK(parse(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})").optimizer.momentum == 0.9);
  CHECK(parse(R"({"optimizer": {"type": "Lion"}})").optimizer.type == OptimizerType::lion);
}

TEST_CASE("ignored sections are accepted as they are; unmodelled ones are warned about") {
  const DsConfig i = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"anything": [1, {"x": 2}]}},
      "steps_per_print": 10, "wall_clock_breakdown": true, "tensorboard": {"enabled": true, "whatever": 1},
      "wandb": {"enabled": false}, "csv_monitor": {}, "comet": {}, "flops_profiler": {"enabled": true},
      "comms_logger": {"enabled": true}, "memory_breakdown": false, "zero_allow_untested_optimizer": true,
      "zero_force_ds_cpu_optimizer": false, "dataloader_drop_last": true, "autotuning": {"enabled": false},
      "checkpoint": {"tag_validation": "Warn"}, "data_efficiency": {},
      "disable_allgather": false, "seq_parallel_communication_data_type": "fp32", "timers": {},
      "dump_state": false})");
  CHECK(i.warnings.empty());

  const DsConfig w = parse(R"({"pipeline": {"stages": 2}, "compression_training": {},
      "zero_optimization": {"stage": 3, "zero_quantized_weights": true, "zero_quantized_gradients": true,
                            "zero_hpz_partition_size": 8},
      "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2, "moe": {},
      "torch_autocast": {"enabled": true}, "elasticity": {"enabled": true}})");
  CHECK(w.zero.zero_quantized_weights);
  CHECK(w.zero.zero_quantized_gradients);
  CHECK(w.zero.zero_hpz_partition_size == 8);
  auto warned = [&](const std::string& prefix) {
    for (const auto& s : w.warnings)
      if (s.rfind(prefix, 0) == 0 && has(s, ": accepted but not modelled: ")) return true;
    return false;
  };
  CHECK(warned("cfg.json: pipeline:"));
  CHECK(warned("cfg.json: compression_training:"));
  CHECK(warned("cfg.json: zero_optimization.zero_quantized_weights:"));
  CHECK(warned("cfg.json: zero_optimization.zero_quantized_gradients:"));
  CHECK(warned("cfg.json: tensor_parallel:"));
  CHECK(warned("cfg.json: sequence_parallel_size:"));
  CHECK(warned("cfg.json: moe:"));
  CHECK(warned("cfg.json: torch_autocast:"));
  CHECK(warned("cfg.json: elasticity:"));
  // compression_training and elasticity are also refused by DeepSpeed 0.19: one more line each.
  CHECK(w.warnings.size() == 11);

  // Disabled sections change nothing, so no warning but DeepSpeed 0.19's refusal of the key.
  const DsConfig off = parse(R"({"amp": {"enabled": false}, "sequence_parallel_size": 1})");
  REQUIRE(off.warnings.size() == 1);
  CHECK(has(off.warnings[0], "cfg.json: amp: DeepSpeed 0.19 refuses this key"));
  const DsConfig amp = parse(R"({"amp": {"enabled": true, "opt_level": "O1"}})");
  REQUIRE(amp.warnings.size() == 2);
  CHECK(has(amp.warnings[0], "cfg.json: amp: accepted but not modelled: "));
}

TEST_CASE("\"auto\" values (Hugging Face) read as DeepSpeed's defaults, with a warning") {
  const DsConfig h = parse(R"({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},
      "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto", "overlap_comm": true}})");
  CHECK_FALSE(h.train_batch_size);
  CHECK(h.zero.stage == 3);
  CHECK(h.zero.reduce_bucket_size == 500000000);
  CHECK(h.zero.stage3_prefetch_bucket_size == 50000000);
  CHECK(h.precision == Precision::fp32);
  CHECK(h.warnings.size() == 12);
  CHECK(has(h.warnings[0], "cfg.json: "));
  CHECK(has(h.warnings[0], "\"auto\""));

  // "auto" does not make a misspelled key acceptable, nor stand for a whole section.
  std::string m = error_of(R"({"fp16": {"enablmd": "auto"}})");
  CHECK(m == "cfg.json: fp16.enablmd: unknown key (did you mean 'enabled'?)");
  m = error_of(R"({"zero_optimization": {"reduce_bucket_sise": "auto"}})");
  CHECK(m == "cfg.json: zero_optimization.reduce_bucket_sise: unknown key (did you mean 'reduce_bucket_size'?)");
  m = error_of(R"({"optimizer": {"type": "Adam", "params": {"weigth_decay": "auto"}}})");
  CHECK(has(m, "cfg.json: optimizer.params.weigth_decay: unknown key (did you mean 'weight_decay'?)"));
  m = error_of(R"({"optimizer": {"type": "Adam", "params": "auto"}})");
  CHECK(has(m, "cfg.json: optimizer.params: must be a JSON object"));
  m = error_of(R"({"zero_optimization": {"offload_optimizer": "auto"}})");
  CHECK(has(m, "cfg.json: zero_optimization.offload_optimizer: must be a JSON object"));
  m = error_of(R"({"fp16": "auto"})");
  CHECK(has(m, "cfg.json: fp16: must be a JSON object"));
}

TEST_CASE("to_json round trip") {
  check_round_trip("{}");
  check_round_trip(R"({"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 32,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}},
      "bf16": {"enabled": true, "immediate_grad_update": true}, "data_types": {"grad_accum_dtype": "fp32"},
      "communication_data_type": "fp32", "gradient_clipping": 0.5, "prescale_gradients": true,
      "gradient_predivide_factor": 2.0,
      "zero_optimization": {"stage": 3, "overlap_comm": false, "contiguous_gradients": false,
          "reduce_scatter": false, "reduce_bucket_size": 1e8, "allgather_bucket_size": 2e8,
          "round_robin_gradients": true, "use_multi_rank_bucket_allreduce": false, "sub_group_size": 1e8,
          "memory_efficient_linear": false,
          "prefetch_bucket_size": 1e7, "param_persistence_threshold": 1e3, "model_persistence_threshold": 1e9,
          "max_live_parameters": 1e8, "max_reuse_distance": 1e7, "stage3_gather_fp16_weights_on_model_save": true,
          "zero_hpz_partition_size": 4, "allgather_partitions": false,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": false,
                                "buffer_count": 6, "ratio": 0.3, "fast_init": true},
          "offload_param": {"device": "cpu", "buffer_count": 7, "buffer_size": 1e7, "max_in_cpu": 1e8}},
      "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
          "contiguous_memory_optimization": true, "number_checkpoints": 24, "synchronize_checkpoint_boundary": true,
          "profile": true},
      "sparse_attention": {"mode": "variable", "local_window_blocks": [2, 4], "global_block_indices": [0, 8],
          "global_block_end_indices": [1, 9], "num_random_blocks": 1},
      "scheduler": {"type": "WarmupLR"}, "steps_per_print": 100})");
  check_round_trip(R"({"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": true, "loss_scale": 128,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 4, "min_loss_scale": 2},
      "zero_optimization": {"stage": 2, "cpu_offload": true}, "optimizer": {"type": "Muon"}})");
  check_round_trip(R"({"zero_optimization": true, "allgather_size": 3e8, "bfloat16": {"enabled": true}})");
  check_round_trip(R"({"train_batch_size": "auto", "zero_optimization": {"reduce_bucket_size": "auto"}})");
  // Extremes survive the trip.
  check_round_trip(R"({"train_micro_batch_size_per_gpu": 9223372036854775807, "gradient_clipping": 1.7976931348623157e308,
      "fp16": {"enabled": true, "min_loss_scale": 9007199254740992, "initial_scale_power": 1023},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": 9223372036854775807, "stage3_max_live_parameters": 0}})");
  CHECK(has(error_of(R"({"fp16": {"min_loss_scale": 9007199254740993}})"), "cfg.json: fp16.min_loss_scale:"));

  const DsConfig ex = load_ds_config(kExample);
  const json out = to_json(ex);
  check_same_fields(ex, parse_ds_config("out.json", out));
  CHECK(out.at("steps_per_print") == 1000);          // untouched sections survive
  CHECK(out.at("scheduler") == ex.raw.at("scheduler"));

  // A planner edits fields; the written file says so, with one spelling per key.
  DsConfig p = parse(R"({"train_batch_size": 64, "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1e7}})");
  p.zero.stage3_prefetch_bucket_size = 12345;
  p.zero.stage = 2;
  p.zero.overlap_comm = true;
  p.train_batch_size.reset();
  p.train_micro_batch_size_per_gpu = 8;
  p.gradient_accumulation_steps = 2;
  p.precision = Precision::bf16;
  p.activation_checkpointing.partition_activations = true;
  const json pj = to_json(p);
  CHECK_FALSE(pj.contains("train_batch_size"));
  CHECK_FALSE(pj.at("zero_optimization").contains("prefetch_bucket_size"));
  CHECK(pj.at("zero_optimization").at("stage3_prefetch_bucket_size") == 12345);
  CHECK(pj.at("bf16").at("enabled") == true);
  const DsConfig q = parse_ds_config("plan.json", pj);
  CHECK(q.zero.stage == 2);
  CHECK(q.zero.overlap() == true);
  CHECK(q.precision == Precision::bf16);
  CHECK(q.activation_checkpointing.partition_activations);
  CHECK(resolve_batch(q, 4).train_batch_size == 64);
}

TEST_CASE("keys DeepSpeed 0.19 refuses: read, warned about with DeepSpeed's reason, never written") {
  const DsConfig ex = load_ds_config(kExample);  // the published bert-large config: grad_hooks, sparse_attention
  auto warned = [&](const DsConfig& c, const std::string& what) {
    for (const auto& w : c.warnings)
      if (has(w, what)) return true;
    return false;
  };
  CHECK(warned(ex, "zero_optimization.grad_hooks: DeepSpeed 0.19 refuses this key"));
  CHECK(warned(ex, "sparse_attention: DeepSpeed 0.19 refuses this key: DeepSpeed Sparse Attention has been removed"));
  CHECK(ex.sparse_attention.present);  // still read: its prediction says what it means
  const json out = to_json(ex);
  CHECK_FALSE(out.contains("sparse_attention"));
  CHECK_FALSE(out.at("zero_optimization").contains("grad_hooks"));
  // Every key of DeepSpeed's removed-features lists, and the legacy spellings.
  const DsConfig old = parse(R"({"nebula": {}, "eigenvalue": {}, "graph_harvesting": false, "curriculum_learning": {},
      "sparse_gradients": false, "bf16": {"enabled": true, "check_overflow": false},
      "zero_optimization": {"stage": 3, "mics_shard_size": -1, "zeropp_loco_param": {}}})");
  for (const char* k : {"nebula", "eigenvalue", "graph_harvesting", "curriculum_learning", "sparse_gradients",
                        "bf16.check_overflow", "zero_optimization.mics_shard_size", "zero_optimization.zeropp_loco_param"})
    CHECK_MESSAGE(warned(old, std::string(k) + ": DeepSpeed 0.19 refuses this key"), k);
  const json o = to_json(old);
  for (const char* k : {"nebula", "eigenvalue", "graph_harvesting", "curriculum_learning", "sparse_gradients"})
    CHECK_MESSAGE(!o.contains(k), k);
  CHECK_FALSE(o.at("bf16").contains("check_overflow"));
  CHECK_FALSE(o.at("zero_optimization").contains("mics_shard_size"));
  CHECK_FALSE(o.at("zero_optimization").contains("zeropp_loco_param"));
  // DeepSpeed 0.19's own ZeRO fields are accepted (they change neither memory nor communication).
  const DsConfig cur = parse(R"({"zero_optimization": {"stage": 2, "compute_grad_norm": true, "parameter_alignment": 1}})");
  CHECK(cur.zero.stage == 2);
  CHECK_FALSE(warned(cur, "refuses"));
}
