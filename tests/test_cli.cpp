// The zeroplan executable end to end: outputs people read, and one clear line with exit
// status 2 for every bad input.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace {

struct Run {
  int status = -1;
  std::string out;  // stdout + stderr
};

Run run(const std::string& args) {
  const std::string cmd = std::string(ZEROPLAN_BIN) + " " + args + " 2>&1";
  Run r;
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), f)) r.out += buf.data();
  const int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string tmp_file(const std::string& name, const std::string& text) {
  const auto dir = zp::test::temp_path("zeroplan-test-cli");
  std::filesystem::create_directories(dir);
  const auto p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

const std::string kExample = std::string(ZEROPLAN_SHARED_DIR) + "/examples/bert_large_ds_config.json";

// One line, exit 2, naming what is wrong.
void bad(const std::string& args, const std::string& must_contain) {
  CAPTURE(args);
  const Run r = run(args);
  CAPTURE(r.out);
  CHECK(r.status == 2);
  CHECK(r.out.find(must_contain) != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("simulate --json has the documented schema") {
  const Run r = run("simulate --model bert-large-uncased --ds-config " + kExample +
                    " --gpus 4 --gpu V100-16GB --stages 0,1,2,3 --micro-batch 64 --seq-len 128 --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  CHECK(j["model"] == "bert-large-uncased");
  CHECK(j["world_size"] == 4);
  REQUIRE(j["results"].size() == 4);
  for (int s = 0; s < 4; ++s) {
    const auto& m = j["results"][static_cast<std::size_t>(s)]["memory"];
    CHECK(j["results"][static_cast<std::size_t>(s)]["stage"] == s);
    std::int64_t sum = 0;
    for (const char* c : {"params", "grads", "master_params", "optimizer_states", "comm_buffers", "activations",
                          "temporaries"})
      sum += m["by_category"][c].get<std::int64_t>();
    CHECK(sum == m["peak_allocated_bytes"].get<std::int64_t>());
    CHECK(m["device_used_bytes"].get<std::int64_t>() >= m["reserved_bytes"].get<std::int64_t>());
    CHECK(m["reserved_bytes"].get<std::int64_t>() >= m["peak_allocated_bytes"].get<std::int64_t>());
    CHECK(m["peak_event"].get<std::string>().size() > 0);
    CHECK(m.contains("host_bytes"));
    CHECK(m["fits"].is_boolean());
    // The segments at the end of the step: no more than the peak reserved, each pool's sizes
    // summing to its bytes (this config's overlap_comm is off: every request on the compute stream).
    std::int64_t held = 0;
    std::set<std::string> streams;
    for (const auto& q : m["reserved_by_pool"]) {
      std::int64_t sizes = 0;
      for (const auto& x : q["segment_sizes"]) sizes += x.get<std::int64_t>();
      CHECK(sizes == q["bytes"].get<std::int64_t>());
      CHECK(q["segments"].get<std::size_t>() == q["segment_sizes"].size());
      CHECK(q["allocated_bytes"].get<std::int64_t>() <= q["bytes"].get<std::int64_t>());
      held += q["bytes"].get<std::int64_t>();
      streams.insert(q["stream"].get<std::string>());
    }
    CHECK(held > 0);
    CHECK(held <= m["reserved_bytes"].get<std::int64_t>());
    CHECK(streams == std::set<std::string>{"compute"});
  }
}

TEST_CASE("simulate --rank picks the rank; the default is the heaviest") {
  const std::string base = "simulate --model gpt2 --gpus 3 --gpu A100-80GB --seq-len 128 --stages 2 --json";
  const auto dflt = nlohmann::json::parse(run(base).out);
  std::int64_t most = 0;
  for (int r = 0; r < 3; ++r) {
    const auto j = nlohmann::json::parse(run(base + " --rank " + std::to_string(r)).out);
    CHECK(j["results"][0]["rank"] == r);
    most = std::max(most, j["results"][0]["memory"]["by_category"]["grads"].get<std::int64_t>());
  }
  // The default simulates the rank with the largest grads_in_partition.
  CHECK(dflt["results"][0]["memory"]["by_category"]["grads"].get<std::int64_t>() == most);
}

// --fused-gelu is zeroplan's kernel variant (docs/executor.md): the header says so, the JSON
// records it, and GPT-2's saved activations shrink by three (B, T, 4H) tensors per layer.
TEST_CASE("simulate --fused-gelu: said in the header and the JSON, three MLP-wide tensors fewer per layer") {
  // GPT-2 trains in fp32 here (no precision section): the peak is at the loss in backward, with
  // every saved activation live.
  const std::string base = "simulate --model gpt2 --gpus 1 --gpu H200-141GB --micro-batch 4 --seq-len 1024 --stages 0";
  const Run t = run(base + " --fused-gelu");
  REQUIRE(t.status == 0);
  CHECK(t.out.find(", fused_gelu (zeroplan's kernel variants, not HF's graph)") != std::string::npos);
  const auto hf = nlohmann::json::parse(run(base + " --json").out);
  const auto fused = nlohmann::json::parse(run(base + " --fused-gelu --json").out);
  CHECK(hf["fused_gelu"] == false);
  CHECK(fused["fused_gelu"] == true);
  const auto at_peak = [](const nlohmann::json& j) {
    CHECK(j["results"][0]["memory"]["peak_event"] == "ms0/bwd/loss.cross_entropy");
    return j["results"][0]["memory"]["by_category"]["activations"].get<std::int64_t>();
  };
  const std::int64_t per_layer = 3 * std::int64_t{4} * 1024 * 3072 * 4;  // three (B, T, 4H) fp32 tensors
  CHECK(at_peak(hf) - at_peak(fused) == 12 * per_layer);
}

TEST_CASE("simulate prints a table and warns about sparse_attention") {
  const Run r = run("simulate --model bert-large-uncased --ds-config " + kExample +
                    " --gpus 4 --gpu V100-16GB --micro-batch 64 --seq-len 128");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("sparse_attention: accepted but not modelled") != std::string::npos);
  CHECK(r.out.find("peak event") != std::string::npos);
}

TEST_CASE("a kernel variant that changes nothing in the model's graph is said, in simulate and train") {
  // --fused-mlp on BERT (exact GELU: no cuBLASLt epilogue), --fused-residual-norm on the Llama
  // (RMSNorm): each named once; a variant that applies is not named, one whose ops another
  // variant fuses already is said to change nothing beside it.
  const Run bert = run("simulate --model tiny-bert --gpus 1 --gpu H100-80GB --micro-batch 2 --seq-len 16 "
                       "--fused-mlp --fused-residual-norm");
  REQUIRE(bert.status == 0);
  CHECK(bert.out.find("warning: --fused-mlp leaves tiny-bert's graph as it is") != std::string::npos);
  CHECK(bert.out.find("--fused-residual-norm leave") == std::string::npos);
  const Run gpt2 = run("simulate --model tiny-gpt2 --gpus 1 --gpu H100-80GB --micro-batch 2 --seq-len 16 --fused-mlp "
                       "--fused-gelu --fused-loss --fused-residual-norm");
  REQUIRE(gpt2.status == 0);
  CHECK(gpt2.out.find("as it is") == std::string::npos);
  // --fused-mlp's op holds the GELU: --fused-gelu beside it changes nothing, and is said so.
  CHECK(gpt2.out.find("warning: --fused-gelu changes nothing in tiny-gpt2's graph beside the other variants on, which "
                      "fuse its ops already") != std::string::npos);
  const Run llama = run("simulate --model tiny-llama --gpus 1 --gpu H100-80GB --micro-batch 2 --seq-len 16 "
                        "--fused-residual-norm --fused-mlp --fused-loss --json");
  REQUIRE(llama.status == 0);
  const auto doc = nlohmann::json::parse(llama.out.substr(llama.out.find('{')));
  bool said = false;
  for (const auto& w : doc["warnings"])
    said |= w.get<std::string>() ==
            "--fused-residual-norm and --fused-mlp leave tiny-llama's graph as it is: the model has none of the ops they fuse";
  CHECK(said);
  const Run train = run("train --model tiny-bert --steps 1 --seq-len 16 --quiet --fused-mlp");
  REQUIRE(train.status == 0);
  CHECK(train.out.find("warning: --fused-mlp leaves tiny-bert's graph as it is") != std::string::npos);
}

TEST_CASE("explain stage 1 vs 2 on the example names the causes") {
  const Run r = run("explain --model bert-large-uncased --ds-config " + kExample +
                    " --gpus 4 --gpu V100-16GB --micro-batch 64 --seq-len 128 --stage 1 --vs-stage 2");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("reduce (ipg) bucket") != std::string::npos);
  CHECK(r.out.find("reduce_bucket_size=5e+08") != std::string::npos);
  CHECK(r.out.find("verdict:") != std::string::npos);
  CHECK(r.out.find("reduce_bucket_size 5e+07") != std::string::npos);
  CHECK(r.out.find("warning: ") != std::string::npos);  // sparse_attention is never silent
  const Run j = run("explain --model bert-large-uncased --ds-config " + kExample +
                    " --gpus 4 --gpu V100-16GB --micro-batch 64 --seq-len 128 --stage 1 --vs-stage 2 --json");
  REQUIRE(j.status == 0);
  const auto doc = nlohmann::json::parse(j.out.substr(j.out.find('{')));
  CHECK(doc["causes"].size() > 3);
  CHECK(doc["suggestions"].size() > 2);
}

TEST_CASE("explain --ds-config A --vs-ds-config B") {
  const std::string a = tmp_file("a.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "fp16": {"enabled": true}})");
  const std::string b = tmp_file("b.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "overlap_comm": true}, "fp16": {"enabled": true}})");
  const Run r = run("explain --model gpt2 --gpus 8 --gpu A100-80GB --seq-len 512 --ds-config " + a + " --vs-ds-config " + b);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("2 buffers (overlap_comm true") != std::string::npos);
}

TEST_CASE("a step of more events than 32-bit ids number is refused with one line") {
  // 1200 layers × 32767 micro-steps: about two billion events, more buffers.
  nlohmann::json deep = nlohmann::json::parse(std::ifstream(std::string(ZEROPLAN_SHARED_DIR) + "/models/catalog/tiny-gpt2.json"));
  deep["n_layer"] = 1200;
  deep["n_embd"] = 8;
  deep["n_head"] = 1;
  const std::string model = tmp_file("deep-gpt2.json", deep.dump());
  const std::string cfg = tmp_file("gas32767.json", R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 32767})");
  bad("simulate --model " + model + " --ds-config " + cfg + " --gpus 1 --gpu A100-80GB --seq-len 8",
      "gradient_accumulation_steps: 32767 micro-steps of deep-gpt2 make a step of");
}

