// libFuzzer target: bytes → parse_model_config → (small models only) build_graph at
// micro-batch 1, sequence 16. Bad input must surface as zp::InputError; any other
// exception or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"

namespace {

// Keep each input fast: the graph has O(layers) ops, and shapes multiply these sizes.
bool small_enough(const zp::models::ModelConfig& c) {
  const auto in = [](std::int64_t v, std::int64_t hi) { return v >= 0 && v <= hi; };
  return in(c.hidden, 1 << 14) && in(c.layers, 64) && in(c.vocab, 1 << 18) && in(c.heads, 1 << 10) &&
         in(c.kv_heads, 1 << 10) && in(c.head_dim, 1 << 14) && in(c.intermediate, 1 << 16) &&
         in(c.type_vocab, 1 << 10) && c.hidden * c.layers * c.vocab <= (std::int64_t{1} << 34);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  zp::models::ModelConfig cfg;
  try {
    cfg = zp::models::parse_model_config("fuzz_config.json", text);
  } catch (const zp::InputError&) {
    return 0;
  }
  if (!small_enough(cfg)) return 0;

  zp::models::GraphOptions opt;
  opt.micro_batch = 1;
  opt.seq_len = 16;
  try {
    const zp::models::OpGraph g = zp::models::build_graph(cfg, opt);
    (void)g.param_count();
    (void)g.fwd_flops();
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) (void)g.saved_bytes_of_layer(l);
    (void)zp::models::to_boost(g);
  } catch (const zp::InputError&) {
  }
  return 0;
}
