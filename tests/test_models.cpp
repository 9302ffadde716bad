// Golden tests for models/: catalogue parameter counts, saved activations against the
// closed forms, FLOPs, bad input, and the structure of the op graph.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/graph/topological_sort.hpp>
#include <fmt/format.h>

#include "core/error.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"

using namespace zp;
using namespace zp::models;

namespace {

// The closed forms below (Korthikanti's 5as²b term, the 4bs²hL attention FLOPs) are those of
// HF's eager attention: these graphs ask for it explicitly; the default (sdpa) and
// flash_attention_2 have their own tests at the end.
OpGraph graph_with(const ModelConfig& c, std::int64_t b, std::int64_t s, DType dt, Attention att) {
  GraphOptions o;
  o.micro_batch = b;
  o.seq_len = s;
  o.act_dtype = dt;
  o.attention = att;
  return build_graph(c, o);
}
OpGraph graph_with(const std::string& name, std::int64_t b, std::int64_t s, DType dt, Attention att) {
  return graph_with(load_model(name), b, s, dt, att);
}
OpGraph eager_graph(const std::string& name, std::int64_t b, std::int64_t s, DType dt = DType::fp16) {
  return graph_with(name, b, s, dt, Attention::eager);
}
OpGraph eager_graph(const ModelConfig& c, std::int64_t b, std::int64_t s, DType dt = DType::fp16) {
  return graph_with(c, b, s, dt, Attention::eager);
}

using zp::test::input_error;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Korthikanti et al.: s*b*h*(34 + 5*a*s/h) bytes per layer, exact in integers.
std::int64_t korthikanti(std::int64_t s, std::int64_t b, std::int64_t h, std::int64_t a) {
  return 34 * s * b * h + 5 * a * s * s * b;
}

}  // namespace