TEST_CASE("bad input: one line, exit status 2") {
  const std::string ok = " --gpus 4 --gpu V100-16GB --micro-batch 64 --seq-len 128";
  bad("simulate --model bert-large-uncased --ds-config " + tmp_file("malformed.json", "{\"zero_optimization\": {") + ok,
      "malformed JSON at line 1");
  bad("simulate --model " + tmp_file("t5.json", R"({"model_type": "t5", "d_model": 512})") + ok, "model_type");
  bad("simulate --model " + tmp_file("nohidden.json", R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "vocab_size": 100, "n_positions": 64})") + ok,
      "n_embd");
  for (const char* v : {"0", "-1", "1.5", "\"big\""}) {
    bad("simulate --model bert-large-uncased --ds-config " +
            tmp_file("rbs.json", std::string(R"({"train_batch_size": 4096, "zero_optimization": {"stage": 2, "reduce_bucket_size": )") + v + "}}") + ok,
        "zero_optimization.reduce_bucket_size");
  }
  bad("simulate --model bert-large-uncased --ds-config " +
          tmp_file("batch.json", R"({"train_batch_size": 4000, "train_micro_batch_size_per_gpu": 64})") + " --gpus 4 --seq-len 128",
      "train_batch_size");
  bad("simulate --model bert-large-uncased --ds-config " + kExample + " --gpus 0", "--gpus");
  bad("simulate --model bert-large-uncased --ds-config " + kExample + " --gpus 4 --gpu V101", "unknown GPU 'V101'");
  bad("simulate --model bert-large-uncased --ds-config " +
          tmp_file("typo.json", R"({"train_batch_size": 64, "zero_optimization": {"reduce_bucket_sise": 5e8}})") + ok,
      "did you mean 'reduce_bucket_size'");
  bad("simulate --model no-such-model" + ok, "no-such-model");
  bad("simulate --model bert-large-uncased --ds-config " + kExample + " --gpus 4 --stages 0,5", "--stages");
  bad("simulate --model bert-large-uncased --ds-config " + kExample + " --gpus 4 --micro-batch x", "--micro-batch");
  bad("simulate --model bert-large-uncased --ds-config " + kExample + " --gpus 4 --seq-len 100000", "--seq-len");
  bad("simulate --model bert-large-uncased --ds-config /nonexistent/ds.json --gpus 4", "cannot open");
  bad("explain --model bert-large-uncased --ds-config " + kExample + " --gpus 4 --stage 1", "--vs-stage");
  bad("simulate --gpus 4", "--model");
  bad("simulate --model gpt2 --gpus 4 --rank 4", "--rank");
  bad("simulate --model gpt2 --gpus 4 --attention flash2", "--attention");
  bad("simulate --model Llama-2-13b --gpus 2 --micro-batch 1000000000 --stages 0", "too large to simulate");
  // Eager attention's (B, A, T, T) scores at T = 2^31 - 1 pass the 1 PiB bound (sdpa and
  // flash-attn keep nothing of size T²).
  bad("simulate --model " + tmp_file("npos.json", R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 2147483647})") + " --gpus 2 --attention eager",
      "too large to simulate");
  bad("simulate --model /nonexistent/config.json --gpus 2", "cannot open");
  bad("simulate --model gpt2 --gpus 2 --ds-config /tmp", "is a directory");
  bad("simulate --model gpt2 --gpus 6 --ds-config " +
          tmp_file("hpz.json", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}})"),
      "zero_hpz_partition_size");
}

