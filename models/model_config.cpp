#include "models/model_config.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"

namespace zp::models {
namespace {

namespace fs = std::filesystem;
using zp::json::json;
using zp::json::Reader;

// Sizes are bounded so that products such as b*a*s*s stay far from int64 overflow.
constexpr std::int64_t kMaxSize = std::numeric_limits<std::int32_t>::max();

const std::vector<std::string>& model_types() {
  static const std::vector<std::string> k{"bert", "gpt2", "llama", "mistral", "qwen2"};
  return k;
}

// Hugging Face ACT2FN names we model ("swish" is HF's alias of silu).
const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> k{"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish"};
  return k;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

fs::path catalog_dir() { return fs::path(ZEROPLAN_DATA_DIR) / "models" / "catalog"; }

std::int64_t required_size(const Reader& r, const json& o, std::string_view key) {
  const auto v = r.get_opt_int(o, key, 1, kMaxSize);
  if (!v) throw InputError(r.file, r.key_path(key), "required field is missing (a positive integer)");
  return *v;
}

std::int64_t optional_size(const Reader& r, const json& o, std::string_view key, std::int64_t dflt) {
  return r.get_opt_int(o, key, 1, kMaxSize).value_or(dflt);
}

double dropout_prob(const Reader& r, const json& o, std::string_view key, double dflt) {
  const double lim = std::numeric_limits<double>::max();
  const double p = r.get_double(o, key, dflt, -lim, lim);
  if (p < 0.0 || p >= 1.0)
    throw InputError(r.file, r.key_path(key), fmt::format("must be a probability in [0, 1), got {}", p));
  return p;
}

double norm_eps(const Reader& r, const json& o, std::string_view key, double dflt) {
  return r.get_double(o, key, dflt, 0.0, 1.0);
}

Act activation(const Reader& r, const json& o, std::string_view key, const std::string& dflt) {
  const std::string s = r.get_enum(o, key, dflt, activation_names());
  if (s == "gelu") return Act::gelu;
  if (s == "gelu_new") return Act::gelu_new;
  if (s == "gelu_pytorch_tanh") return Act::gelu_pytorch_tanh;
  if (s == "relu") return Act::relu;
  return Act::silu;  // "silu" or "swish"
}

// The list of strings under "architectures" (empty when absent or null).
std::vector<std::string> architectures(const Reader& r, const json& o) {
  std::vector<std::string> out;
  auto it = o.find("architectures");
  if (it == o.end() || it->is_null()) return out;
  if (!it->is_array())
    throw InputError(r.file, "architectures", fmt::format("must be a list of class names, got {}", zp::json::printable(it->dump())));
  for (const auto& e : *it) {
    if (!e.is_string())
      throw InputError(r.file, "architectures", fmt::format("must be a list of class names, got {}", zp::json::printable(it->dump())));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// hidden must split evenly over the heads unless head_dim is given explicitly.
void check_heads(const Reader& r, ModelConfig& c, std::string_view hidden_key, std::string_view heads_key) {
  if (c.head_dim == 0) {
    if (c.hidden % c.heads != 0)
      throw InputError(r.file, std::string(heads_key),
                       fmt::format("must divide {} ({}), got {}", hidden_key, c.hidden, c.heads));
    c.head_dim = c.hidden / c.heads;
  }
}

void parse_gpt2(const Reader& r, const json& o, ModelConfig& c) {
  c.family = Family::gpt2;
  c.head = Head::causal_lm;
  c.vocab = required_size(r, o, "vocab_size");
  c.hidden = required_size(r, o, "n_embd");
  c.layers = required_size(r, o, "n_layer");
  c.heads = required_size(r, o, "n_head");
  c.max_positions = required_size(r, o, "n_positions");
  c.kv_heads = c.heads;
  check_heads(r, c, "n_embd", "n_head");
  c.intermediate = optional_size(r, o, "n_inner", 4 * c.hidden);
  c.act = activation(r, o, "activation_function", "gelu_new");
  c.hidden_dropout = dropout_prob(r, o, "resid_pdrop", 0.1);
  c.embedding_dropout = dropout_prob(r, o, "embd_pdrop", 0.1);
  c.attention_dropout = dropout_prob(r, o, "attn_pdrop", 0.1);
  c.norm_eps = norm_eps(r, o, "layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = r.get_bool(o, "tie_word_embeddings", true);
  c.qkv_bias = true;  // Conv1D layers all carry a bias
  c.mlp_bias = true;
  // Upcast-and-reorder attention saves different tensors; only the default is modelled.
  if (r.get_bool(o, "reorder_and_upcast_attn", false))
    throw InputError(r.file, "reorder_and_upcast_attn", "only false is supported");
  if (r.get_bool(o, "add_cross_attention", false))
    throw InputError(r.file, "add_cross_attention", "only false is supported (decoder-only GPT-2)");
}

void parse_bert(const Reader& r, const json& o, ModelConfig& c) {
  c.family = Family::bert;
  c.vocab = required_size(r, o, "vocab_size");
  c.hidden = required_size(r, o, "hidden_size");
  c.layers = required_size(r, o, "num_hidden_layers");
  c.heads = required_size(r, o, "num_attention_heads");
  c.intermediate = required_size(r, o, "intermediate_size");
  c.max_positions = required_size(r, o, "max_position_embeddings");
  c.type_vocab = optional_size(r, o, "type_vocab_size", 2);
  c.kv_heads = c.heads;
  check_heads(r, c, "hidden_size", "num_attention_heads");
  c.act = activation(r, o, "hidden_act", "gelu");
  c.hidden_dropout = dropout_prob(r, o, "hidden_dropout_prob", 0.1);
  c.embedding_dropout = c.hidden_dropout;
  c.attention_dropout = dropout_prob(r, o, "attention_probs_dropout_prob", 0.1);
  c.norm_eps = norm_eps(r, o, "layer_norm_eps", 1e-12);
  c.tie_word_embeddings = r.get_bool(o, "tie_word_embeddings", true);
  c.qkv_bias = true;
  c.mlp_bias = true;
  r.get_enum(o, "position_embedding_type", "absolute", {"absolute"});

  c.head = Head::bert_pretraining;
  const auto arch = architectures(r, o);
  if (!arch.empty()) {
    if (arch.front() == "BertForPreTraining") {
      c.head = Head::bert_pretraining;
    } else if (arch.front() == "BertForMaskedLM") {
      c.head = Head::bert_mlm;
    } else {
      throw InputError(r.file, "architectures",
                       fmt::format("BERT head must be one of BertForPreTraining, BertForMaskedLM, got \"{}\"",
                                   arch.front()));
    }
  }
}

// Llama, Mistral and Qwen2 share LlamaForCausalLM's structure.
void parse_llama(const Reader& r, const json& o, ModelConfig& c) {
  c.family = Family::llama;
  c.head = Head::causal_lm;
  c.vocab = required_size(r, o, "vocab_size");
  c.hidden = required_size(r, o, "hidden_size");
  c.intermediate = required_size(r, o, "intermediate_size");
  c.layers = required_size(r, o, "num_hidden_layers");
  c.heads = required_size(r, o, "num_attention_heads");
  c.max_positions = required_size(r, o, "max_position_embeddings");
  c.kv_heads = optional_size(r, o, "num_key_value_heads", c.heads);
  if (c.heads % c.kv_heads != 0)
    throw InputError(r.file, "num_key_value_heads",
                     fmt::format("must divide num_attention_heads ({}), got {}", c.heads, c.kv_heads));
  c.head_dim = optional_size(r, o, "head_dim", 0);
  check_heads(r, c, "hidden_size", "num_attention_heads");
  c.act = activation(r, o, "hidden_act", "silu");
  c.attention_dropout = dropout_prob(r, o, "attention_dropout", 0.0);
  c.hidden_dropout = 0.0;
  c.embedding_dropout = 0.0;
  c.norm_eps = norm_eps(r, o, "rms_norm_eps", 1e-6);
  c.rope_theta = r.get_double(o, "rope_theta", 10000.0, 1.0, 1e12);
  c.tie_word_embeddings = r.get_bool(o, "tie_word_embeddings", false);
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
    c.mlp_bias = false;
    if (r.get_bool(o, "use_sliding_window", false))
      c.sliding_window = r.get_opt_int(o, "sliding_window", 1, kMaxSize).value_or(0);
  } else if (c.model_type == "mistral") {
    c.qkv_bias = false;
    c.mlp_bias = false;
    c.sliding_window = r.get_opt_int(o, "sliding_window", 1, kMaxSize).value_or(0);
  } else {
    // LlamaConfig.attention_bias puts a bias on q, k, v and o projections.
    c.qkv_bias = r.get_bool(o, "attention_bias", false);
    c.mlp_bias = r.get_bool(o, "mlp_bias", false);
  }
}

// rope_scaling: null, or {"rope_type" (or the older "type"), "factor", ...}.
void parse_rope_scaling(const Reader& r, const json& o, ModelConfig& c) {
  auto it = o.find("rope_scaling");
  if (it == o.end() || it->is_null()) return;
  if (!it->is_object())
    throw InputError(r.file, "rope_scaling", fmt::format("must be null or an object, got {}", zp::json::printable(it->dump())));
  const Reader rs = r.sub("rope_scaling");
  static const std::vector<std::string> types{"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  std::string type = rs.get_enum(*it, "rope_type", "", types);
  if (type.empty()) type = rs.get_enum(*it, "type", "", types);
  if (type.empty())
    throw InputError(r.file, "rope_scaling.rope_type", fmt::format("required field is missing; must be one of {}", join(types)));
  if (type == "default") return;
  c.rope_type = type;
  c.rope_factor = rs.get_double(*it, "factor", 1.0, 1.0, 1e6);
}

// attn_implementation, or _attn_implementation as transformers 4.x's save_pretrained wrote it.
void parse_attn_implementation(const Reader& r, const json& o, ModelConfig& c) {
  for (const char* key : {"attn_implementation", "_attn_implementation"}) {
    const std::string v = r.get_string(o, key, "");
    if (v.empty()) continue;
    const Attention a = parse_attention(r.file, key, v);
    if (c.attn_implementation && *c.attn_implementation != a)
      throw InputError(r.file, key, fmt::format("'{}' contradicts {} '{}'", v, c.attn_key,
                                                attention_name(*c.attn_implementation)));
    if (!c.attn_implementation) {
      c.attn_implementation = a;
      c.attn_key = key;
    }
  }
}

// torch_dtype, or dtype as transformers 5 writes it: "float32", "float16", "bfloat16" (with
// or without "torch."); "auto" and null say nothing.
void parse_torch_dtype(const Reader& r, const json& o, ModelConfig& c) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) continue;
    if (!it->is_string())
      throw InputError(r.file, key, fmt::format("must be a string (float32, float16, bfloat16), got {}",
                                                zp::json::printable(it->dump())));
    std::string v = it->get<std::string>();
    if (v.rfind("torch.", 0) == 0) v = v.substr(6);
    std::optional<DType> t;
    if (v == "float32" || v == "float") t = DType::fp32;
    else if (v == "float16" || v == "half") t = DType::fp16;
    else if (v == "bfloat16") t = DType::bf16;
    else if (v != "auto")
      throw InputError(r.file, key, fmt::format("must be one of float32, float16, bfloat16, auto, got '{}'",
                                                zp::json::printable(it->get<std::string>())));
    if (!t) continue;
    if (c.torch_dtype && *c.torch_dtype != *t)
      throw InputError(r.file, key, fmt::format("'{}' contradicts {} '{}'", it->get<std::string>(), c.torch_dtype_key,
                                                dtype_name(*c.torch_dtype)));
    if (!c.torch_dtype) {
      c.torch_dtype = t;
      c.torch_dtype_key = key;
    }
  }
}

fs::path hub_ids_file() { return fs::path(ZEROPLAN_DATA_DIR) / "models" / "hub_ids.json"; }

}  // namespace

ModelConfig parse_model_config(const std::string& file, const std::string& json_text) {
  const json root = zp::json::parse_text(file, json_text);
  const Reader r{file, ""};
  if (!root.is_object())
    throw InputError(file, "", fmt::format("must be a JSON object (a Hugging Face config.json), got {}",
                                           root.type_name()));
  ModelConfig c;
  c.source = file;
  c.name = fs::path(file).stem().string();
  c.model_type = r.get_enum(root, "model_type", "", model_types());
  if (c.model_type.empty())
    throw InputError(file, "model_type", fmt::format("required field is missing; must be one of {}",
                                                     join(model_types())));
  if (c.model_type == "gpt2") {
    parse_gpt2(r, root, c);
  } else if (c.model_type == "bert") {
    parse_bert(r, root, c);
  } else {
    parse_llama(r, root, c);
    parse_rope_scaling(r, root, c);
  }
  parse_attn_implementation(r, root, c);
  c.use_cache = r.get_bool(root, "use_cache", true);
  parse_torch_dtype(r, root, c);
  return c;
}

AttentionChoice choose_attention(const ModelConfig& m, const std::string& flag_value) {
  AttentionChoice ch;
  if (!flag_value.empty()) {
    ch.attention = parse_attention("--attention", "", flag_value);
    ch.from = "--attention";
    if (m.attn_implementation && *m.attn_implementation != ch.attention)
      ch.note = fmt::format("--attention {} overrides {} \"{}\" of {}", attention_name(ch.attention), m.attn_key,
                            attention_name(*m.attn_implementation), m.source);
  } else if (m.attn_implementation) {
    ch.attention = *m.attn_implementation;
    ch.from = fmt::format("{}: {}", m.source, m.attn_key);
  } else {
    ch.attention = kDefaultAttention;
    ch.from = "default";
  }
  return ch;
}

std::vector<std::string> catalog_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(catalog_dir(), ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::pair<std::string, std::string>> hub_ids() {
  const std::string file = hub_ids_file().string();
  const json doc = zp::json::parse_file(file);
  if (!doc.is_object()) throw InputError(file, "", "must be an object of hub id -> catalogue name");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [id, v] : doc.items()) {
    if (id.rfind('_', 0) == 0) continue;  // _comment
    if (!v.is_string()) throw InputError(file, id, "must be a catalogue name (a string)");
    out.emplace_back(id, v.get<std::string>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The one-line answer to a name that is neither a catalogue entry, a hub id of one, nor a file.
[[noreturn]] void unknown_model(const std::string& name_or_path) {
  std::vector<std::string> names = catalog_names();
  std::vector<std::string> ids;
  for (const auto& [id, n] : hub_ids()) ids.push_back(id);
  std::vector<std::string> all = names;
  all.insert(all.end(), ids.begin(), ids.end());
  std::string msg = fmt::format("unknown model '{}'", zp::json::printable(name_or_path));
  if (const std::string near = zp::json::closest(name_or_path, all); !near.empty())
    msg += fmt::format(" (did you mean '{}'?)", near);
  msg += fmt::format("; the catalogue knows {}; and these hub ids, offline: {}; for any other model pass its "
                     "config.json: --model path/to/config.json, or a checkpoint directory that holds one",
                     join(names), join(ids));
  throw InputError("--model", "", msg);
}

}  // namespace

ModelConfig load_model(const std::string& name_or_path) {
  std::string path, name;
  for (const auto& n : catalog_names()) {
    if (lower(n) == lower(name_or_path)) {
      path = (catalog_dir() / (n + ".json")).string();
      name = n;
      break;
    }
  }
  if (path.empty()) {
    std::error_code ec;
    fs::path p(name_or_path);
    if (!name_or_path.empty() && fs::is_directory(p, ec) && fs::is_regular_file(p / "config.json", ec)) {
      // A checkpoint directory: its config.json, named after the directory.
      name = p.lexically_normal().filename().string();
      if (name.empty()) name = p.lexically_normal().parent_path().filename().string();
      p /= "config.json";
      path = p.string();
    } else if (!name_or_path.empty() && fs::is_regular_file(p, ec)) {
      name = p.stem() == "config" && p.has_parent_path() ? p.parent_path().filename().string() : p.stem().string();
      path = p.string();
    } else {
      // A hub id of a catalogue entry ("meta-llama/Meta-Llama-3-8B"), resolved offline.
      for (const auto& [id, n] : hub_ids()) {
        if (lower(id) == lower(name_or_path)) {
          path = (catalog_dir() / (n + ".json")).string();
          name = n;
          break;
        }
      }
      if (path.empty()) {
        // "org/name" may be a hub id; anything else with a slash or a .json is a path.
        const auto slashes = std::count(name_or_path.begin(), name_or_path.end(), '/');
        const bool hub_like = slashes == 1 && name_or_path.front() != '/' && name_or_path.front() != '.' &&
                              name_or_path.back() != '/';
        if (p.extension() == ".json" || (slashes > 0 && !hub_like))
          throw InputError(name_or_path, "",
                           "cannot open file (no such config.json or directory holding one, and not a catalogue "
                           "name or hub id)");
        unknown_model(name_or_path);
      }
    }
  }
  ModelConfig c = parse_model_config(path, io::read_capped(path, io::kConfigMaxBytes, "a model config.json"));
  c.name = name;
  return c;
}

}  // namespace zp::models
