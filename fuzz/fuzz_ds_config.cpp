// libFuzzer target: bytes → JSON → parse_ds_config → resolve_batch, plus the to_json
// round trip. Bad input must surface as zp::InputError (one line); any other exception,
// a sanitizer report, or a round trip that changes a field is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "zero/ds_config.hpp"

namespace {

using nlohmann::json;
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