TEST_CASE("bad JSON values never escape as a crash or a second line") {
  bad("simulate --model " + tmp_file("huge.json", R"({"model_type": "gpt2", "n_embd": 1e400})") + " --gpus 2", "malformed JSON");
  bad("simulate --model gpt2 --gpus 2 --ds-config " + tmp_file("huge_ds.json", R"({"train_batch_size": 1e400})"), "malformed JSON");
  bad("simulate --model gpt2 --gpus 2 --ds-config " + tmp_file("newline_key.json", R"({"a\nb": 1})"), "a\\x0ab");
  bad("simulate --model gpt2 --gpus 2 --ds-config " +
          tmp_file("u64.json", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"reduce_bucket_size": 18446744073709551615}})"),
      "zero_optimization.reduce_bucket_size");
}

TEST_CASE("simulate predicts time: JSON time and comm keys, a Chrome trace of a 24-layer model") {
  const std::string trace = (zp::test::temp_path("zeroplan-test-cli") / "bert.trace.json").string();
  const Run r = run("simulate --model bert-large-uncased --ds-config " + kExample +
                    " --gpus 4 --gpu V100-16GB --stages 1,2 --micro-batch 64 --seq-len 128 --json --trace " + trace);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  for (const auto& res : j["results"]) {
    for (const char* k : {"forward_ms", "backward_ms", "backward_allreduce_ms", "step_ms", "iteration_ms",
                          "samples_per_s", "tokens_per_s", "tflops", "mfu"})
      CHECK(res["time"][k].get<double>() > 0);
    CHECK(res["time"]["iteration_ms"].get<double>() >=
          res["time"]["forward_ms"].get<double>() + res["time"]["backward_ms"].get<double>());
    CHECK(res["comm"]["bytes_per_rank"].get<std::int64_t>() > 0);
    CHECK(res["comm"]["by_kind"].contains("all_reduce"));
  }
  // Stage 2 reduces every micro-step on the compute stream: more exposed communication.
  CHECK(j["results"][1]["time"]["backward_allreduce_ms"].get<double>() >
        j["results"][0]["time"]["backward_allreduce_ms"].get<double>());
  std::ifstream in(trace);
  REQUIRE(in.good());
  const auto doc = nlohmann::json::parse(in);
  int slices = 0;
  std::set<std::string> tracks;
  std::map<std::string, int> gemm_fns, other_fns;  // a compute slice's op function, for per-class times
  int bias_slices = 0, gemm_bwd_slices = 0, device_other_slices = 0;
  for (const auto& e : doc["traceEvents"]) {
    const std::string ph = e["ph"];
    CHECK((ph == "X" || ph == "C" || ph == "M"));
    if (ph == "X") {
      ++slices;
      CHECK(e["dur"].get<double>() >= 0);
      tracks.insert(std::to_string(e["pid"].get<int>()) + "/" + std::to_string(e["tid"].get<int>()));
      if (e["args"].value("kind", "") == "compute") {
        REQUIRE(e["args"].contains("fn"));
        ++(e["args"]["gemm"].get<bool>() ? gemm_fns : other_fns)[e["args"]["fn"].get<std::string>()];
        // A backward linear op with a bias names its bias sums' time, a part of its own.
        const std::string fn = e["args"]["fn"];
        if (e["args"]["phase"] == "bwd" && (fn == "linear" || fn == "linear_first_token")) ++gemm_bwd_slices;
        // The slice's time by kernel class adds up to it: a linear's products (gemm) and
        // its bias sums (elementwise), a fused attention's kernels, the rest elementwise.
        REQUIRE(e["args"].contains("profiled"));
        const auto& cls = e["args"]["profiled"];
        double sum = 0;
        for (const auto& [k, us] : cls.items()) sum += us.get<double>();
        CHECK(sum == zp::test::approx(e["dur"].get<double>()).epsilon(1e-9));
        const bool attention = fn == "sdpa" || fn == "flash_attention";
        if (attention) CHECK(cls.size() == 1);
        if (attention) CHECK(cls.contains("attention"));
        else if (e["args"]["gemm"].get<bool>()) CHECK(cls.contains("gemm"));
        else CHECK(!cls.contains("gemm"));
        if (cls.contains("elementwise") && e["args"]["gemm"].get<bool>() && !attention) {
          ++bias_slices;
          CHECK(e["args"]["phase"] == "bwd");
          CHECK(cls["elementwise"].get<double>() < e["dur"].get<double>());
        }
      } else if (e["args"].contains("kind")) {
        // Every other device slice is one class, named by its kind (nothing is offloaded here:
        // every copy, optimizer and collective slice is the device's); the host's have none.
        const std::string kind = e["args"]["kind"];
        if (kind == "host") {
          CHECK(!e["args"].contains("profiled"));
        } else {
          REQUIRE(e["args"].contains("profiled"));
          if (e["dur"].get<double>() > 0) CHECK(e["args"]["profiled"].contains(kind));
          ++device_other_slices;
        }
      }
    }
  }
  CHECK(slices > 10000);
  CHECK(tracks.size() >= 2);
  CHECK(gemm_fns.count("linear") == 1);
  CHECK(other_fns.count("layernorm") == 1);
  CHECK(other_fns.count("linear") == 0);
  // Every linear of BERT-large has a bias (six per layer, the pooler, the heads): every backward
  // linear slice names its bias sums, and only those (the attention's bmm products on the V100
  // have none; stages 1 and 2: no forward adds apart).
  CHECK(gemm_bwd_slices >= 6 * 24 + 4);
  CHECK(bias_slices == gemm_bwd_slices);
  CHECK(device_other_slices > 0);
}

