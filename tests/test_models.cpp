// Golden tests for models/: catalogue parameter counts, saved activations against the
// closed forms, FLOPs, bad input, and the structure of the op graph.
#include <doctest/doctest.h>

#include "tests/test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <boost/graph/topological_sort.hpp>

#include "core/error.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"

using namespace zp;
using namespace zp::models;

namespace {

OpGraph graph_of(const std::string& name, std::int64_t b, std::int64_t s, DType dt = DType::fp16) {
  GraphOptions o;
  o.micro_batch = b;
  o.seq_len = s;
  o.act_dtype = dt;
  return build_graph(load_model(name), o);
}

OpGraph graph_of(const ModelConfig& c, std::int64_t b, std::int64_t s, DType dt = DType::fp16) {
  GraphOptions o;
  o.micro_batch = b;
  o.seq_len = s;
  o.act_dtype = dt;
  return build_graph(c, o);
}

using zp::test::input_error;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Korthikanti et al.: s*b*h*(34 + 5*a*s/h) bytes per layer, exact in integers.
std::int64_t korthikanti(std::int64_t s, std::int64_t b, std::int64_t h, std::int64_t a) {
  return 34 * s * b * h + 5 * a * s * s * b;
}

}  // namespace

TEST_CASE("catalogue parameter counts are exact") {
  CHECK(graph_of("gpt2", 1, 128).param_count() == 124'439'808);
  CHECK(graph_of("gpt2-medium", 1, 128).param_count() == 354'823'168);
  CHECK(graph_of("gpt2-large", 1, 128).param_count() == 774'030'080);
  CHECK(graph_of("gpt2-xl", 1, 128).param_count() == 1'557'611'200);
  CHECK(graph_of("gpt2", 1, 128).base_param_count() == 124'439'808);  // lm_head tied to wte
  CHECK(graph_of("bert-base-uncased", 1, 128).base_param_count() == 109'482'240);
  CHECK(graph_of("bert-large-uncased", 1, 128).base_param_count() == 335'141'888);
  // BertForPreTraining adds cls.predictions.{bias, transform} and cls.seq_relationship.
  CHECK(graph_of("bert-base-uncased", 1, 128).param_count() == 110'106'428);
  CHECK(graph_of("Llama-2-7b", 1, 128).param_count() == 6'738'415'616);
  CHECK(graph_of("Llama-2-13b", 1, 128).param_count() == 13'015'864'320);
  CHECK(graph_of("Meta-Llama-3-8B", 1, 128).param_count() == 8'030'261'248);
  CHECK(graph_of("Mistral-7B-v0.1", 1, 128).param_count() == 7'241'732'096);
  // LlamaModel alone leaves out the untied lm_head (V x h).
  CHECK(graph_of("Llama-2-7b", 1, 128).base_param_count() == 6'738'415'616 - 32000LL * 4096);
}

TEST_CASE("params follow registration order with Hugging Face names and shapes") {
  const OpGraph g = graph_of("gpt2", 1, 64);
  REQUIRE(g.params.size() == 2 + 12 * 12 + 2);
  CHECK(g.params[0].name == "transformer.wte.weight");
  CHECK(g.params[1].name == "transformer.wpe.weight");
  CHECK(g.params[2].name == "transformer.h.0.ln_1.weight");
  CHECK(g.params[4].name == "transformer.h.0.attn.c_attn.weight");
  CHECK(g.params[4].shape == std::vector<std::int64_t>{768, 2304});  // Conv1D: (in, out)
  CHECK(g.params.back().name == "transformer.ln_f.bias");

  const OpGraph l = graph_of("Meta-Llama-3-8B", 1, 64);
  CHECK(l.params[0].name == "model.embed_tokens.weight");
  CHECK(l.params[1].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(l.params[2].shape == std::vector<std::int64_t>{1024, 4096});  // k_proj: (kv*d, h)
  CHECK(l.params[8].name == "model.layers.0.input_layernorm.weight");
  CHECK(l.params.back().name == "lm_head.weight");
  CHECK_FALSE(l.params.back().in_base_model);

  const OpGraph b = graph_of("bert-base-uncased", 1, 64);
  CHECK(b.params[1].name == "bert.embeddings.position_embeddings.weight");
  CHECK(b.params[3].name == "bert.embeddings.LayerNorm.weight");
  auto at = [&](const std::string& n) {
    for (const auto& p : b.params)
      if (p.name == n) return p.id;
    return kNone;
  };
  // BertLMPredictionHead's own bias registers before its transform.
  REQUIRE(at("cls.predictions.bias") != kNone);
  CHECK(at("cls.predictions.bias") + 1 == at("cls.predictions.transform.dense.weight"));
  CHECK(at("cls.predictions.decoder.weight") == kNone);  // tied to the word embeddings
  CHECK_FALSE(b.params[static_cast<std::size_t>(at("cls.seq_relationship.weight"))].in_base_model);
}

TEST_CASE("BERT layers save exactly s*b*h*(34 + 5as/h) bytes, plus LayerNorm statistics") {
  struct Case {
    const char* model;
    std::int64_t s, b, h, a;
  };
  for (const Case& c : {Case{"bert-large-uncased", 128, 64, 1024, 16}, Case{"bert-large-uncased", 512, 8, 1024, 16},
                        Case{"bert-base-uncased", 128, 32, 768, 12}, Case{"bert-base-uncased", 384, 3, 768, 12},
                        Case{"tiny-bert", 64, 2, 64, 4}}) {
    CAPTURE(c.model);
    CAPTURE(c.s);
    CAPTURE(c.b);
    const OpGraph g = graph_of(c.model, c.b, c.s);
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == korthikanti(c.s, c.b, c.h, c.a));
      // Two LayerNorms, each keeping fp32 mean and rstd per token.
      CHECK((g.saved_bytes_of_layer(l) - g.saved_bytes_of_layer_large(l)).v == 2 * 2 * 4 * c.s * c.b);
    }
  }
  // bert-large, s=128, b=64: 128*64*1024*(34 + 10) bytes per layer.
  CHECK(graph_of("bert-large-uncased", 64, 128).saved_bytes_of_layer_large(0).v == 369'098'752);
  // bf16 has the same sizes as fp16.
  CHECK(graph_of("bert-base-uncased", 4, 128, DType::bf16).saved_bytes_of_layer_large(5).v ==
        korthikanti(128, 4, 768, 12));
}

TEST_CASE("GPT-2 layers: the formula with fused gelu, 24sbh more with gelu_new") {
  struct Case {
    const char* model;
    std::int64_t s, b, h, a;
  };
  for (const Case& c : {Case{"gpt2", 1024, 4, 768, 12}, Case{"gpt2", 256, 2, 768, 12},
                        Case{"gpt2-medium", 512, 8, 1024, 16}, Case{"gpt2-xl", 1024, 1, 1600, 25}}) {
    CAPTURE(c.model);
    CAPTURE(c.s);
    ModelConfig cfg = load_model(c.model);
    cfg.act = Act::gelu;  // the formula assumes one fused GELU kernel that saves its input
    const OpGraph g = graph_of(cfg, c.b, c.s);
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == korthikanti(c.s, c.b, c.h, c.a));
      CHECK((g.saved_bytes_of_layer(l) - g.saved_bytes_of_layer_large(l)).v == 2 * 2 * 4 * c.s * c.b);
    }
    // gelu_pytorch_tanh is fused too.
    cfg.act = Act::gelu_pytorch_tanh;
    CHECK(graph_of(cfg, c.b, c.s).saved_bytes_of_layer_large(0).v == korthikanti(c.s, c.b, c.h, c.a));

    // The catalogue's gelu_new is HF's NewGELUActivation, written as Python ops:
    //   0.5*x * (1 + tanh(sqrt(2/pi) * (x + 0.044715*x^3)))
    // Autograd keeps x (pow), tanh's output, 0.5*x and (1 + tanh) (the final mul saves
    // both operands): three (b, s, 4h) 16-bit tensors beyond x, i.e. 3 * 8sbh = 24sbh.
    const OpGraph n = graph_of(c.model, c.b, c.s);
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(n.layers.size()); ++l)
      CHECK(n.saved_bytes_of_layer_large(l).v == (34 + 24) * c.s * c.b * c.h + 5 * c.a * c.s * c.s * c.b);
  }
  // gpt2, s=1024, b=4: 58*sbh + 5as^2b.
  CHECK(graph_of("gpt2", 4, 1024).saved_bytes_of_layer_large(11).v == 434'110'464);
}

// Llama-family layer, derived from the HF code (16-bit activations, attention_dropout 0,
// q_dim = a*d = h). Per layer, with I the MLP width:
//   2 x RMSNorm: x.to(fp32) 4sbh (saved by pow and the fp32 mul), the 16-bit cast 2sbh
//                (saved by the weight mul), rsqrt 4sb (fp32)         -> 12sbh + 8sb
//   q/k/v proj input (one tensor)                                    ->  2sbh
//   QK^T: rotated q 2sbh, rotated-and-repeated k 2sbh                ->  4sbh
//   softmax(dtype=fp32) output 4as^2b, its 16-bit cast 2as^2b        ->  6as^2b
//   PV: repeated v 2sbh; o_proj input 2sbh                           ->  4sbh
//   gate/up input 2sbh; SiLU input 2sbI; mul: SiLU out + up 4sbI;
//   down_proj input 2sbI                                             ->  2sbh + 8sbI
//   large = 24sbh + 8sbI + 6as^2b ; statistics = 8sb
// In fp32 the casts vanish: pow saves the layer input itself, the weight mul saves x*r,
// and softmax's output is what the PV matmul saves:
//   large = 40sbh + 16sbI + 4as^2b ; statistics = 8sb
// The layer input is not saved in 16-bit (ToCopyBackward keeps nothing), and K/V heads
// (GQA) do not change the total: repeat_kv materialises full-width k and v.
TEST_CASE("Llama-family layers match the derived closed form") {
  struct Case {
    const char* model;
    std::int64_t s, b, h, a, i;
  };
  for (const Case& c :
       {Case{"Llama-2-7b", 4096, 1, 4096, 32, 11008}, Case{"Llama-2-7b", 512, 2, 4096, 32, 11008},
        Case{"Meta-Llama-3-8B", 2048, 1, 4096, 32, 14336}, Case{"Mistral-7B-v0.1", 1024, 2, 4096, 32, 14336},
        Case{"Llama-2-13b", 256, 4, 5120, 40, 13824}, Case{"tiny-llama", 64, 3, 64, 4, 176}}) {
    CAPTURE(c.model);
    CAPTURE(c.s);
    const std::int64_t sbh = c.s * c.b * c.h, sbi = c.s * c.b * c.i, as2b = c.a * c.s * c.s * c.b;
    for (DType dt : {DType::bf16, DType::fp16}) {
      const OpGraph g = graph_of(c.model, c.b, c.s, dt);
      for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) {
        CHECK(g.saved_bytes_of_layer_large(l).v == 24 * sbh + 8 * sbi + 6 * as2b);
        CHECK(g.saved_bytes_of_layer(l).v == 24 * sbh + 8 * sbi + 6 * as2b + 8 * c.s * c.b);
      }
    }
    const OpGraph f = graph_of(c.model, c.b, c.s, DType::fp32);
    CHECK(f.saved_bytes_of_layer_large(0).v == 40 * sbh + 16 * sbi + 4 * as2b);
    CHECK(f.saved_bytes_of_layer(0).v == 40 * sbh + 16 * sbi + 4 * as2b + 8 * c.s * c.b);
  }
  // Llama-2-7b, s=4096, b=1, bf16: 402,653,184 + 360,710,144 + 3,221,225,472 (+ 32,768).
  const OpGraph g = graph_of("Llama-2-7b", 1, 4096, DType::bf16);
  CHECK(g.saved_bytes_of_layer_large(31).v == 3'984'588'800);
  CHECK(g.saved_bytes_of_layer(31).v == 3'984'621'568);

  // With attention dropout the 16-bit cast is no longer saved; the mask (1 byte) and
  // the dropout output (2 bytes) are: 7as^2b instead of 6as^2b.
  ModelConfig cfg = load_model("tiny-llama");
  cfg.attention_dropout = 0.1;
  const OpGraph d = graph_of(cfg, 2, 32, DType::bf16);
  const std::int64_t s = 32, b = 2, h = 64, a = 4, i = 176;
  CHECK(d.saved_bytes_of_layer_large(1).v == 24 * s * b * h + 8 * s * b * i + 7 * a * s * s * b);
}

TEST_CASE("forward GEMM FLOPs: 2 x weights x tokens + 4bs^2hL") {
  auto gemm_flops = [](const OpGraph& g) {
    double f = 0;
    for (const auto& op : g.ops)
      for (const auto& m : op.gemms)
        f += 2.0 * static_cast<double>(m.batch) * static_cast<double>(m.m) * static_cast<double>(m.n) *
             static_cast<double>(m.k);
    return f;
  };
  struct Case {
    const char* model;
    std::int64_t b, s;
    std::int64_t matmul_params;  // params of every GEMM weight, the LM head included
  };
  // gpt2: all params less wte and wpe, plus the tied LM head (V*h) used once more.
  // Llama-2-7b: all params less embed_tokens (its lm_head is a separate param).
  const std::int64_t gpt2_w = 124'439'808 - 50257LL * 768 - 1024LL * 768 + 50257LL * 768;
  const std::int64_t llama_w = 6'738'415'616 - 32000LL * 4096;
  for (const Case& c : {Case{"gpt2", 4, 1024, gpt2_w}, Case{"Llama-2-7b", 1, 4096, llama_w},
                        Case{"Llama-2-7b", 2, 512, llama_w}}) {
    CAPTURE(c.model);
    const OpGraph g = graph_of(c.model, c.b, c.s);
    const double tokens = static_cast<double>(c.b * c.s);
    const double attn = 4.0 * static_cast<double>(c.b) * static_cast<double>(c.s * c.s) *
                        static_cast<double>(g.cfg.hidden) * static_cast<double>(g.cfg.layers);
    const double expect = 2.0 * static_cast<double>(c.matmul_params) * tokens + attn;
    CHECK(std::fabs(gemm_flops(g) / expect - 1.0) < 0.01);
    // The graph totals include the GEMMs, and backward is about twice forward.
    CHECK(g.fwd_flops().v >= gemm_flops(g));
    CHECK(g.bwd_flops().v / g.fwd_flops().v == doctest::Approx(2.0).epsilon(0.05));
  }
}

TEST_CASE("bad model configs are rejected with the file and key named") {
  const std::string f = "bad.json";
  auto parse = [&](const std::string& text) { return input_error([&] { parse_model_config(f, text); }); };
  const std::string gpt2_ok =
      R"({"model_type":"gpt2","vocab_size":256,"n_embd":64,"n_layer":2,"n_head":4,"n_positions":64})";
  CHECK(parse(gpt2_ok).empty());

  std::string m = parse(R"({"model_type": "gpt2", "n_embd": 64,)");
  CHECK(contains(m, "bad.json"));
  CHECK(contains(m, "malformed JSON at line 1"));

  m = parse(R"({"model_type": "t5", "d_model": 512})");
  CHECK(contains(m, "bad.json: model_type"));
  CHECK(contains(m, "bert, gpt2, llama, mistral, qwen2"));

  m = parse(R"({"n_embd": 64})");
  CHECK(contains(m, "model_type"));

  m = parse(R"({"model_type":"gpt2","vocab_size":256,"n_embd":64,"n_layer":2,"n_positions":64})");
  CHECK(contains(m, "bad.json: n_head"));
  CHECK(contains(m, "missing"));

  m = parse(R"({"model_type":"llama","vocab_size":256,"hidden_size":0,"intermediate_size":176,
               "num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":64})");
  CHECK(contains(m, "bad.json: hidden_size"));

  m = parse(R"({"model_type":"gpt2","vocab_size":256,"n_embd":-64,"n_layer":2,"n_head":4,"n_positions":64})");
  CHECK(contains(m, "bad.json: n_embd"));

  m = parse(R"({"model_type":"gpt2","vocab_size":256,"n_embd":64,"n_layer":2,"n_head":5,"n_positions":64})");
  CHECK(contains(m, "bad.json: n_head"));
  CHECK(contains(m, "must divide n_embd"));

  m = parse(R"({"model_type":"llama","vocab_size":256,"hidden_size":64,"intermediate_size":176,
               "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":3,"max_position_embeddings":64})");
  CHECK(contains(m, "bad.json: num_key_value_heads"));

  m = parse(R"({"model_type":"bert","vocab_size":256,"hidden_size":64,"num_hidden_layers":2,
               "num_attention_heads":4,"intermediate_size":256,"max_position_embeddings":64,"hidden_act":"mish"})");
  CHECK(contains(m, "bad.json: hidden_act"));
  CHECK(contains(m, "gelu, gelu_new, gelu_pytorch_tanh, relu, silu"));

  m = parse(R"({"model_type":"gpt2","vocab_size":256,"n_embd":64,"n_layer":2,"n_head":4,"n_positions":64,
               "resid_pdrop":1.0})");
  CHECK(contains(m, "bad.json: resid_pdrop"));

  m = parse(R"({"model_type":"bert","vocab_size":256,"hidden_size":64,"num_hidden_layers":2,
               "num_attention_heads":4,"intermediate_size":256,"max_position_embeddings":64,
               "architectures":["BertForQuestionAnswering"]})");
  CHECK(contains(m, "bad.json: architectures"));

  m = parse("[1, 2]");
  CHECK(contains(m, "JSON object"));

  m = input_error([] { load_model("gpt3"); });
  CHECK(contains(m, "unknown model 'gpt3'"));
  CHECK(contains(m, "gpt2-medium"));
  CHECK(contains(m, "--model"));

  // A sequence longer than a learned position table.
  m = input_error([] { graph_of("gpt2", 1, 2048); });
  CHECK(contains(m, "n_positions"));
}