TEST_CASE("catalogue parameter counts are exact") {
  CHECK(eager_graph("gpt2", 1, 128).param_count() == 124'439'808);
  CHECK(eager_graph("gpt2-medium", 1, 128).param_count() == 354'823'168);
  CHECK(eager_graph("gpt2-large", 1, 128).param_count() == 774'030'080);
  CHECK(eager_graph("gpt2-xl", 1, 128).param_count() == 1'557'611'200);
  CHECK(eager_graph("gpt2", 1, 128).base_param_count() == 124'439'808);  // lm_head tied to wte
  CHECK(eager_graph("bert-base-uncased", 1, 128).base_param_count() == 109'482'240);
  CHECK(eager_graph("bert-large-uncased", 1, 128).base_param_count() == 335'141'888);
  // BertForPreTraining adds cls.predictions.{bias, transform} and cls.seq_relationship.
  CHECK(eager_graph("bert-base-uncased", 1, 128).param_count() == 110'106'428);
  CHECK(eager_graph("Llama-2-7b", 1, 128).param_count() == 6'738'415'616);
  CHECK(eager_graph("Llama-2-13b", 1, 128).param_count() == 13'015'864'320);
  CHECK(eager_graph("Meta-Llama-3-8B", 1, 128).param_count() == 8'030'261'248);
  CHECK(eager_graph("Mistral-7B-v0.1", 1, 128).param_count() == 7'241'732'096);
  // LlamaModel alone leaves out the untied lm_head (V x h).
  CHECK(eager_graph("Llama-2-7b", 1, 128).base_param_count() == 6'738'415'616 - 32000LL * 4096);
}

// Every catalogue entry against its published parameter total. Sources:
//  - "hub": the count the Hugging Face hub publishes for the checkpoint (its API's
//    safetensors.total, read from the safetensors headers; for sharded bf16 checkpoints the
//    same as model.safetensors.index.json's metadata.total_size / 2 bytes), for the hub id
//    models/hub_ids.json gives the entry:
//      Llama-3-8B / 3.1-8B 8,030,261,248 (total_size 16,060,522,496), Llama-3.1-70B 70,553,706,496,
//      Llama-3.1-405B 405,853,388,800, Llama-3.2-1B 1,235,814,400, Llama-3.2-3B 3,212,749,824,
//      Mistral-7B-v0.1 7,241,732,096, Mistral-7B-v0.3 7,248,023,552, Llama-2-7b 6,738,415,616,
//      Llama-2-13b 13,015,864,320; Qwen2.5 (model cards: 0.49B, 1.54B, 3.09B, 7.61B, 14.7B,
//      32.5B, 72.7B): 0.5B 494,032,768, 1.5B 1,543,714,304, 3B 3,085,938,688 (total_size
//      6,171,877,376), 7B 7,615,616,512 (total_size 15,231,233,024), 14B 14,770,033,664,
//      32B 32,763,876,352 (total_size 65,527,752,704), 72B 72,706,203,648.
//  - GPT-2: the hub's safetensors hold n_layer causal-mask buffers h.N.attn.bias
//    (1, 1, 1024, 1024) besides the parameters, and its published totals count them:
//      gpt2 137,022,720, gpt2-medium 379,988,992, gpt2-large 811,778,816, gpt2-xl 1,607,942,848.
//  - BERT: BertModel as AutoModel loads it (with the pooler), the count its model card's
//    "110M / 340M" rounds: 109,482,240 and 335,141,888.
//  - GPT-3 175B: the paper's Table 2.1 gives 175.0B, rounded; the architecture it lists
//    (96 layers, d_model 12288, 2048 positions, GPT-2's 50257 tokens) is within 0.3 % of it.
TEST_CASE("every catalogue entry has its published parameter count") {
  auto params = [](const std::string& n) { return graph_with(n, 1, 1, DType::bf16, kDefaultAttention).param_count(); };
  const std::vector<std::pair<std::string, std::int64_t>> hub{
      {"Meta-Llama-3-8B", 8'030'261'248},  {"Llama-3.1-8B", 8'030'261'248},    {"Llama-3.1-70B", 70'553'706'496},
      {"Llama-3.1-405B", 405'853'388'800}, {"Llama-3.2-1B", 1'235'814'400},    {"Llama-3.2-3B", 3'212'749'824},
      {"Mistral-7B-v0.1", 7'241'732'096},  {"Mistral-7B-v0.3", 7'248'023'552}, {"Llama-2-7b", 6'738'415'616},
      {"Llama-2-13b", 13'015'864'320},     {"Qwen2.5-0.5B", 494'032'768},      {"Qwen2.5-1.5B", 1'543'714'304},
      {"Qwen2.5-3B", 3'085'938'688},       {"Qwen2.5-7B", 7'615'616'512},      {"Qwen2.5-14B", 14'770'033'664},
      {"Qwen2.5-32B", 32'763'876'352},     {"Qwen2.5-72B", 72'706'203'648}};
  for (const auto& [n, total] : hub) {
    CAPTURE(n);
    CHECK(params(n) == total);
  }
  // The bf16 shards' byte totals are twice the counts.
  CHECK(2 * params("Llama-3.1-8B") == 16'060'522'496);
  CHECK(2 * params("Qwen2.5-3B") == 6'171'877'376);
  CHECK(2 * params("Qwen2.5-7B") == 15'231'233'024);
  CHECK(2 * params("Qwen2.5-32B") == 65'527'752'704);
  const std::vector<std::pair<std::string, std::int64_t>> gpt2{
      {"gpt2", 137'022'720}, {"gpt2-medium", 379'988'992}, {"gpt2-large", 811'778'816}, {"gpt2-xl", 1'607'942'848}};
  for (const auto& [n, total] : gpt2) {
    CAPTURE(n);
    const ModelConfig c = load_model(n);
    CHECK(params(n) + c.layers * c.max_positions * c.max_positions == total);
  }
  CHECK(graph_with("bert-base-uncased", 1, 1, DType::bf16, kDefaultAttention).base_param_count() == 109'482'240);
  CHECK(graph_with("bert-large-uncased", 1, 1, DType::bf16, kDefaultAttention).base_param_count() == 335'141'888);
  CHECK(std::abs(static_cast<double>(params("gpt3-175b")) / 175.0e9 - 1.0) < 0.003);
  // Every entry but the tiny test models is covered above.
  std::size_t covered = hub.size() + gpt2.size() + 2 + 1;
  for (const auto& n : catalog_names()) if (n.rfind("tiny-", 0) == 0) ++covered;
  CHECK(covered == catalog_names().size());
}

TEST_CASE("catalogue configs: rope scaling, biases and tying as published") {
  const ModelConfig l31 = load_model("Llama-3.1-8B");
  CHECK(l31.rope_type == "llama3");
  CHECK(l31.rope_factor == 8.0);
  CHECK(l31.rope_theta == 500000.0);
  CHECK(l31.max_positions == 131072);
  CHECK(!l31.tie_word_embeddings);
  CHECK(!l31.qkv_bias);
  const ModelConfig l32 = load_model("Llama-3.2-1B");
  CHECK(l32.rope_factor == 32.0);
  CHECK(l32.tie_word_embeddings);
  CHECK(l32.head_dim == 64);
  CHECK(load_model("Meta-Llama-3-8B").rope_type.empty());  // rope_scaling: null
  for (const char* n : {"Qwen2.5-0.5B", "Qwen2.5-7B", "Qwen2.5-72B"}) {
    const ModelConfig q = load_model(n);
    CHECK(q.qkv_bias);   // q, k, v with bias; o_proj and the MLP without
    CHECK(!q.mlp_bias);
    CHECK(q.sliding_window == 0);  // use_sliding_window: false
    CHECK(q.rope_theta == 1000000.0);
  }
  CHECK(load_model("Qwen2.5-3B").tie_word_embeddings);
  CHECK(!load_model("Qwen2.5-7B").tie_word_embeddings);
  const OpGraph q = graph_with("Qwen2.5-0.5B", 1, 8, DType::bf16, kDefaultAttention);
  CHECK(q.params[1].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(q.params[2].name == "model.layers.0.self_attn.q_proj.bias");
  CHECK(std::none_of(q.params.begin(), q.params.end(), [](const Param& p) { return p.name.find("o_proj.bias") != std::string::npos; }));
  // Mistral v0.3: a 32768-token vocabulary, no sliding window, RoPE base 1e6; v0.1 kept.
  const ModelConfig m3 = load_model("Mistral-7B-v0.3"), m1 = load_model("Mistral-7B-v0.1");
  CHECK(m3.vocab == 32768);
  CHECK(m3.sliding_window == 0);
  CHECK(m3.rope_theta == 1000000.0);
  CHECK(m1.vocab == 32000);
  CHECK(m1.sliding_window == 4096);
}

TEST_CASE("hub ids resolve offline to catalogue entries") {
  CHECK(load_model("meta-llama/Meta-Llama-3-8B").name == "Meta-Llama-3-8B");
  CHECK(load_model("bert-large-uncased").name == "bert-large-uncased");
  CHECK(load_model("google-bert/bert-large-uncased").name == "bert-large-uncased");
  CHECK(load_model("openai-community/gpt2-medium").name == "gpt2-medium");
  CHECK(load_model("Qwen/Qwen2.5-7B").name == "Qwen2.5-7B");
  CHECK(load_model("qwen/qwen2.5-7b").name == "Qwen2.5-7B");  // the hub resolves ids case-insensitively
  CHECK(load_model("meta-llama/Meta-Llama-3.1-8B").name == "Llama-3.1-8B");  // the name before the rename
  const auto names = catalog_names();
  const auto ids = hub_ids();
  CHECK(ids.size() == 26);
  for (const auto& [id, n] : ids) {
    CAPTURE(id);
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
    CHECK(load_model(id).name == n);
    CHECK(load_model(id).source == load_model(n).source);
  }
  // Every published entry has its hub id; GPT-3 and the tiny models have none.
  for (const auto& n : names) {
    CAPTURE(n);
    const bool has = std::any_of(ids.begin(), ids.end(), [&](const auto& e) { return e.second == n; });
    CHECK(has == (n != "gpt3-175b" && n.rfind("tiny-", 0) != 0));
  }
  // An unknown name says what is known and how to pass a config.json.
  const std::string msg = input_error([] { load_model("meta-llama/Llama-4-Scout"); });
  CHECK(contains(msg, "--model: unknown model 'meta-llama/Llama-4-Scout'"));
  CHECK(contains(msg, "Llama-3.1-8B"));
  CHECK(contains(msg, "meta-llama/Meta-Llama-3-8B"));
  CHECK(contains(msg, "--model path/to/config.json"));
  CHECK(contains(input_error([] { load_model("Qwen2.5-7"); }), "did you mean 'Qwen2.5-7B'?"));
  // A path that is no hub id stays a path.
  CHECK(contains(input_error([] { load_model("/no/such/dir"); }), "/no/such/dir: cannot open file"));
  CHECK(contains(input_error([] { load_model("missing.json"); }), "missing.json: cannot open file"));
}

TEST_CASE("params follow registration order with Hugging Face names and shapes") {
  const OpGraph g = eager_graph("gpt2", 1, 64);
  REQUIRE(g.params.size() == 2 + 12 * 12 + 2);
  CHECK(g.params[0].name == "transformer.wte.weight");
  CHECK(g.params[1].name == "transformer.wpe.weight");
  CHECK(g.params[2].name == "transformer.h.0.ln_1.weight");
  CHECK(g.params[4].name == "transformer.h.0.attn.c_attn.weight");
  CHECK(g.params[4].shape == std::vector<std::int64_t>{768, 2304});  // Conv1D: (in, out)
  CHECK(g.params.back().name == "transformer.ln_f.bias");

  const OpGraph l = eager_graph("Meta-Llama-3-8B", 1, 64);
  CHECK(l.params[0].name == "model.embed_tokens.weight");
  CHECK(l.params[1].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(l.params[2].shape == std::vector<std::int64_t>{1024, 4096});  // k_proj: (kv*d, h)
  CHECK(l.params[8].name == "model.layers.0.input_layernorm.weight");
  CHECK(l.params.back().name == "lm_head.weight");
  CHECK_FALSE(l.params.back().in_base_model);

  const OpGraph b = eager_graph("bert-base-uncased", 1, 64);
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
    const OpGraph g = eager_graph(c.model, c.b, c.s);
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == korthikanti(c.s, c.b, c.h, c.a));
      // Two LayerNorms, each keeping fp32 mean and rstd per token.
      CHECK((g.saved_bytes_of_layer(l) - g.saved_bytes_of_layer_large(l)).v == 2 * 2 * 4 * c.s * c.b);
    }
  }
  // bert-large, s=128, b=64: 128*64*1024*(34 + 10) bytes per layer.
  CHECK(eager_graph("bert-large-uncased", 64, 128).saved_bytes_of_layer_large(0).v == 369'098'752);
  // bf16 has the same sizes as fp16.
  CHECK(eager_graph("bert-base-uncased", 4, 128, DType::bf16).saved_bytes_of_layer_large(5).v ==
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
    const OpGraph g = eager_graph(cfg, c.b, c.s);
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == korthikanti(c.s, c.b, c.h, c.a));
      CHECK((g.saved_bytes_of_layer(l) - g.saved_bytes_of_layer_large(l)).v == 2 * 2 * 4 * c.s * c.b);
    }
    // gelu_pytorch_tanh is fused too.
    cfg.act = Act::gelu_pytorch_tanh;
    CHECK(eager_graph(cfg, c.b, c.s).saved_bytes_of_layer_large(0).v == korthikanti(c.s, c.b, c.h, c.a));

    // The catalogue's gelu_new is HF's NewGELUActivation, written as Python ops:
    //   0.5*x * (1 + tanh(sqrt(2/pi) * (x + 0.044715*x^3)))
    // Autograd keeps x (pow), tanh's output, 0.5*x and (1 + tanh) (the final mul saves
    // both operands): three (b, s, 4h) 16-bit tensors beyond x, i.e. 3 * 8sbh = 24sbh.
    const OpGraph n = eager_graph(c.model, c.b, c.s);
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(n.layers.size()); ++l)
      CHECK(n.saved_bytes_of_layer_large(l).v == (34 + 24) * c.s * c.b * c.h + 5 * c.a * c.s * c.s * c.b);
  }
  // gpt2, s=1024, b=4: 58*sbh + 5as^2b.
  CHECK(eager_graph("gpt2", 4, 1024).saved_bytes_of_layer_large(11).v == 434'110'464);
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
      const OpGraph g = eager_graph(c.model, c.b, c.s, dt);
      for (std::int32_t l = 0; l < static_cast<std::int32_t>(g.layers.size()); ++l) {
        CHECK(g.saved_bytes_of_layer_large(l).v == 24 * sbh + 8 * sbi + 6 * as2b);
        CHECK(g.saved_bytes_of_layer(l).v == 24 * sbh + 8 * sbi + 6 * as2b + 8 * c.s * c.b);
      }
    }
    const OpGraph f = eager_graph(c.model, c.b, c.s, DType::fp32);
    CHECK(f.saved_bytes_of_layer_large(0).v == 40 * sbh + 16 * sbi + 4 * as2b);
    CHECK(f.saved_bytes_of_layer(0).v == 40 * sbh + 16 * sbi + 4 * as2b + 8 * c.s * c.b);
  }
  // Llama-2-7b, s=4096, b=1, bf16: 402,653,184 + 360,710,144 + 3,221,225,472 (+ 32,768).
  const OpGraph g = eager_graph("Llama-2-7b", 1, 4096, DType::bf16);
  CHECK(g.saved_bytes_of_layer_large(31).v == 3'984'588'800);
  CHECK(g.saved_bytes_of_layer(31).v == 3'984'621'568);

  // With attention dropout the 16-bit cast is no longer saved; the mask (1 byte) and
  // the dropout output (2 bytes) are: 7as^2b instead of 6as^2b.
  ModelConfig cfg = load_model("tiny-llama");
  cfg.attention_dropout = 0.1;
  const OpGraph d = eager_graph(cfg, 2, 32, DType::bf16);
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
    const OpGraph g = eager_graph(c.model, c.b, c.s);
    const double tokens = static_cast<double>(c.b * c.s);
    const double attn = 4.0 * static_cast<double>(c.b) * static_cast<double>(c.s * c.s) *
                        static_cast<double>(g.cfg.hidden) * static_cast<double>(g.cfg.layers);
    const double expect = 2.0 * static_cast<double>(c.matmul_params) * tokens + attn;
    CHECK(std::fabs(gemm_flops(g) / expect - 1.0) < 0.01);
    // The graph totals include the GEMMs, and backward is about twice forward.
    CHECK(g.fwd_flops().v >= gemm_flops(g));
    CHECK(g.bwd_flops().v / g.fwd_flops().v == zp::test::approx(2.0).epsilon(0.05));
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
  m = input_error([] { eager_graph("gpt2", 1, 2048); });
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
  const OpGraph qg = eager_graph(q, 1, 16);
  // q/k/v biases, no o_proj bias; lm_head tied to the embeddings.
  std::int64_t per_layer = 64 * 64 + 64 + 2 * (32 * 64 + 32) + 64 * 64 + 3 * 64 * 176 + 2 * 64;
  CHECK(qg.param_count() == 256 * 64 + 2 * per_layer + 64);

  CHECK(load_model("GPT2").name == "gpt2");  // case-insensitive catalogue
  CHECK(load_model("tiny-bert").head == Head::bert_pretraining);
  CHECK(load_model("gpt2").act == Act::gelu_new);
  CHECK(load_model("Mistral-7B-v0.1").sliding_window == 4096);
  CHECK(load_model("Meta-Llama-3-8B").kv_heads == 8);

  // A file path works as well as a catalogue name.
  const auto dir = zp::test::temp_path("zeroplan_test_models");
  std::filesystem::create_directories(dir);
  const auto path = dir / "config.json";
  {
    std::ofstream out(path);
    out << R"({"model_type":"bert","architectures":["BertForMaskedLM"],"vocab_size":256,"hidden_size":64,
               "num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":256,"max_position_embeddings":64})";
  }
  const ModelConfig b = load_model(path.string());
  CHECK(b.head == Head::bert_mlm);
  CHECK(b.name == dir.filename().string());  // a config.json is named by its folder
  const OpGraph bg = eager_graph(b, 2, 16);
  for (const auto& p : bg.params) CHECK(p.name.rfind("bert.pooler", 0) == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("every catalogue entry builds a consistent graph, with each attention") {
  const auto names = catalog_names();
  // The published models, GPT-3 175B and the three tiny test models.
  const std::vector<std::string> expected{
      "bert-base-uncased", "bert-large-uncased", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "Llama-2-7b",
      "Llama-2-13b", "Meta-Llama-3-8B", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-3.2-1B",
      "Llama-3.2-3B", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-3B", "Qwen2.5-7B", "Qwen2.5-14B", "Qwen2.5-32B",
      "Qwen2.5-72B", "Mistral-7B-v0.1", "Mistral-7B-v0.3", "gpt3-175b", "tiny-gpt2", "tiny-bert", "tiny-llama"};
  for (const auto& n : expected) CHECK(std::find(names.begin(), names.end(), n) != names.end());
  REQUIRE(names.size() == expected.size());
  for (const auto& n : names)
    for (const Attention att : {Attention::eager, Attention::sdpa, Attention::flash_attention_2}) {
    CAPTURE(n);
    CAPTURE(attention_name(att));
    // s = 128, or the whole position table of the tiny models (64); bf16 (flash-attn's dtype).
    const ModelConfig c = load_model(n);
    const OpGraph g = graph_with(c, 1, std::min<std::int64_t>(128, c.max_positions), DType::bf16, att);
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
  const OpGraph g = eager_graph(c, 2, 32);
  for (const auto& op : g.ops) CHECK(op.kind != OpKind::dropout);
  for (const auto& t : g.tensors) CHECK(t.dtype != DType::b1);
  // Without dropout: the two 1-byte hidden masks go (58 - 2 = 56 sbh with gelu_new), and
  // the PV matmul saves the softmax output itself: 2as^2b instead of 5as^2b.
  const std::int64_t s = 32, b = 2, h = 64, a = 4;
  CHECK(g.saved_bytes_of_layer_large(0).v == (32 + 24) * s * b * h + 2 * a * s * s * b);
}

namespace {

Bytes saved_of(const OpGraph& g, const std::string& name) {
  for (const auto& op : g.ops)
    if (op.name == name) {
      Bytes b{};
      for (TensorId t : op.saved) b += g.tensors[static_cast<std::size_t>(t)].bytes;
      return b;
    }
  FAIL("no op ", name);
  return Bytes{};
}

const Op& op_named(const OpGraph& g, const std::string& name) {
  for (const auto& op : g.ops)
    if (op.name == name) return op;
  throw std::runtime_error("no op " + name);
}

}  // namespace

TEST_CASE("sdpa attention saves q, k, v, its output (the merged tensor), logsumexp and rng_state: no s^2 term") {
  auto sdpa_graph = [](const std::string& name, std::int64_t b, std::int64_t s,
                       Transformers t = kDefaultTransformers) {
    GraphOptions o;
    o.micro_batch = b;
    o.seq_len = s;
    o.act_dtype = DType::fp16;
    o.attention = Attention::sdpa;
    o.transformers = t;
    return build_graph(load_model(name), o);
  };
  const std::int64_t rng = 16;  // the philox seed and offset: 2 int64 per layer (shape (2), counted as large)
  // BERT: 34sbh of the eager layer, less the s^2 tensors; the kernel writes its output in
  // (B, T, H, D) order, so transpose(1, 2).contiguous() copies nothing and the output dense
  // saves the kernel's output. No mask (nothing is padded). The logsumexp is a per-row
  // statistic, 4 bytes × a·s·b. The same in transformers 4.46 and 5.
  for (const Transformers t : {Transformers::v5, Transformers::v4_46}) {
    const std::int64_t b = 8, s = 128, h = 1024, a = 16;
    const auto g = sdpa_graph("bert-large-uncased", b, s, t);
    CHECK(!g.kv_cache);
    for (std::int32_t l = 0; l < 24; ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == 34 * s * b * h + rng);
      CHECK(g.saved_bytes_of_layer(l).v == 34 * s * b * h + rng + 2 * 2 * 4 * s * b + 4 * a * s * b);
    }
    for (const auto& op : g.ops) {
      CHECK(op.fn != Fn::extended_mask);
      CHECK(op.fn != Fn::merge_heads);
    }
    const Op& sd = op_named(g, "layer0.attention.self.sdpa");
    CHECK(!sd.causal);
    CHECK(sd.inputs.size() == 3);
    CHECK(op_named(g, "layer0.attention.output.dense").inputs[0] == sd.outputs[0]);
  }
  // GPT-2 with gelu_new: eager's 58sbh has qkv (6sbh, which the strided q view keeps alive)
  // and the merged tensor (2sbh, now the kernel's output). transformers 5 adds the KV cache's
  // contiguous copies of k and v (2sbh each), which the kernel reads and saves: 62sbh; 4.46
  // does not: 58sbh.
  {
    const std::int64_t b = 2, s = 1024, h = 768;
    const auto g = sdpa_graph("gpt2", b, s);
    CHECK(g.kv_cache);
    CHECK(g.saved_bytes_of_layer_large(3).v == 62 * s * b * h + rng);
    const Op& sd = op_named(g, "layer3.attn.sdpa");
    REQUIRE(sd.inputs.size() == 3);
    CHECK(g.tensors[static_cast<std::size_t>(sd.inputs[1])].name == "layer3.attn.cache_k");
    CHECK(g.tensors[static_cast<std::size_t>(sd.inputs[2])].name == "layer3.attn.cache_v");
    CHECK(sdpa_graph("gpt2", b, s, Transformers::v4_46).saved_bytes_of_layer_large(3).v == 58 * s * b * h + rng);
  }
  // Llama-2 (K = A): eager's 24sbh + 8sbI, whose rotated q, k, v (6sbh) and merged tensor
  // (2sbh) sdpa saves as they are (5: k and v are the cache's copies).
  {
    const std::int64_t b = 1, s = 4096, h = 4096, i = 11008;
    for (const Transformers t : {Transformers::v5, Transformers::v4_46})
      CHECK(sdpa_graph("Llama-2-7b", b, s, t).saved_bytes_of_layer_large(0).v == 24 * s * b * h + 8 * s * b * i + rng);
  }
  // Llama-3 (K = 8 of A = 32): transformers 5 calls sdpa with enable_gqa (no mask): k and v
  // keep their 8 heads, 2sbh·K/A each: 20sbh + 4sbh·K/A + 8sbI = 21sbh + 8sbI. 4.46 repeats
  // them to 32 heads first (repeat_kv): 24sbh + 8sbI.
  {
    const std::int64_t b = 1, s = 4096, h = 4096, i = 14336;
    const auto g = sdpa_graph("Meta-Llama-3-8B", b, s);
    CHECK(g.saved_bytes_of_layer_large(0).v == 21 * s * b * h + 8 * s * b * i + rng);
    for (const auto& op : g.ops) CHECK(op.fn != Fn::repeat_kv);
    const HeadsLayout f = heads_layout(g, op_named(g, "layer0.self_attn.sdpa"));
    CHECK(f.H == 32);
    CHECK(f.K == 8);
    const auto old = sdpa_graph("Meta-Llama-3-8B", b, s, Transformers::v4_46);
    CHECK(old.saved_bytes_of_layer_large(0).v == 24 * s * b * h + 8 * s * b * i + rng);
    CHECK(heads_layout(old, op_named(old, "layer0.self_attn.sdpa")).K == 32);
  }
  // Causal kernels skip masked blocks: half the attention FLOPs of the bidirectional case.
  const auto causal = sdpa_graph("gpt2", 1, 512);
  const std::int64_t s = 512, h = 768;
  for (const auto& op : causal.ops)
    if (op.name == "layer0.attn.sdpa") CHECK(op.fwd_flops.v == zp::test::approx(2.0 * s * s * h));
}

TEST_CASE("the default attention is what transformers picks, and the docs say which") {
  CHECK(kDefaultAttention == Attention::sdpa);  // transformers 5.25: "sdpa" when none is requested
  CHECK(GraphOptions{}.attention == kDefaultAttention);
  CHECK(choose_attention(load_model("gpt2"), "").attention == kDefaultAttention);
  // README.md and docs/design.md state the default in one sentence built from the code's
  // value: changing kDefaultAttention without them fails here.
  const std::string sentence = fmt::format("The default attention is `{}`", attention_name(kDefaultAttention));
  for (const std::string doc : {"README.md", "docs/design.md"}) {
    CAPTURE(doc);
    std::ifstream in(std::filesystem::path(ZEROPLAN_SHARED_DIR) / doc);
    REQUIRE(in.good());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(contains(text, sentence));
  }
}

TEST_CASE("attention names: transformers' spellings, config.json's attn_implementation, the command line wins") {
  CHECK(parse_attention("--attention", "", "flash_attention_2") == Attention::flash_attention_2);
  CHECK(std::string(attention_name(Attention::flash_attention_2)) == "flash_attention_2");
  CHECK(contains(input_error([] { parse_attention("--attention", "", "flash2"); }),
                 "--attention: must be one of eager, sdpa, flash_attention_2"));
  CHECK(contains(input_error([] { parse_attention("--attention", "", "flash_attention_3"); }), "flash_attention_3"));
  CHECK(contains(input_error([] { parse_attention("--attention", "", "SDPA"); }), "did you mean 'sdpa'?"));
  const std::string base = R"({"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4,
                               "n_positions": 64)";
  const ModelConfig none = parse_model_config("c.json", base + "}");
  CHECK(!none.attn_implementation);
  const ModelConfig eager = parse_model_config("c.json", base + R"(, "attn_implementation": "eager"})");
  REQUIRE(eager.attn_implementation);
  CHECK(*eager.attn_implementation == Attention::eager);
  // transformers 4.x's save_pretrained wrote the private key.
  const ModelConfig old = parse_model_config("c.json", base + R"(, "_attn_implementation": "flash_attention_2"})");
  CHECK(*old.attn_implementation == Attention::flash_attention_2);
  CHECK(old.attn_key == "_attn_implementation");
  CHECK(contains(input_error([&] { parse_model_config("c.json", base + R"(, "attn_implementation": "flex_attention"})"); }),
                 "c.json: attn_implementation: must be one of eager, sdpa, flash_attention_2"));
  CHECK(contains(input_error([&] {
                   parse_model_config("c.json", base + R"(, "attn_implementation": "eager", "_attn_implementation": "sdpa"})");
                 }),
                 "contradicts attn_implementation 'eager'"));
  // The config.json's choice, unless the command line asks otherwise (and then says so).
  const AttentionChoice from_cfg = choose_attention(eager, "");
  CHECK(from_cfg.attention == Attention::eager);
  CHECK(from_cfg.note.empty());
  const AttentionChoice cli = choose_attention(eager, "sdpa");
  CHECK(cli.attention == Attention::sdpa);
  CHECK(cli.note == "--attention sdpa overrides attn_implementation \"eager\" of c.json");
  CHECK(choose_attention(eager, "eager").note.empty());
  CHECK(choose_attention(none, "flash_attention_2").note.empty());
  CHECK(contains(input_error([&] { choose_attention(none, "fa2"); }), "--attention: must be one of"));
}


TEST_CASE("flash_attention_2 saves q, k, v as given (no repeat_kv), its output, logsumexp and rng_state") {
  auto flash = [](const std::string& n, std::int64_t b, std::int64_t s, Transformers t = kDefaultTransformers) {
    GraphOptions o;
    o.micro_batch = b;
    o.seq_len = s;
    o.act_dtype = DType::bf16;
    o.attention = Attention::flash_attention_2;
    o.transformers = t;
    return build_graph(load_model(n), o);
  };
  auto sdpa = [](const std::string& n, std::int64_t b, std::int64_t s) { return graph_with(n, b, s, DType::bf16, Attention::sdpa); };
  const std::int64_t rng = 16;  // rng_state: 2 int64 per layer, counted with the large tensors (shape (2))
  // BERT: what sdpa saves (34sbh): flash-attn also writes straight into the merged
  // (B, T, H·D) layout (the output dense saves that one tensor); the logsumexp (4 bytes ×
  // a·s·b) and LayerNorm statistics are the small rest.
  {
    const std::int64_t b = 8, s = 128, h = 1024, a = 16;
    const auto g = flash("bert-large-uncased", b, s);
    for (std::int32_t l = 0; l < 24; ++l) {
      CHECK(g.saved_bytes_of_layer_large(l).v == 34 * s * b * h + rng);
      CHECK(g.saved_bytes_of_layer(l).v == 34 * s * b * h + rng + 2 * 2 * 4 * s * b + 4 * a * s * b);
    }
    // No mask is built when nothing is padded, and no merge_heads copy follows the kernel.
    for (const auto& op : g.ops) {
      CHECK(op.fn != Fn::extended_mask);
      CHECK(op.fn != Fn::merge_heads);
    }
    const Op& fa = op_named(g, "layer0.attention.self.flash_attn");
    CHECK(!fa.causal);
    CHECK(op_named(g, "layer0.attention.output.dense").inputs[0] == fa.outputs[0]);
    // Non-causal: 4·b·s²·h forward, 2.5× that backward (Q Kᵀ recomputed + four gradient GEMMs).
    CHECK(fa.fwd_flops.v == zp::test::approx(4.0 * b * s * s * h));
    CHECK(fa.bwd_flops.v == zp::test::approx(2.5 * 4.0 * b * s * s * h));
  }
  // GPT-2 (gelu_new): what sdpa saves, 62sbh with transformers 5's KV cache copies, 58sbh
  // with 4.46's views.
  {
    const std::int64_t b = 2, s = 1024, h = 768;
    const auto g = flash("gpt2", b, s);
    CHECK(g.saved_bytes_of_layer_large(3).v == 62 * s * b * h + rng);
    CHECK(sdpa("gpt2", b, s).saved_bytes_of_layer_large(3).v == g.saved_bytes_of_layer_large(3).v);
    CHECK(flash("gpt2", b, s, Transformers::v4_46).saved_bytes_of_layer_large(3).v == 58 * s * b * h + rng);
    // Causal: the lower triangle with its diagonal, s(s+1)/2 pairs: 4·b·a·d·s(s+1)/2.
    const Op& fa = op_named(g, "layer0.attn.flash_attn");
    CHECK(fa.causal);
    CHECK(fa.fwd_flops.v == zp::test::approx(2.0 * b * h * s * (s + 1)));
    CHECK(fa.bwd_flops.v == zp::test::approx(2.5 * 2.0 * b * h * s * (s + 1)));
  }
  // Llama-2 (K = A): 24sbh + 8sbI, as sdpa.
  {
    const std::int64_t b = 1, s = 4096, h = 4096, i = 11008;
    CHECK(flash("Llama-2-7b", b, s).saved_bytes_of_layer_large(0).v == 24 * s * b * h + 8 * s * b * i + rng);
  }
  // Llama-3 (GQA, K = 8 of A = 32): flash-attn reads k and v with their 8 heads (2sbh·K/A
  // each): 24sbh - 4sbh + 4sbh·K/A + 8sbI = 21sbh + 8sbI. With transformers 5 they are the
  // KV cache's (B, K, T, D) copies, with 4.46 the rotated k and the projection's view.
  for (const Transformers t : {Transformers::v5, Transformers::v4_46}) {
    const std::int64_t b = 1, s = 4096, h = 4096, i = 14336;
    const auto g = flash("Meta-Llama-3-8B", b, s, t);
    CHECK(g.saved_bytes_of_layer_large(0).v == 21 * s * b * h + 8 * s * b * i + rng);
    for (const auto& op : g.ops) CHECK(op.fn != Fn::repeat_kv);
    const Op& fa = op_named(g, "layer0.self_attn.flash_attn");
    const HeadsLayout f = heads_layout(g, fa);
    CHECK(f.H == 32);
    CHECK(f.K == 8);
    CHECK(f.D == 128);
    CHECK(f.causal);
    const bool v5 = t == Transformers::v5;
    CHECK(g.tensors[static_cast<std::size_t>(f.k.tensor)].name ==
          (v5 ? "layer0.self_attn.cache_k" : "layer0.self_attn.rope_k"));
    CHECK(g.tensors[static_cast<std::size_t>(f.v.tensor)].name ==
          (v5 ? "layer0.self_attn.cache_v" : "layer0.self_attn.v_proj"));
    // The cache copy is (B, K, T, D); the projection's view (B, T, K·D).
    CHECK(f.v.st == (v5 ? 128 : 8 * 128));
    CHECK(g.tensors[static_cast<std::size_t>(f.rng)].dtype == DType::i64);
    CHECK(saved_of(g, "layer0.self_attn.flash_attn").v ==
          (2 * s * h + 2 * 2 * s * 8 * 128 + 2 * s * h) + 4 * 32 * s + rng);
  }
  // GPT-2's q, k, v are column blocks of c_attn's (B, T, 3C) output (4.46), or q is and k, v
  // are the cache's copies (5).
  {
    const auto g = flash("tiny-gpt2", 2, 16, Transformers::v4_46);
    const HeadsLayout f = heads_layout(g, op_named(g, "layer0.attn.flash_attn"));
    CHECK(f.q.tensor == f.k.tensor);
    CHECK(f.k.offset == 64);
    CHECK(f.v.offset == 128);
    CHECK(f.q.st == 192);
    CHECK(f.o.st == 64);
    const auto c = flash("tiny-gpt2", 2, 16);
    const HeadsLayout fc = heads_layout(c, op_named(c, "layer0.attn.flash_attn"));
    CHECK(fc.q.st == 192);
    CHECK(fc.q.sh == 16);  // head_dim
    CHECK(fc.k.tensor != fc.q.tensor);
    CHECK(fc.k.offset == 0);
    CHECK(fc.k.sh == 16 * 16);  // (B, H, T, D): T·D
    CHECK(fc.k.st == 16);
  }
  // flash-attn has no fp32 kernel: an fp32 configuration is refused, naming the flag.
  CHECK(contains(input_error([] { graph_with("tiny-llama", 1, 16, DType::fp32, Attention::flash_attention_2); }),
                 "--attention: flash_attention_2 runs in fp16 or bf16 only"));
}

TEST_CASE("transformers releases: the modelled behaviour is named, 5 by default") {
  CHECK(kDefaultTransformers == Transformers::v5);
  CHECK(GraphOptions{}.transformers == Transformers::v5);
  CHECK(std::string(transformers_name(Transformers::v5)) == "5");
  CHECK(std::string(transformers_name(Transformers::v4_46)) == "4.46");
  CHECK(parse_transformers("--transformers", "", "5") == Transformers::v5);
  CHECK(parse_transformers("--transformers", "", "5.17.0") == Transformers::v5);
  CHECK(parse_transformers("--transformers", "", "4.46") == Transformers::v4_46);
  CHECK(parse_transformers("--transformers", "", "4.46.3") == Transformers::v4_46);
  for (const char* bad : {"4", "4.47", "50", "5x", "", "v5"})
    CHECK(contains(input_error([&] { parse_transformers("--transformers", "", bad); }),
                   "--transformers: must be 5 (transformers 5.x, the default) or 4.46"));
}

TEST_CASE("transformers 5 decoders copy k and v into the KV cache unless it is off") {
  auto build = [](const ModelConfig& c, Attention att, Transformers t, bool ckpt) {
    GraphOptions o;
    o.micro_batch = 2;
    o.seq_len = 16;
    o.act_dtype = DType::bf16;
    o.attention = att;
    o.transformers = t;
    o.gradient_checkpointing = ckpt;
    return build_graph(c, o);
  };
  auto count = [](const OpGraph& g, Fn f) {
    return std::count_if(g.ops.begin(), g.ops.end(), [&](const Op& op) { return op.fn == f; });
  };
  const ModelConfig gpt2 = load_model("tiny-gpt2"), llama = load_model("tiny-llama"), bert = load_model("tiny-bert");
  CHECK(gpt2.use_cache);  // config.json's use_cache (true in the catalogue, as on the hub)
  for (const Attention att : {Attention::eager, Attention::sdpa, Attention::flash_attention_2}) {
    CAPTURE(attention_name(att));
    const OpGraph g = build(gpt2, att, Transformers::v5, false);
    CHECK(g.kv_cache);
    // One copy of k and one of v per layer (eager adds the matmul's copy of the strided q).
    CHECK(count(g, Fn::heads_copy) == (att == Attention::eager ? 3 : 2) * gpt2.layers);
    const Op& ck = op_named(g, "layer1.attn.cache_k");
    const Tensor& k = g.tensors[static_cast<std::size_t>(ck.outputs[0])];
    CHECK(k.shape == std::vector<std::int64_t>{2, gpt2.heads, 16, gpt2.head_dim});
    CHECK(ck.col[0] == gpt2.hidden);  // k: columns [C, 2C) of c_attn's output
    CHECK(op_named(g, "layer1.attn.cache_v").col[0] == 2 * gpt2.hidden);
    CHECK(ck.saved.empty());
    // Gradient checkpointing turns use_cache off; 4.46's cache copies nothing; nor does a
    // config with use_cache false.
    CHECK(count(build(gpt2, att, Transformers::v5, true), Fn::heads_copy) == 0);
    CHECK(count(build(gpt2, att, Transformers::v4_46, false), Fn::heads_copy) == 0);
    ModelConfig off = gpt2;
    off.use_cache = false;
    CHECK(!build(off, att, Transformers::v5, false).kv_cache);
    // The Llama family: (B, K, T, D) copies of the rotated k and of v.
    const OpGraph l = build(llama, att, Transformers::v5, false);
    CHECK(count(l, Fn::heads_copy) == 2 * llama.layers);
    const Tensor& lk = l.tensors[static_cast<std::size_t>(op_named(l, "layer0.self_attn.cache_k").outputs[0])];
    CHECK(lk.shape == std::vector<std::int64_t>{2, llama.kv_heads, 16, llama.head_dim});
    // BERT has no decoder cache.
    CHECK(!build(bert, att, Transformers::v5, false).kv_cache);
  }
  const ModelConfig parsed = parse_model_config(
      "c.json", R"({"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4,
                    "n_positions": 64, "use_cache": false})");
  CHECK(!parsed.use_cache);
  CHECK(contains(input_error([] {
                   parse_model_config("c.json", R"({"model_type": "gpt2", "vocab_size": 256, "n_embd": 64,
                                                    "n_layer": 2, "n_head": 4, "n_positions": 64, "use_cache": 1})");
                 }),
                 "c.json: use_cache"));
}

TEST_CASE("the model output references the logits and the KV cache") {
  GraphOptions o;
  o.micro_batch = 2;
  o.seq_len = 16;
  o.act_dtype = DType::bf16;
  auto names = [](const OpGraph& g) {
    std::vector<std::string> out;
    for (TensorId t : g.outputs) out.push_back(g.tensors[static_cast<std::size_t>(t)].name);
    return out;
  };
  const OpGraph gpt2 = build_graph(load_model("tiny-gpt2"), o);
  const auto gn = names(gpt2);
  CHECK(std::count(gn.begin(), gn.end(), "lm_head") == 1);
  CHECK(std::count(gn.begin(), gn.end(), "layer0.attn.cache_k") == 1);
  CHECK(gn.size() == 1 + 2 * static_cast<std::size_t>(gpt2.cfg.layers));
  // The logits are the lm_head's 16-bit output, which the loss upcasts (a copy that saves nothing).
  CHECK(gpt2.tensors[static_cast<std::size_t>(gpt2.outputs.back())].dtype == DType::bf16);
  o.gradient_checkpointing = true;
  CHECK(names(build_graph(load_model("tiny-gpt2"), o)) == std::vector<std::string>{"lm_head"});
  // BertForPreTraining: prediction_logits and seq_relationship_logits.
  CHECK(names(build_graph(load_model("tiny-bert"), o)) ==
        std::vector<std::string>{"cls.predictions.decoder", "cls.seq_relationship"});
}

TEST_CASE("cross_entropy's backward holds the gradient of the log-probabilities") {
  GraphOptions o;
  o.micro_batch = 2;
  o.seq_len = 16;
  o.act_dtype = DType::bf16;
  const OpGraph g = build_graph(load_model("tiny-gpt2"), o);
  const Op& ce = op_named(g, "loss.cross_entropy");
  REQUIRE(ce.bwd_grads.size() == 1);
  CHECK(ce.bwd_grads[0] == ce.outputs[0]);  // logp, (B·T, V) in the upcast's fp32
  const Tensor& logp = g.tensors[static_cast<std::size_t>(ce.outputs[0])];
  CHECK(logp.dtype == DType::fp32);
  CHECK(logp.bytes.v == 2 * 16 * g.cfg.vocab * 4);
  // Every other op's gradients are its inputs'.
  for (const auto& op : g.ops)
    if (op.fn != Fn::cross_entropy) CHECK(op.bwd_grads.empty());
}

TEST_CASE("torch_dtype: the dtype transformers builds the model in, read from config.json") {
  const std::string base = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64)";
  CHECK(!parse_model_config("c.json", base + "}").torch_dtype);
  const ModelConfig t = parse_model_config("c.json", base + R"(, "torch_dtype": "bfloat16"})");
  REQUIRE(t.torch_dtype);
  CHECK(*t.torch_dtype == DType::bf16);
  CHECK(t.torch_dtype_key == "torch_dtype");
  // transformers 5 writes "dtype"; "torch." prefixes and "auto" are accepted.
  CHECK(*parse_model_config("c.json", base + R"(, "dtype": "float16"})").torch_dtype == DType::fp16);
  CHECK(*parse_model_config("c.json", base + R"(, "torch_dtype": "torch.float32"})").torch_dtype == DType::fp32);
  CHECK(!parse_model_config("c.json", base + R"(, "torch_dtype": "auto"})").torch_dtype);
  CHECK(contains(input_error([&] { parse_model_config("c.json", base + R"(, "torch_dtype": "int8"})"); }),
                 "c.json: torch_dtype: must be one of float32, float16, bfloat16, auto, got 'int8'"));
  CHECK(contains(input_error([&] {
                   parse_model_config("c.json", base + R"(, "torch_dtype": "bfloat16", "dtype": "float32"})");
                 }),
                 "c.json: dtype: 'float32' contradicts torch_dtype 'bf16'"));
  CHECK(contains(input_error([&] { parse_model_config("c.json", base + R"(, "dtype": 16})"); }), "c.json: dtype: must be a string"));
}

TEST_CASE("eager softmax: the backward's grad × output temporary, and bf16's upcast before softmax(dtype=float32)") {
  for (const DType dt : {DType::bf16, DType::fp16}) {
    CAPTURE(dtype_name(dt));
    const OpGraph g = graph_with("tiny-llama", 2, 16, dt, Attention::eager);
    const Op& sm = op_named(g, "layer0.self_attn.softmax");
    REQUIRE(sm.bwd_scratch.size() == 1);
    const Tensor& tmp = g.tensors[static_cast<std::size_t>(sm.bwd_scratch[0])];
    CHECK(tmp.dtype == DType::fp32);  // the gradient's dtype: the fp32 output's
    CHECK(tmp.shape == std::vector<std::int64_t>{2, 4, 16, 16});
    CHECK(tmp.producer == kNone);
    // bf16 is upcast by a copy (its backward casts the fp32 gradient down); fp16 takes the
    // fused half_to_float kernel, whose input is the fp16 scores themselves.
    const Tensor& in = g.tensors[static_cast<std::size_t>(sm.inputs[0])];
    CHECK(in.dtype == (dt == DType::bf16 ? DType::fp32 : DType::fp16));
    CHECK(in.name == (dt == DType::bf16 ? "layer0.self_attn.softmax_upcast" : "layer0.self_attn.mask"));
  }
  // GPT-2 and BERT take softmax in the activation dtype: the temporary is too.
  const OpGraph b = graph_with("tiny-bert", 2, 16, DType::bf16, Attention::eager);
  const Op& bs = op_named(b, "layer1.attention.self.softmax");
  REQUIRE(bs.bwd_scratch.size() == 1);
  CHECK(b.tensors[static_cast<std::size_t>(bs.bwd_scratch[0])].dtype == DType::bf16);
  CHECK(b.tensors[static_cast<std::size_t>(bs.bwd_scratch[0])].bytes.v == 2 * 4 * 16 * 16 * 2);
}