TEST_CASE("simulate --trace: the iteration without the phases' synchronisations, where it differs, as a process") {
  const auto dir = zp::test::temp_path("zeroplan-test-cli");
  const std::string base = R"({"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 1)";
  // The process's makespan (its last slice's end) and whether its name says it runs unsynchronised.
  auto processes = [](const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in.good());
    const auto doc = nlohmann::json::parse(in);
    std::map<int, std::string> names;
    std::map<int, double> end;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "process_name") {
        const std::string name = e["args"]["name"];
        // The process's args say which program it is, for tools that sum one of them.
        CHECK(e["args"]["unsynchronised"].get<bool>() == (name.find("unsynchronised") != std::string::npos));
        names[e["pid"].get<int>()] = name;
      }
      if (e["ph"] == "X") {
        double& t = end[e["pid"].get<int>()];
        t = std::max(t, e["ts"].get<double>() + e["dur"].get<double>());
      }
    }
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [pid, name] : names) out.emplace_back(name, end[pid] * 1e-3);  // ms
    return out;
  };
  auto simulate = [&](const std::string& cfg_text, const std::string& trace) {
    const Run r = run("simulate --model gpt2 --ds-config " + tmp_file("unsync.json", cfg_text) +
                      " --cluster 1xH100-80GB --seq-len 512 --json --trace " + trace);
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.out.substr(r.out.find('{')))["results"][0]["time"];
  };
  // Stage 1 without overlap_comm: the ZeRO step's loops run while the device finishes the
  // backward when nothing synchronises the phases, so the iteration is shorter than their sum.
  const std::string t1 = (dir / "s1.trace.json").string();
  const auto time = simulate(base + "}}", t1);
  const auto p1 = processes(t1);
  REQUIRE(p1.size() == 2);
  CHECK(p1[0].first == "stage 1 rank 0");
  CHECK(p1[1].first == "stage 1 rank 0, phases unsynchronised");
  CHECK(p1[0].second == zp::test::approx(time["synchronised_iteration_ms"].get<double>()).epsilon(1e-3));
  CHECK(p1[1].second == zp::test::approx(time["iteration_ms"].get<double>()).epsilon(1e-3));
  CHECK(p1[1].second < p1[0].second);
  // With overlap_comm the phases' synchronisations change nothing DeepSpeed does: one process.
  const std::string t2 = (dir / "s1_overlap.trace.json").string();
  simulate(base + R"(, "overlap_comm": true}})", t2);
  const auto p2 = processes(t2);
  REQUIRE(p2.size() == 1);
  CHECK(p2[0].first == "stage 1 rank 0");
}