TEST_CASE("configs: defaults, unknown HF keys, heads, families") {
  const std::string ok =
      R"({"model_type":"llama","vocab_size":256,"hidden_size":64,"intermediate_size":176,"num_hidden_layers":2,
          "num_attention_heads":4,"max_position_embeddings":64,"some_future_key":{"x":1},"rope_scaling":null})";
  const ModelConfig c = parse_model_config("x/config.json", ok);
  CHECK(c.family == Family::llama);
  CHECK(c.kv_heads == 4);
  CHECK(c.head_dim == 16);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.act == Act::silu);

  const ModelConfig q = parse_model_config(
      "q.json", R"({"model_type":"qwen2","vocab_size":256,"hidden_size":64,"intermediate_size":176,
                    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
                    "max_position_embeddings":64,"tie_word_embeddings":true})");
  CHECK(q.qkv_bias);
  CHECK(q.tie_word_embeddings);
  const OpGraph qg = graph_of(q, 1, 16);
  // q/k/v biases, no o_proj bias; lm_head tied to the embeddings.
  std::int64_t per_layer = 64 * 64 + 64 + 2 * (32 * 64 + 32) + 64 * 64 + 3 * 64 * 176 + 2 * 64;
  CHECK(qg.param_count() == 256 * 64 + 2 * per_layer + 64);

  CHECK(load_model("GPT2").name == "gpt2");  // case-insensitive catalogue
  CHECK(load_model("tiny-bert").head == Head::bert_pretraining);
  CHECK(load_model("gpt2").act == Act::gelu_new);
  CHECK(load_model("Mistral-7B-v0.1").sliding_window == 4096);
  CHECK(load_model("Meta-Llama-3-8B").kv_heads == 8);

  // A file path works as well as a catalogue name.
  const auto dir = std::filesystem::temp_directory_path() / "zeroplan_test_models";
  std::filesystem::create_directories(dir);
  const auto path = dir / "config.json";
  {
    std::ofstream out(path);
    out << R"({"model_type":"bert","architectures":["BertForMaskedLM"],"vocab_size":256,"hidden_size":64,
               "num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":256,"max_position_embeddings":64})";
  }
  const ModelConfig b = load_model(path.string());
  CHECK(b.head == Head::bert_mlm);
  CHECK(b.name == "zeroplan_test_models");
  const OpGraph bg = graph_of(b, 2, 16);
  for (const auto& p : bg.params) CHECK(p.name.rfind("bert.pooler", 0) == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("every catalogue entry builds a consistent graph") {
  const auto names = catalog_names();
  // The ten published models, GPT-3 175B and the three tiny test models.
  for (const char* n : {"bert-base-uncased", "bert-large-uncased", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                        "Llama-2-7b", "Llama-2-13b", "Meta-Llama-3-8B", "Mistral-7B-v0.1", "gpt3-175b", "tiny-gpt2",
                        "tiny-bert", "tiny-llama"})
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
  REQUIRE(names.size() == 14);
  for (const auto& n : names) {
    CAPTURE(n);
    // s = 128, or the whole position table of the tiny models (64).
    const ModelConfig c = load_model(n);
    const OpGraph g = graph_of(c, 1, std::min<std::int64_t>(128, c.max_positions));
    REQUIRE(g.layers.size() == static_cast<std::size_t>(g.cfg.layers));
    REQUIRE(g.loss != kNone);

    // Op order is a topological order, and the Boost view is acyclic.
    for (const auto& op : g.ops) {
      for (TensorId t : op.inputs) {
        REQUIRE(t >= 0);
        REQUIRE(static_cast<std::size_t>(t) < g.tensors.size());
        CHECK(g.tensors[static_cast<std::size_t>(t)].producer < op.id);
      }
      for (TensorId t : op.outputs) CHECK(g.tensors[static_cast<std::size_t>(t)].producer == op.id);
      for (TensorId t : op.saved) {
        REQUIRE(t >= 0);
        REQUIRE(static_cast<std::size_t>(t) < g.tensors.size());
        // A saved tensor is an input, an output, or a model input.
        const bool in = std::find(op.inputs.begin(), op.inputs.end(), t) != op.inputs.end();
        const bool out = std::find(op.outputs.begin(), op.outputs.end(), t) != op.outputs.end();
        CHECK((in || out));
      }
      for (ParamId p : op.params) {
        REQUIRE(p >= 0);
        CHECK(static_cast<std::size_t>(p) < g.params.size());
      }
      if (op.module != kNone) CHECK(static_cast<std::size_t>(op.module) < g.modules.size());
      CHECK(op.fwd_bytes.v > 0);
    }
    const BoostGraph bg = to_boost(g);
    CHECK(boost::num_vertices(bg) == g.ops.size());
    std::vector<std::size_t> order;
    CHECK_NOTHROW(boost::topological_sort(bg, std::back_inserter(order)));
    CHECK(order.size() == g.ops.size());

    // Modules cover every param once; only tied weights appear in a second module.
    const std::set<std::string> tied{"transformer.wte.weight", "model.embed_tokens.weight",
                                     "bert.embeddings.word_embeddings.weight", "cls.predictions.bias"};
    std::vector<int> seen(g.params.size(), 0);
    for (const auto& m : g.modules)
      for (ParamId p : m.params) ++seen[static_cast<std::size_t>(p)];
    for (const auto& p : g.params) {
      CAPTURE(p.name);
      const auto& owner = g.modules[static_cast<std::size_t>(p.module)].params;
      CHECK(std::count(owner.begin(), owner.end(), p.id) == 1);
      if (tied.count(p.name) != 0 && g.cfg.tie_word_embeddings)
        CHECK(seen[static_cast<std::size_t>(p.id)] == 2);
      else
        CHECK(seen[static_cast<std::size_t>(p.id)] == 1);
      CHECK(p.numel > 0);
    }
    // Every param is read by some op (its gradient comes from that op's backward).
    std::vector<int> used(g.params.size(), 0);
    for (const auto& op : g.ops)
      for (ParamId p : op.params) used[static_cast<std::size_t>(p)] = 1;
    CHECK(std::count(used.begin(), used.end(), 0) == 0);

    // Layer spans tile the layer ops, and each input comes from before the layer.
    for (std::size_t l = 0; l < g.layers.size(); ++l) {
      const LayerSpan& sp = g.layers[l];
      CHECK(sp.first <= sp.last);
      CHECK(g.tensors[static_cast<std::size_t>(sp.input)].producer < sp.first);
      for (OpId o = sp.first; o <= sp.last; ++o) CHECK(g.ops[static_cast<std::size_t>(o)].layer == static_cast<int>(l));
      CHECK(g.saved_bytes_of_layer(static_cast<std::int32_t>(l)) > g.saved_bytes_of_layer_large(static_cast<std::int32_t>(l)));
    }
    CHECK(!g.inputs.empty());
  }
}

TEST_CASE("dropout with p == 0 adds no op and no mask") {
  ModelConfig c = load_model("tiny-gpt2");
  c.attention_dropout = c.hidden_dropout = c.embedding_dropout = 0.0;
  const OpGraph g = graph_of(c, 2, 32);
  for (const auto& op : g.ops) CHECK(op.kind != OpKind::dropout);
  for (const auto& t : g.tensors) CHECK(t.dtype != DType::b1);
  // Without dropout: the two 1-byte hidden masks go (58 - 2 = 56 sbh with gelu_new), and
  // the PV matmul saves the softmax output itself: 2as^2b instead of 5as^2b.
  const std::int64_t s = 32, b = 2, h = 64, a = 4;
  CHECK(g.saved_bytes_of_layer_large(0).v == (32 + 24) * s * b * h + 2 * a * s * s * b);
}

TEST_CASE("sdpa attention saves q, k, v, the output and the logsumexp: no s^2 term") {
  auto sdpa_graph = [](const std::string& name, std::int64_t b, std::int64_t s) {
    GraphOptions o;
    o.micro_batch = b;
    o.seq_len = s;
    o.act_dtype = DType::fp16;
    o.attention = Attention::sdpa;
    return build_graph(load_model(name), o);
  };
  // BERT: 34sbh of the eager layer, less the s^2 tensors, plus the kernel's saved output
  // (2sbh): 36sbh; the logsumexp is a per-row statistic, 4 bytes × a·s·b.
  {
    const std::int64_t b = 8, s = 128, h = 1024, a = 16;
    const auto g = sdpa_graph("bert-large-uncased", b, s);
    for (std::int32_t l = 0; l < 24; ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == 36 * s * b * h);
      CHECK(g.saved_bytes_of_layer(l).v == 36 * s * b * h + 2 * 2 * 4 * s * b + 4 * a * s * b);
    }
  }
  // GPT-2 with gelu_new: 58sbh + 2sbh.
  {
    const std::int64_t b = 2, s = 1024, h = 768;
    const auto g = sdpa_graph("gpt2", b, s);
    CHECK(g.saved_bytes_of_layer_large(3).v == 60 * s * b * h);
  }
  // Llama: 24sbh + 8sbI + 2sbh.
  {
    const std::int64_t b = 1, s = 4096, h = 4096, i = 11008;
    const auto g = sdpa_graph("Llama-2-7b", b, s);
    CHECK(g.saved_bytes_of_layer_large(0).v == 26 * s * b * h + 8 * s * b * i);
  }
  // Causal kernels skip masked blocks: half the attention FLOPs of the bidirectional case.
  const auto causal = sdpa_graph("gpt2", 1, 512);
  const std::int64_t s = 512, h = 768;
  for (const auto& op : causal.ops)
    if (op.name == "layer0.attn.sdpa") CHECK(op.fwd_flops.v == doctest::Approx(2.0 * s * s * h));
}
