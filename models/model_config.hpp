#pragma once
// A model description read from a Hugging Face-style config.json.
// Families: BERT (BertForPreTraining / BertForMaskedLM), GPT-2 (GPT2LMHeadModel),
// Llama-like decoders (Llama, Mistral, Qwen2: LlamaForCausalLM and friends).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "models/attention.hpp"

namespace zp::models {

enum class Family { bert, gpt2, llama };

enum class Head {
  bert_pretraining,  // BertForPreTraining: MLM head over all tokens + NSP head (pooler)
  bert_mlm,          // BertForMaskedLM: MLM head, no pooler
  causal_lm,         // GPT2LMHeadModel / LlamaForCausalLM
};

// Activation functions as Hugging Face names them; they differ in what autograd saves.
enum class Act {
  gelu,              // exact erf GELU, one fused kernel (saves its input)
  gelu_new,          // GPT-2's tanh approximation written as Python ops (saves intermediates)
  gelu_pytorch_tanh, // F.gelu(approximate="tanh"), fused (saves its input)
  relu,
  silu,              // used gated (SiLU(gate) * up) in the Llama family
};

struct ModelConfig {
  std::string name;         // catalogue name or the file's stem
  std::string source;       // path the config was read from
  std::string model_type;   // "bert", "gpt2", "llama", "mistral", "qwen2"
  Family family = Family::gpt2;
  Head head = Head::causal_lm;
  std::int64_t hidden = 0;            // h
  std::int64_t layers = 0;            // L
  std::int64_t heads = 0;             // a
  std::int64_t kv_heads = 0;          // GQA groups (== heads for MHA)
  std::int64_t head_dim = 0;          // hidden / heads unless given
  std::int64_t intermediate = 0;      // MLP width
  std::int64_t vocab = 0;             // V
  std::int64_t max_positions = 0;     // default sequence length comes from here
  std::int64_t type_vocab = 0;        // BERT token types (2)
  bool tie_word_embeddings = true;
  bool qkv_bias = false;              // Qwen2 has q/k/v biases; Llama and Mistral do not
  bool mlp_bias = false;
  Act act = Act::gelu;
  double hidden_dropout = 0.0;        // BERT hidden_dropout_prob, GPT-2 resid_pdrop
  double attention_dropout = 0.0;     // attention_probs_dropout_prob / attn_pdrop / attention_dropout
  double embedding_dropout = 0.0;     // GPT-2 embd_pdrop; BERT uses hidden_dropout
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;        // Llama family: RoPE base
  std::int64_t sliding_window = 0;    // Mistral (0: none)
  // rope_scaling (Llama 3.1/3.2: rope_type "llama3"): changes the rotary frequencies, not
  // memory or FLOPs. Empty rope_type: none.
  std::string rope_type;
  double rope_factor = 1.0;
  // attn_implementation (or _attn_implementation, as transformers 4.x saved it) when the
  // config.json names one; `attn_key` is the key that did.
  std::optional<Attention> attn_implementation;
  std::string attn_key;
  // use_cache (GPT-2 and Llama-family configs default to true): whether the decoder builds
  // a KV cache in its forward, which transformers 5 does in training too (models/transformers.hpp).
  bool use_cache = true;
  // torch_dtype (dtype in transformers 5's config.json): what transformers builds the model in
  // (from_config, and from_pretrained's default "auto" in 5.x). DeepSpeed casts the module
  // only when fp16 or bf16 is enabled; without either it trains in this dtype
  // (zero::DsConfig::module_dtype).
  std::optional<DType> torch_dtype;
  std::string torch_dtype_key;        // the key that set it
};

// Which attention a run uses: the command line's --attention when given (and a note when it
// overrides the config.json's), else the config.json's attn_implementation, else
// kDefaultAttention. A bad --attention value → zp::InputError naming --attention.
struct AttentionChoice {
  Attention attention = kDefaultAttention;
  std::string from;  // "--attention", "FILE: attn_implementation", or "default"
  std::string note;  // non-empty when --attention overrides the config.json
};
AttentionChoice choose_attention(const ModelConfig& m, const std::string& flag_value /* "" = not given */);

// `name_or_path`: a catalogue name (models/catalog/NAME.json, case-insensitive), a path to
// any config.json or to a checkpoint directory holding one, or a Hugging Face hub id of a
// catalogue entry (models/hub_ids.json: "meta-llama/Meta-Llama-3-8B"), resolved offline.
// An existing path wins over a hub id. Bad input → zp::InputError naming the file and key;
// an unknown name lists the catalogue and the hub ids and says how to pass a config.json.
ModelConfig load_model(const std::string& name_or_path);
ModelConfig parse_model_config(const std::string& file, const std::string& json_text);

// Names in the catalogue, sorted.
std::vector<std::string> catalog_names();

// Hub id → catalogue name, as models/hub_ids.json lists them (sorted by hub id).
std::vector<std::pair<std::string, std::string>> hub_ids();

}  // namespace zp::models