TEST_CASE("collectives prints an nccl-tests-like sweep") {
  const Run r = run("collectives --cluster 8xA100-80GB-NVSwitch --min 1M --max 1G --factor 4 --ops all_reduce");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("busbw") != std::string::npos);
  CHECK(r.out.find("1073741824") != std::string::npos);
  bad("collectives --cluster no-such-cluster", "no-such-cluster");
  bad("collectives --cluster 8xA100-80GB-NVSwitch --min 1X", "--min");
  bad("simulate --model gpt2 --nodes 2", "--nodes");
  bad("simulate --model gpt2 --cluster 8xA100-80GB-NVSwitch --gpus 9", "--gpus");
}

// The measured sweep between this job's ranks: here two CPU ranks over MPI (--device cpu; the
// same code runs NCCL between GPUs, tests/gpu/test_exec_cuda.cpp), beside the prediction, and
// its nccl-tests-format file read back by calibrate.
TEST_CASE("collectives --measure: a sweep between the job's ranks, beside the prediction, in nccl-tests format") {
  const std::string mpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np ";
  const auto dir = zp::test::temp_path("zeroplan-test-cli");
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "sweep.txt").string();
  std::filesystem::remove(file);
  const std::string base = " collectives --measure --min 1K --max 256K --factor 4 --warmup 1";
  const std::string args = base + " --iters 4 --device cpu --cluster 8xH200-141GB-NVSwitch --ops all_reduce,all_gather,reduce_scatter";
  const auto r = zp::test::run_shell(mpi + "2 " + std::string(ZEROPLAN_BIN) + args + " --out " + file);
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("2 ranks on 1 node through mpi") != std::string::npos);
  int rows = 0;
  double factor = 0;  // nccl-tests' bus-bandwidth factor at 2 ranks: all_reduce 2(n-1)/n, the others (n-1)/n
  std::istringstream lines(r.out);
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("# Collective: ", 0) == 0) factor = l.find("all_reduce") != std::string::npos ? 1.0 : 0.5;
    if (l.empty() || l[0] == '#') continue;
    std::istringstream f(l);
    double size = 0, count = 0, t = 0, busbw = 0, pred = 0;
    f >> size >> count >> t >> busbw >> pred;
    CHECK(t > 0);
    // The bus bandwidth is the size over the time times the factor, as printed (2 decimals; a
    // rank descheduled on a loaded machine can make it print 0.00, which is still consistent).
    const double expected = size / (t * 1e-6) / 1e9 * factor;
    CHECK(std::abs(busbw - expected) <= 0.006 + 0.01 * expected);
    CHECK(pred > 0);
    ++rows;
  }
  CHECK(rows == 3 * 5);  // 1K, 4K, 16K, 64K, 256K for each collective
  // The file is nccl-tests' format: calibrate reads 15 collective observations of 2 ranks from it.
  REQUIRE(std::filesystem::exists(file));
  const Run cal = run("calibrate --cluster 8xH200-141GB-NVSwitch --nccl-tests " + file + " --json");
  INFO(cal.out);
  REQUIRE(cal.status == 0);
  const auto j = nlohmann::json::parse(cal.out.substr(cal.out.find('{')));
  REQUIRE(j["observations"].size() == 15);
  for (const auto& o : j["observations"]) {
    CHECK(o["label"].get<std::string>().find(" 2 ranks ") != std::string::npos);
    CHECK(o["measured_s"].get<double>() > 0);
  }
  // Three ranks (blocks of uneven shapes, every collective the communicators run).
  const auto r3 = zp::test::run_shell(mpi + "3 " + std::string(ZEROPLAN_BIN) +
                                      " collectives --measure --min 1K --max 16K --factor 4 --warmup 1 --iters 2 --device cpu "
                                      "--cluster 8xH200-141GB-NVSwitch");
  INFO(r3.out);
  REQUIRE(r3.status == 0);
  CHECK(r3.out.find("3 ranks on 1 node") != std::string::npos);
  for (const char* k : {"all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast"})
    CHECK(r3.out.find(fmt::format("# Collective: {}\n", k)) != std::string::npos);
  CHECK(r3.out.find("all_to_all") == std::string::npos);
  // --json: every size with its measured and predicted time.
  const auto rj = zp::test::run_shell(mpi + "2 " + std::string(ZEROPLAN_BIN) + args + " --json", false);
  REQUIRE(rj.status == 0);
  const auto m = nlohmann::json::parse(rj.out);
  CHECK(m["measured"] == true);
  CHECK(m["ranks"] == 2);
  CHECK(m["backend"] == "mpi");
  REQUIRE(m["collectives"].size() == 3);
  for (const auto& b : m["collectives"]) {
    CHECK(b["rows"].size() == 5);
    for (const auto& row : b["rows"]) CHECK(row["time_us"].get<double>() > 0);
  }
  // Bad input: exit 2, and one line from zeroplan (rank 0's; mpirun adds its own report); a
  // refusal of some ranks only (the output, which rank 0 writes): one line per rank, the others
  // saying which rank refused (exec::stop_if_refused, as train does).
  const auto bad_mpi = [&](const std::string& extra, const std::string& must, int expect_lines = 1) {
    const auto b = zp::test::run_shell(mpi + "2 " + std::string(ZEROPLAN_BIN) + base + " " + extra);
    INFO(extra, "\n", b.out);
    CHECK(b.status == 2);
    CHECK(b.out.find(must) != std::string::npos);
    int ours = 0;
    for (std::size_t at = b.out.find("zeroplan: "); at != std::string::npos; at = b.out.find("zeroplan: ", at + 1)) ++ours;
    CHECK(ours == expect_lines);
  };
  const std::string ok = " --cluster 8xH200-141GB-NVSwitch --device cpu";
  bad_mpi("--device tpu --cluster 8xH200-141GB-NVSwitch", "--device: must be auto, cpu or cuda");
  bad_mpi(ok + " --iters 0", "--iters");
  bad_mpi(ok + " --ops all_to_all", "--ops");
  bad_mpi(ok + " --ranks 3", "--ranks");
  bad_mpi(ok + " --out /no/such/dir/sweep.txt", "/no/such/dir/sweep.txt", 2);
  bad_mpi(ok + " --out /no/such/dir/sweep.txt", "rank 1: stopped: rank 0 refused its input", 2);
  bad_mpi("--device cpu --cluster 1xH200-141GB", "--cluster");
  bad("collectives --measure --device cpu --cluster 8xH200-141GB-NVSwitch", "mpirun -np N");
  bad("collectives --cluster 8xH200-141GB-NVSwitch --iters 3", "--iters: needs --measure");
  bad("collectives --cluster 8xH200-141GB-NVSwitch --out x.txt", "--out: needs --measure");
}

