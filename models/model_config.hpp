#pragma once
// A model description read from a Hugging Face-style config.json.
// Families: BERT (BertForPreTraining / BertForMaskedLM), GPT-2 (GPT2LMHeadModel),
// Llama-like decoders (Llama, Mistral, Qwen2: LlamaForCausalLM and friends).
#include <cstdint>
#include <string>
#include <vector>

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
};

// `name_or_path`: a catalogue name (models/catalog/NAME.json, case-insensitive) or a
// path to any config.json. Bad input → zp::InputError naming the file and key.
ModelConfig load_model(const std::string& name_or_path);
ModelConfig parse_model_config(const std::string& file, const std::string& json_text);

// Names in the catalogue, sorted.
std::vector<std::string> catalog_names();

}  // namespace zp::models
