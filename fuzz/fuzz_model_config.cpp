// libFuzzer target: bytes → parse_model_config → (small models only) build_graph at
// micro-batch 1, sequence 16 (a structure-aware mutator is at the end of the file).
// Bad input must surface as zp::InputError; any other exception or a sanitizer report
// is a bug.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"

namespace {

using nlohmann::json;

// Keys and values the mutator draws from (the reader's vocabulary).
const std::vector<std::string>& fuzz_keys() {
  static const std::vector<std::string> k{
      "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
      "type_vocab_size", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "activation_function",
      "hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "attn_pdrop", "resid_pdrop",
      "embd_pdrop", "layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "sliding_window", "use_sliding_window",
      "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "n_ctx", "position_embedding_type",
      "add_cross_attention", "reorder_and_upcast_attn", "rope_theta", "rope_scaling", "torch_dtype"};
  return k;
}

const std::vector<json>& fuzz_values() {
  static const std::vector<json> v{
      0, 1, -1, 2, 3, 4, 7, 8, 12, 16, 64, 128, 768, 1024, 4096, 32000, 1.5, 0.1, 1.0, 1e-5, 1e300, 1e9,
      std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::uint64_t>::max(), true, false, nullptr,
      "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh", "bert", "gpt2", "llama",
      "mistral", "qwen2", "absolute", "relative_key", "", json::array(), json::object(),
      json::array({"BertForPreTraining"}), json::array({"BertForMaskedLM"}), json::array({"GPT2LMHeadModel"}),
      json::array({"LlamaForCausalLM"}), json::array({"MistralForCausalLM"}), json::array({"Qwen2ForCausalLM"}),
      json::array({"SomethingElse"})};
  return v;
}

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

#include "fuzz/json_mutator.hpp"