TEST_CASE("the command line: what zeroplan is, unknown subcommands, hub ids, attention names") {
  const Run help = run("--help");
  CHECK(help.status == 0);
  CHECK(help.out.find("predicts the memory and time of DeepSpeed ZeRO training") != std::string::npos);
  CHECK(help.out.find("plans the best one, trains it for real on CPU ranks") != std::string::npos);
  // An unknown subcommand is named, with the closest one, whatever follows it; the list of
  // subcommands comes from the parser, so a new one is known without touching this.
  bad("nosuch", "zeroplan: unknown subcommand 'nosuch'; the closest subcommand is");
  bad("nosuch --help", "unknown subcommand 'nosuch'");
  bad("simulat --model gpt2", "unknown subcommand 'simulat'; did you mean 'simulate'?");
  bad("modles", "did you mean 'models'?");
  {
    const Run r = run("nosuch");
    for (const char* s : {"simulate", "explain", "plan", "train", "compare", "models"})
      CHECK(r.out.find(s) != std::string::npos);
  }
  // A subcommand that exists answers its own help.
  CHECK(run("plan --help").status == 0);
  CHECK(run("simulate --help").out.find("flash_attention_2") != std::string::npos);
  CHECK(run("simulate --help").out.find("else sdpa") != std::string::npos);
  // Hub ids resolve offline; the catalogue lists them.
  const Run hub = run("simulate --model meta-llama/Meta-Llama-3-8B --gpus 8 --gpu H100-80GB --seq-len 4096 --json");
  CAPTURE(hub.out);
  REQUIRE(hub.status == 0);
  CHECK(nlohmann::json::parse(hub.out)["model"] == "Meta-Llama-3-8B");
  CHECK(nlohmann::json::parse(hub.out)["attention"] == "sdpa");
  const Run models = run("models");
  CHECK(models.out.find("Qwen2.5-72B        qwen2     72,706,203,648 params") != std::string::npos);
  CHECK(models.out.find("meta-llama/Llama-3.1-8B, meta-llama/Meta-Llama-3.1-8B") != std::string::npos);
  bad("simulate --model meta-llama/Llama-9-1B --gpus 1", "--model: unknown model 'meta-llama/Llama-9-1B'");
  bad("simulate --model gpt2 --gpus 1 --attention flash_attention", "did you mean 'flash_attention_2'?");
  // flash_attention_2 needs 16-bit activations; DeepSpeed's defaults train in fp32.
  bad("simulate --model gpt2 --gpus 1 --attention flash_attention_2", "flash_attention_2 runs in fp16 or bf16 only");
  // A config.json's attn_implementation is honoured; --attention wins and says so.
  const std::string cfg = tmp_file("eager_gpt2_config.json",
                                   R"({"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4,
                                       "n_positions": 64, "attn_implementation": "eager"})");
  const Run own = run("simulate --model " + cfg + " --gpus 1 --json");
  REQUIRE(own.status == 0);
  CHECK(nlohmann::json::parse(own.out)["attention"] == "eager");
  const Run over = run("simulate --model " + cfg + " --gpus 1 --attention sdpa");
  REQUIRE(over.status == 0);
  CHECK(over.out.find("warning: --attention sdpa overrides attn_implementation \"eager\" of " + cfg) != std::string::npos);
  CHECK(over.out.find(", sdpa attention") != std::string::npos);
  // train refuses what the CPU executor would compute differently (Llama 3.1's rope scaling).
  bad("train --model meta-llama/Llama-3.1-8B --steps 1", "rope_scaling: rope_type \"llama3\" rescales the rotary frequencies");
}
