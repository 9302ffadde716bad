// `zeroplan calibrate` end to end, and --profile on simulate and plan: the slow-fabric fixtures
// (a cluster unlike the presets) give a profile that reproduces them and changes plan's choice;
// the recorded H200 runs calibrate; every bad input is one line and exit status 2.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

struct Run {
  int status = -1;
  std::string out;   // stdout
  std::string err;   // stderr
};

Run run(const std::string& args) {
  const auto dir = zp::test::temp_path("zeroplan-test-calibration-cli");
  std::filesystem::create_directories(dir);
  const std::string err = (dir / "stderr.txt").string();
  const std::string cmd = std::string(ZEROPLAN_BIN) + " " + args + " 2>" + err;
  Run r;
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), f)) r.out += buf.data();
  const int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err);
  r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  return r;
}

std::string tmp(const std::string& name) {
  const auto dir = zp::test::temp_path("zeroplan-test-calibration-cli");
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

const std::string kFix = std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/calibration/";
const std::string kRuns = std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/deepspeed/h200_deepspeed_0.19.8.json";

std::string fixture_sources() {
  return "--cluster 8xA100-80GB-NVSwitch --nodes 16 --nccl-tests " + kFix + "fixture_slow_fabric_all_reduce.txt --nccl-tests " +
         kFix + "fixture_slow_fabric_all_gather.txt --nccl-tests " + kFix +
         "fixture_slow_fabric_reduce_scatter.txt --nccl-tests " + kFix + "fixture_slow_fabric_all_reduce_1node.txt " +
         "--deepspeed-log " + kFix + "fixture_slow_fabric_deepspeed.log --model gpt2-medium --ds-config " + kFix +
         "fixture_slow_fabric_ds_config.json --seq-len 1024";
}

// One line on stderr, exit 2, naming what is wrong.
void bad(const std::string& args, const std::string& must_contain) {
  CAPTURE(args);
  const Run r = run(args);
  CAPTURE(r.err);
  CHECK(r.status == 2);
  CHECK(r.err.find(must_contain) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

// The profile of the fixtures, made once.
const std::string& fixture_profile() {
  static const std::string path = [] {
    const std::string p = tmp("slow_fabric_profile.json");
    const Run r = run("calibrate " + fixture_sources() + " --out " + p);
    REQUIRE(r.status == 0);
    return p;
  }();
  return path;
}

}  // namespace

TEST_CASE("calibrate: the slow-fabric fixtures give a profile that reproduces them") {
  const Run r = run("calibrate " + fixture_sources() + " --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  // The Ethernet link between nodes: a small fraction of the 8 x 200 Gb/s the preset assumes.
  double inter = 0;
  for (const auto& p : j["parameters"])
    if (p["name"] == "collective.inter.bandwidth") inter = p["after"].get<double>();
  CHECK(inter > 0.03);
  CHECK(inter < 0.12);
  // Every collective of 64 MiB and more within 10%, the MAPE of each source down.
  int large = 0;
  for (const auto& o : j["observations"]) {
    const double m = o["measured_s"].get<double>(), a = o["after_s"].get<double>();
    if (o["kind"] == "collective" && o["label"].get<std::string>().find("128 ranks") != std::string::npos && m > 5e-3) {
      ++large;
      CHECK(std::abs(a / m - 1) < 0.12);
    }
    // The DeepSpeed log's phases, fitted and held out, within 3%.
    if (o["kind"] == "phase wall") CHECK(std::abs(a / m - 1) < 0.03);
  }
  CHECK(large >= 12);
  for (const auto& s : j["sources"]) {
    CAPTURE(s.dump());
    CHECK(s["mape_fitted_after"].get<double>() < s["mape_fitted_before"].get<double>() / 3);
  }
  CHECK(j["uncertainty"]["iteration_rel_sd"].get<double>() >= 0.02);
}

TEST_CASE("simulate --profile: the fitted coefficients and their interval") {
  const std::string base = "simulate --model gpt2-medium --ds-config " + kFix +
                           "fixture_slow_fabric_ds_config.json --cluster 8xA100-80GB-NVSwitch --nodes 16 --seq-len 1024";
  const Run plain = run(base + " --json");
  const Run cal = run(base + " --json --profile " + fixture_profile());
  REQUIRE(plain.status == 0);
  REQUIRE(cal.status == 0);
  const auto a = nlohmann::json::parse(plain.out)["results"][0]["time"];
  const auto pj = nlohmann::json::parse(cal.out);
  const auto b = pj["results"][0]["time"];
  // The slow fabric: the exposed gradient reduction grows ten-fold.
  CHECK(b["backward_allreduce_ms"].get<double>() > 5 * a["backward_allreduce_ms"].get<double>());
  const double it = b["iteration_ms"].get<double>(), s = pj["profile"]["iteration_rel_sd"].get<double>();
  CHECK(b["iteration_interval_ms"][0].get<double>() == zp::test::approx(it * (1 - s)));
  CHECK(b["iteration_interval_ms"][1].get<double>() == zp::test::approx(it * (1 + s)));
  // The table says it too.
  const Run t = run(base + " --profile " + fixture_profile());
  CHECK(t.out.find("with profile " + fixture_profile() + ": iteration times carry ±") != std::string::npos);
  // The A100 preset was never measured against a framework: no interval, no uncertainty.
  CHECK_FALSE(nlohmann::json::parse(plain.out).contains("uncertainty"));
  CHECK_FALSE(a.contains("iteration_interval_ms"));
}

// The H200 preset was measured against DeepSpeed (tests/data/deepspeed/): its predictions carry
// that error without a profile, and a profile's own replaces it.
TEST_CASE("simulate and plan on the H200 preset: the interval measured against DeepSpeed") {
  const std::string base = "simulate --model gpt2 --gpus 1 --gpu H200-141GB --micro-batch 8 --seq-len 1024";
  const Run j = run(base + " --json");
  REQUIRE(j.status == 0);
  const auto doc = nlohmann::json::parse(j.out);
  const double s = doc["uncertainty"]["iteration_rel_sd"].get<double>();
  CHECK(s == zp::test::approx(0.09));
  CHECK(doc["uncertainty"]["source"] == "the H200-141GB preset");
  CHECK(doc["uncertainty"]["basis"].get<std::string>().find("DeepSpeed 0.19.8") != std::string::npos);
  CHECK_FALSE(doc.contains("profile"));
  const auto t = doc["results"][0]["time"];
  CHECK(t["iteration_interval_ms"][0].get<double>() == zp::test::approx(t["iteration_ms"].get<double>() * (1 - s)));
  const Run table = run(base);
  CHECK(table.out.find("with the H200-141GB preset: iteration times carry ±9.0%") != std::string::npos);
  // plan: candidates within the interval of the winner are ties.
  const Run p = run("plan --model gpt2 --gpus 8 --gpu H200-141GB --global-batch 256 --seq-len 1024 --json");
  REQUIRE(p.status == 0);
  const auto pd = nlohmann::json::parse(p.out);
  CHECK(pd["uncertainty"]["source"] == "the H200-141GB preset");
  REQUIRE(pd.contains("ties_with_winner"));
  // Each rank of `ranked` is a tie exactly when it fits and its interval reaches the winner's.
  const auto& ranked = pd["ranked"];
  const double w = ranked[0]["time"]["iteration_ms"].get<double>();
  std::vector<int> expect;
  for (std::size_t i = 1; i < ranked.size(); ++i)
    if (ranked[i]["fits"].get<bool>() && ranked[i]["time"]["iteration_ms"].get<double>() * (1 - 0.09) <= w * (1 + 0.09))
      expect.push_back(static_cast<int>(i) + 1);
  CHECK(pd["ties_with_winner"].get<std::vector<int>>() == expect);
  CHECK_FALSE(expect.empty());  // GPT-2's candidates on 8 H200s lie within 9% of each other
  const Run pt = run("plan --model gpt2 --gpus 8 --gpu H200-141GB --global-batch 256 --seq-len 1024");
  CHECK(pt.out.find("with the H200-141GB preset: iteration times carry ±9.0%") != std::string::npos);
  // Planned on another GPU: a warning says what differs, and the run goes on.
  const Run other = run("simulate --model gpt2-medium --gpus 8 --gpu H200-141GB --seq-len 1024 --profile " + fixture_profile());
  CHECK(other.status == 0);
  CHECK(other.err.find("measured on A100-80GB GPUs, planned on H200-141GB") != std::string::npos);
}

TEST_CASE("calibrate --activation-checkpointing: the graph is built for the checkpointing it is lowered with") {
  // The op graph and the lowering must agree on checkpointing (no KV cache under it); the
  // runs calibrate lowers take both from one place (sim::graph_options).
  const Run r = run("calibrate " + fixture_sources() + " --activation-checkpointing --json");
  CAPTURE(r.err);
  CHECK(r.status == 0);
  CHECK(r.err.find("internal error") == std::string::npos);
}

TEST_CASE("plan --profile: the slow fabric changes the choice and its exposed communication, and ties are said") {
  const std::string base = "plan --model gpt2-large --cluster 8xA100-80GB-NVSwitch --nodes 16 --global-batch 16384 "
                           "--seq-len 512 --ds-config " + kFix + "fixture_slow_fabric_ds_config.json --json";
  const Run plain = run(base + " --out " + tmp("plain_ds_config.json"));
  const Run cal = run(base + " --profile " + fixture_profile() + " --out " + tmp("slow_ds_config.json"));
  REQUIRE(plain.status == 0);
  REQUIRE(cal.status == 0);
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(cal.out);
  std::ifstream fa(tmp("plain_ds_config.json")), fb(tmp("slow_ds_config.json"));
  const auto da = nlohmann::json::parse(fa), db = nlohmann::json::parse(fb);
  CHECK(da != db);  // another configuration is written
  // The fabric's time shows: the winner's exposed communication grows several times (both
  // plans pick stage 3 here; the calibrated one another reduce bucket).
  CHECK(b["best"]["time"]["backward_allreduce_ms"].get<double>() > 3 * a["best"]["time"]["backward_allreduce_ms"].get<double>());
  CHECK(b["best"]["time"]["samples_per_s"].get<double>() < a["best"]["time"]["samples_per_s"].get<double>());
  // Candidates within the profile's interval of the winner are ties.
  CHECK(b.contains("ties_with_winner"));
  CHECK(b["profile"]["iteration_rel_sd"].get<double>() > 0);
  CHECK_FALSE(a.contains("ties_with_winner"));
}

TEST_CASE("calibrate: the recorded H200 runs, fitted on stage 0 and 1 of GPT-2, held out elsewhere") {
  const std::string out = tmp("h200_profile.json");
  const Run r = run("calibrate --deepspeed-runs " + kRuns + " --fit-where 'model=gpt2,stage=0|1' --json --out " + out);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  int phases = 0;
  for (const auto& p : j["held_out_phases"]) {
    ++phases;
    // 41 runs, 8 of them GPT-2 at stage 0 or 1; 3 held-out runs have no GPU busy times
    CHECK(p["runs"].get<int>() == (p["quantity"] == "gpu_busy" ? 30 : 33));
    CHECK(p.contains("mape_before"));
  }
  CHECK(phases == 7);  // forward, backward, step, iteration (wall) and forward, backward, step (GPU busy)
  // The fitted phases as a whole (wall and GPU-busy weigh together in the fit, and with these
  // few runs it may trade one for the other: docs/calibration.md).
  double before = 0, after = 0, n = 0;
  for (const auto& s : j["sources"])
    if (const int k = s["fitted"].get<int>(); k > 0) {
      before += k * s["mape_fitted_before"].get<double>();
      after += k * s["mape_fitted_after"].get<double>();
      n += k;
    }
  REQUIRE(n > 0);
  CHECK(after < before);
  CHECK(j["uncertainty"]["basis"].get<std::string>().find("33 held-out runs") != std::string::npos);
  // The profile reads back and plans with it.
  const Run s = run("simulate --model gpt2 --gpus 1 --gpu H200-141GB --micro-batch 8 --seq-len 1024 --profile " + out);
  CHECK(s.status == 0);
}

TEST_CASE("calibrate: a second machine (the recorded H100 runs): one host factor fitted on two models, the others held out") {
  const std::string runs = std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/deepspeed/h100_deepspeed_0.19.8.json";
  const Run r = run("calibrate --deepspeed-runs " + runs +
                    " --cluster 1xH100-80GB --fit host.scale --fit-where 'model=gpt2|bert-large-uncased' --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["cluster"]["name"] == "1xH100-80GB");
  // The H200 machines' host costs (the defaults) overpredict this machine's DeepSpeed by half or
  // more; one factor on all of them, fitted on GPT-2 and BERT-large, predicts Llama, GPT-2 medium
  // and BERT-base (14 runs) within the issue's 10% per phase on average (docs/calibration.md:
  // 50.7 / 51.4 / 77.2 / 62.8% before, 4.9 / 7.6 / 8.8 / 5.5% after).
  int wall = 0;
  for (const auto& p : j["held_out_phases"]) {
    if (p["quantity"] != "wall") continue;
    ++wall;
    CAPTURE(p["phase"].get<std::string>());
    CHECK(p["runs"].get<int>() == 14);
    CHECK(p["mape_before"].get<double>() > 40);
    CHECK(p["mape_after"].get<double>() < 10);
  }
  CHECK(wall == 4);
  REQUIRE(j["parameters"].size() == 1);
  CHECK(j["parameters"][0]["name"] == "host.scale");
  CHECK(j["parameters"][0]["after"].get<double>() > 0.4);  // about half the H200 machines' host time
  CHECK(j["parameters"][0]["after"].get<double>() < 0.6);
  // Every run recorded the host probe: each is predicted at its own, the costs at their median.
  bool probe_note = false;
  for (const auto& w : j["notes"]) probe_note |= w.get<std::string>().find("recorded the host probe") != std::string::npos;
  CHECK(probe_note);
  // The GPU's busy time of the fitted runs is the compute model's alone, on the H100 preset: the
  // fp32 Llama run trains in its config's bf16 (predicted in fp32 it was 5-7 times too long).
  int gpu = 0;
  for (const auto& s : j["sources"])
    if (s["observations"] == "phase gpu_busy") {
      ++gpu;
      // Profiled: eight GPT-2 and BERT-large runs, six of the Llama, GPT-2 medium and BERT-base
      // (three phases each; their stage-3 runs since 2026-12-07); the Llama's fp32 run among
      // them: 21% now, hundreds of % in fp32.
      CHECK(s["fitted"].get<int>() == 24);
      CHECK(s["mape_fitted_before"].get<double>() < 12);
      CHECK(s["held_out"].get<int>() == 18);
      CHECK(s["mape_held_out_before"].get<double>() < 30);
    }
  CHECK(gpu == 1);
  // The written profile carries the probe its host costs are at only where they were fitted on
  // runs with one.
  auto probe_of = [&](const std::string& args, const std::string& out) {
    const Run c = run("calibrate " + args + " --out " + out);
    REQUIRE(c.status == 0);
    std::ifstream in(out);
    return nlohmann::json::parse(in)["device_profile"]["host"]["probe_us"].get<double>();
  };
  const std::string fitted = tmp("h100_scale.json");
  const double p = probe_of("--deepspeed-runs " + runs + " --cluster 1xH100-80GB --fit host.scale", fitted);
  CHECK(p > 4.8);
  CHECK(p < 6.0);
  CHECK(probe_of("--deepspeed-runs " + runs + " --cluster 1xH100-80GB --fit compute.elementwise_efficiency",
                 tmp("h100_compute.json")) == 0);  // the host costs were not fitted: the defaults', at no probe
  CHECK(probe_of("--deepspeed-runs " + kRuns + " --profile " + fitted + " --fit host.scale", tmp("h200_from_h100.json")) ==
        0);  // fitted again on runs without a probe: at none
  // host.scale is asked for by name: not in "all", and not with the costs it multiplies.
  bad("calibrate --deepspeed-runs " + runs + " --cluster 1xH100-80GB --fit host.scale,host.forward_op_us",
      "host.scale and host.forward_op_us change the same coefficient");
}

// A ds_config with neither fp16 nor bf16 and a model whose config.json says bfloat16: DeepSpeed
// trains it in bf16, and simulate says so.
TEST_CASE("simulate: a bf16 model under an fp32 ds_config is said to train in bf16") {
  const std::string cfg = tmp("fp32_s2.json");
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}})";
  const Run r = run("simulate --model " + std::string(ZEROPLAN_SHARED_DIR) +
                    "/tests/data/deepspeed/llama-300m.json --cluster 1xH200-141GB --seq-len 1024 --ds-config " + cfg);
  REQUIRE(r.status == 0);
  CHECK(r.err.find("does not cast the model, so it trains in bf16") != std::string::npos);  // a warning, on stderr
}

TEST_CASE("calibrate: a train --out file of the CPU executor") {
  const std::string m = tmp("train_tiny.json");
  const Run t = run("train --model tiny-gpt2 --steps 3 --seq-len 32 --micro-batch 2 --quiet --out " + m);
  REQUIRE(t.status == 0);
  const Run r = run("calibrate --train-out " + m + " --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  // Every timed compute event is an observation priced by its op (times vary from run to run:
  // only what does not is checked).
  int gemm = 0, memory = 0;
  for (const auto& o : j["observations"]) {
    gemm += o["kind"] == "gemm" ? 1 : 0;
    memory += o["kind"] == "memory" ? 1 : 0;
  }
  CHECK(gemm == 18);  // 2 layers x (c_attn, c_proj, c_fc, mlp.c_proj) x fwd/bwd + lm_head fwd/bwd
  CHECK(memory > 40);
  // The CPU's tiny GEMMs run far below the CPU profile's efficiency (0.6): fitted lower, or refused.
  bool seen = false;
  for (const auto& p : j["parameters"])
    if (p["name"] == "compute.gemm_max_efficiency") {
      seen = true;
      CHECK(p["after"].get<double>() < 0.3);
    }
  for (const auto& p : j["refused"]) seen |= p["name"] == "compute.gemm_max_efficiency";
  CHECK(seen);
  // Another model's program does not line up with the measured events.
  bad("calibrate --train-out " + m + " --model tiny-llama", "the program lowered from its configuration has");
}

// The executor's runs as calibration's held-out check: each train --out file is a run whose
// events are fitted or held out together, and whose phases (the sums of its device events, as
// the executor times them one after another) are reported per run and, over the held-out runs,
// as a MAPE per phase. The phase the simulator predicts for a run must be the sum of what it
// predicts for the run's events one by one: the same program, priced two ways.
TEST_CASE("calibrate: train --out runs held out per phase, their phases the sums of their events") {
  const std::string s0 = tmp("heldout_s0.json"), s2 = tmp("heldout_s2.json");
  std::ofstream(s0) << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}})";
  std::ofstream(s2) << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}})";
  const std::string a = tmp("heldout-gpt2-s0.json"), b = tmp("heldout-gpt2-s2.json"), c = tmp("heldout-llama-s0.json");
  const std::string d = tmp("heldout-gpt2fg-s0.json");  // --fused-gelu --fused-loss: the run's graph is the fused variant
  for (const auto& [model, cfg, out, flags] : {std::tuple{"tiny-gpt2", s0, a, ""}, {"tiny-gpt2", s2, b, ""},
                                               {"tiny-llama", s0, c, ""}, {"tiny-gpt2", s0, d, " --fused-gelu --fused-loss"}}) {
    const Run t = run(std::string("train --model ") + model + " --ds-config " + cfg +
                      " --steps 3 --seq-len 32 --quiet" + flags + " --out " + out);
    REQUIRE(t.status == 0);
  }
  // The ds_config file changes after the runs: each file's recorded config is what it ran.
  std::ofstream(s2) << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0}})";
  const Run r = run("calibrate --train-out " + a + " --train-out " + b + " --train-out " + c + " --train-out " + d +
                    " --fit-where 'run=heldout-gpt2-s0' --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> phases;
  for (const auto& p : j["held_out_phases"]) {
    CHECK(p["quantity"] == "events");
    CHECK(p["runs"].get<int>() == 3);  // the stage-2 run, the other model and the fused variant
    CHECK(p["mape_after"].is_number());
    phases.insert(p["phase"].get<std::string>());
  }
  CHECK(phases == std::set<std::string>{"forward", "backward", "step", "iteration"});
  // Per run and phase: the phase observation against the sum of the run's event observations.
  std::map<std::pair<std::string, std::string>, std::array<double, 4>> sums;  // measured, before, after, phase's before
  std::map<std::pair<std::string, std::string>, std::array<double, 3>> phase;  // measured, before, after
  int fitted_events = 0, held_events = 0;
  for (const auto& o : j["observations"]) {
    const auto& t = o["tags"];
    if (t.value("source", "") != "train") continue;
    const auto key = std::make_pair(t["run"].get<std::string>(), t["phase"].get<std::string>());
    if (o["kind"] == "phase events") {
      CHECK_FALSE(o["fit"].get<bool>());  // reported: its events are what is fitted
      phase[key] = {o["measured_s"].get<double>(), o["before_s"].get<double>(), o["after_s"].get<double>()};
      continue;
    }
    (o["fit"].get<bool>() ? fitted_events : held_events) += 1;
    CHECK(o["fit"].get<bool>() == (key.first == "heldout-gpt2-s0"));
    auto& s = sums[key];
    s[0] += o["measured_s"].get<double>();
    s[1] += o["before_s"].get<double>();
    s[2] += o["after_s"].get<double>();
  }
  CHECK(fitted_events > 40);
  CHECK(held_events > 80);
  CHECK(phase.size() == 16);  // 4 runs x (forward, backward, step, iteration)
  for (const auto& [key, p] : phase) {
    if (key.second == "iteration") continue;
    CAPTURE(key.first);
    CAPTURE(key.second);
    const auto& s = sums[key];
    // Measured: the phase holds its observed events and the few left out as observations (a
    // group of one moves nothing), which take microseconds: 1.1% of a 2 ms phase on a loaded
    // 2-core host, so the bound is loose above and exact below.
    CHECK(p[0] >= s[0] * (1 - 1e-6));
    CHECK(p[0] <= s[0] * 1.05);
    // The report's microseconds carry six significant digits.
    CHECK(p[1] == zp::test::approx(s[1]).epsilon(1e-5));
    CHECK(p[2] == zp::test::approx(s[2]).epsilon(1e-5));
  }
  for (const std::string run_name : {"heldout-gpt2-s0", "heldout-gpt2-s2", "heldout-llama-s0", "heldout-gpt2fg-s0"}) {
    const auto it = phase[{run_name, "iteration"}];
    const double sum = phase[{run_name, "forward"}][1] + phase[{run_name, "backward"}][1] + phase[{run_name, "step"}][1];
    CHECK(it[1] == zp::test::approx(sum).epsilon(1e-9));
  }
}

// calibrate on the CUDA executor's files of one GPU (tests/data/calibration/<gpu_dir>): the
// micro-benchmarks of `models` and the 14 runs, fitted on the micro-benchmarks and GPT-2's
// stage 0 and 1 runs, as JSON.
static Run calibrate_executor_runs(const std::vector<std::string>& models,
                                   const std::string& gpu_dir = "h100_executor") {
  const std::string dir = std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/calibration/" + gpu_dir + "/";
  std::string args = "calibrate";
  for (const auto& m : models) args += " --observations " + dir + "device_observations_" + m + ".json";
  for (const char* r : {"gpt2-s0", "gpt2-s1", "gpt2-s2", "gpt2-s3", "gpt2-s1-mb4", "gpt2-s2-gas2", "gpt2-s2-nooverlap",
                        "gpt2-s1-fp16", "gpt2-s1-eager", "gpt2m-s1", "bertl-s0", "bertl-s2", "llama-s1", "llama-s3"})
    args += " --train-out " + dir + r + ".json";
  return run(args + " --fit-where 'source=device;source=train,run=gpt2-s0|gpt2-s1' --json");
}

// The held-out protocol on one GPU's executor files: the fit's cluster is the GPU the files
// name, and the held-out MAPE per phase (phase → (before, after), percent) over the 12 runs
// not fitted.
static std::map<std::string, std::pair<double, double>> executor_held_out(const std::vector<std::string>& models,
                                                                          const std::string& gpu_dir,
                                                                          const std::string& cluster) {
  const Run r = calibrate_executor_runs(models, gpu_dir);
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["cluster"]["name"] == cluster);  // from the files: the GPU they name
  CHECK(j["uncertainty"]["basis"].get<std::string>().find("12 held-out runs") != std::string::npos);
  std::map<std::string, std::pair<double, double>> mape;
  for (const auto& p : j["held_out_phases"]) {
    CHECK(p["quantity"] == "events");
    CHECK(p["runs"].get<int>() == 12);
    mape[p["phase"].get<std::string>()] = {p["mape_before"].get<double>(), p["mape_after"].get<double>()};
  }
  REQUIRE(mape.size() == 4);
  return mape;
}

// The issue's held-out check on zeroplan's own CUDA executor, on runs this executor recorded on
// an H100 (tests/data/calibration/h100_executor, scripts/gpu_calibrate_heldout.sh; a recording of
// 2026-12-07, not in the repository, had every step within 1.7% of these): fitted on GPT-2's micro-benchmarks and its stage 0 and 1
// runs; held out: stages 2 and 3, another micro-batch, GAS 2, overlap off, fp16, eager
// attention, GPT-2 medium, BERT-large and a Llama. Held-out MAPE after the fit (forward /
// backward / step / iteration): 3.2 / 3.9 / 3.3 / 3.3% on the development VM; the H100 preset,
// uncalibrated, 6.0 / 8.6 / 2.8 / 7.1% since it prices the executor's own attention, norm, Adam
// and staged products (docs/compute_model.md; 15.5 / 16.9 / 44.9 / 16.7% before, and the fit
// 2.7 / 3.8 / 3.4 / 3.1%). The bounds are what the fit and the preset reach, so that neither
// gets worse unnoticed. (The H200's recordings, tests/data/calibration/h200_executor, predate
// the executor's staged LM head and one-kernel norm, 6.7 / 10.5 ms for GPT-2's head where
// these take 1.86 / 3.04, and are no longer a record of this executor's time.)
TEST_CASE("calibrate: the CUDA executor's runs on an H100, fitted on GPT-2 at stages 0 and 1, held out elsewhere") {
  auto mape = executor_held_out({"gpt2"}, "h100_executor", "1xH100-80GB");
  for (const auto& [phase, m] : mape) {
    CAPTURE(phase);
    CHECK(m.first < 10);  // the preset, uncalibrated
    CHECK(m.second < 5);  // the issue's target on every phase
  }
  CHECK(mape["forward"].second < 3.6);
  CHECK(mape["backward"].second < 4.4);
  CHECK(mape["iteration"].second < 3.7);
  CHECK(mape["forward"].second < 0.6 * mape["forward"].first);
  CHECK(mape["iteration"].second < 0.6 * mape["iteration"].first);
}

// Observations saved on one machine (a GPU machine's --device cuda run) fit the same anywhere.
TEST_CASE("calibrate --save-observations / --observations: the same fit from the saved file") {
  const std::string saved = tmp("saved_observations.json");
  const std::string tables = "--cluster 8xA100-80GB-NVSwitch --nodes 16 --nccl-tests " + kFix +
                             "fixture_slow_fabric_all_reduce.txt --nccl-tests " + kFix + "fixture_slow_fabric_all_gather.txt";
  const Run a = run("calibrate " + tables + " --json --save-observations " + saved);
  REQUIRE(a.status == 0);
  const Run b = run("calibrate --cluster 8xA100-80GB-NVSwitch --nodes 16 --observations " + saved + " --json");
  REQUIRE(b.status == 0);
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  REQUIRE(ja["observations"].size() == jb["observations"].size());
  for (std::size_t i = 0; i < ja["observations"].size(); ++i) {
    CHECK(ja["observations"][i]["measured_s"] == jb["observations"][i]["measured_s"]);
    CHECK(ja["observations"][i]["after_s"].get<double>() == zp::test::approx(jb["observations"][i]["after_s"].get<double>()));
  }
  REQUIRE(ja["parameters"].size() == jb["parameters"].size());
  for (std::size_t i = 0; i < ja["parameters"].size(); ++i) {
    CHECK(ja["parameters"][i]["name"] == jb["parameters"][i]["name"]);
    CHECK(ja["parameters"][i]["after"].get<double>() == zp::test::approx(jb["parameters"][i]["after"].get<double>()));
  }
  // A kernel observation survives the round trip too (its class, shape and dtype).
  const std::string k = tmp("saved_kernel.json");
  std::ofstream(k) << R"({"format": "zeroplan-observations", "version": 1, "observations": [
    {"kind": "kernel", "class": "gemm", "name": "gemm 4096x4096x4096 bf16", "gemms": [[4096, 4096, 4096, 1]],
     "flops": 1.37438953472e11, "bytes": 100663296, "dtype": "bf16", "seconds": 2.1e-4, "tags": {"source": "device"}},
    {"kind": "kernel", "class": "memory", "name": "add 1e8 bf16", "flops": 1e8, "bytes": 600000000, "dtype": "bf16",
     "seconds": 1.9e-4, "tags": {"source": "device"}}]})";
  const Run c = run("calibrate --gpus 1 --gpu H200-141GB --observations " + k + " --json");
  CHECK(c.status == 0);
  // A converting copy and an optimizer step that takes the norm first keep what prices them.
  auto before_s = [&](const std::string& extra) {
    std::ofstream(k) << R"({"format": "zeroplan-observations", "version": 1, "observations": [
      {"kind": "kernel", "class": "copy_d2d", "name": "copy", "bytes": 600000000, "dtype": "bf16", "seconds": 2e-4)"
                     << extra << R"(, "tags": {"source": "device"}}]})";
    const Run r = run("calibrate --gpus 1 --gpu H200-141GB --observations " + k + " --json");
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.out)["observations"][0]["before_s"].get<double>();
  };
  const double memcpy_s = before_s("");
  CHECK(before_s(R"(, "copy_kernel": "memcpy")") == zp::test::approx(memcpy_s));
  CHECK(before_s(R"(, "copy_kernel": "cast")") > 1.2 * memcpy_s);  // the H200 preset: 62% of HBM, not 85%
  // (host_bound and optimizer: read back in test_calibration_sources; their pricing in
  // test_compute_model. The presets price both as plain copies and memory kernels.)
  // A GEMM's fifth entry: its layer's bias, whose gradient is one more pass in backward.
  auto gemm_before_s = [&](const std::string& shape) {
    std::ofstream(k) << R"({"format": "zeroplan-observations", "version": 1, "observations": [
      {"kind": "kernel", "class": "gemm", "name": "g", "gemms": [)" << shape
                     << R"(], "flops": 7.73e10, "bytes": 2e8, "dtype": "bf16", "backward": true, "seconds": 2e-4,
       "tags": {"source": "device"}}]})";
    const Run r = run("calibrate --gpus 1 --gpu H200-141GB --observations " + k + " --json");
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.out)["observations"][0]["before_s"].get<double>();
  };
  const double no_bias = gemm_before_s("[8192, 3072, 768, 1]");
  CHECK(gemm_before_s("[8192, 3072, 768, 1, 0]") == zp::test::approx(no_bias));
  // 8192 x 3072 bf16 read at 62% of 4.8 TB/s: about 17 us more.
  CHECK(gemm_before_s("[8192, 3072, 768, 1, 1]") - no_bias == zp::test::approx(8192.0 * 3072 * 2 / (4.8e12 * 0.62)).epsilon(0.05));
  // Bad files: one line naming the file and the key.
  const std::string bad_file = tmp("bad_observations.json");
  auto refused = [&](const std::string& text, const std::string& must) {
    std::ofstream(bad_file) << text;
    bad("calibrate --gpus 1 --gpu H200-141GB --observations " + bad_file, must);
  };
  refused(R"({"runs": []})", "not a saved observations file");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel", "class": "copy_d2d",
           "dtype": "bf16", "bytes": 64, "seconds": 1e-5, "copy_kernel": "memcopy"}]})",
          "observations[0].copy_kernel");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel", "class": "copy_d2d",
           "dtype": "bf16", "bytes": 64, "seconds": 1e-5, "host_bound": "yes"}]})",
          "observations[0].host_bound");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel", "class": "memory",
           "dtype": "bf16", "bytes": 64, "seconds": 1e-5, "optimizer": 1}]})",
          "observations[0].optimizer");
  refused(R"({"format": "zeroplan-observations", "version": 2, "observations": []})", "version 2");
  // A GEMM's shape, then optionally whether its layer adds a bias (1 or 0).
  for (const char* g : {"[8192, 3072, 768, 1, 2]", "[8192, 3072, 768, 1, true]", "[8192, 3072, 768, 1, 1, 0]", "[8192, 3072]"})
    refused(std::string(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel",
             "class": "gemm", "name": "g", "gemms": [)") + g + R"(], "flops": 1e9, "bytes": 1000, "dtype": "bf16",
             "seconds": 1e-4}]})", "observations[0].gemms[0]");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "phase", "seconds": 1}]})",
          "observations[0].kind");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel", "class": "gemm",
           "dtype": "bf16", "seconds": 1e-3}]})",
          "a GEMM observation needs its shapes");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel", "class": "memory",
           "dtype": "bf17", "seconds": 1e-3}]})",
          "observations[0].dtype");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "kernel", "class": "memory",
           "dtype": "bf16", "seconds": -1}]})",
          "must be a positive time");
  refused(R"({"format": "zeroplan-observations", "version": 1, "observations": [{"kind": "collective", "seconds": 1e-3,
           "collective": {"kind": "all_reduce", "ranks": 2, "bytes": 1024, "colour": 1}}]})",
          "colour");
  bad("calibrate --cluster 8xA100-80GB-NVSwitch --nodes 16 --observations " + saved + " --fit-where 'source=nccl-tests;'",
      "empty alternative");
}

TEST_CASE("calibrate: bad input is one line and exit status 2") {
  bad("calibrate", "no measurements");
  bad("calibrate --nccl-tests " + kFix + "fixture_slow_fabric_all_reduce.txt", "give the cluster the measurements ran on");
  bad("calibrate --cluster 8xA100-80GB-NVSwitch --nccl-tests " + kFix + "fixture_slow_fabric_all_reduce.txt",
      "do not fit cluster 8xA100-80GB-NVSwitch");
  bad("calibrate --cluster 8xA100-80GB-NVSwitch --nccl-tests /no/such/file.txt", "cannot open");
  bad("calibrate --cluster 8xA100-80GB-NVSwitch --nccl-tests " + kFix + "fixture_slow_fabric_deepspeed.log",
      "not nccl-tests output");
  bad("calibrate --deepspeed-runs " + kRuns + " --fit compute.gemm_max_eficiency", "did you mean 'compute.gemm_max_efficiency'");
  bad("calibrate --deepspeed-runs " + kRuns + " --fit-where modle=gpt2", "did you mean 'model'");
  bad("calibrate --deepspeed-runs " + kRuns + " --fit-where model=gpt5", "selects no observation");
  bad("calibrate --cluster 8xA100-80GB-NVSwitch --nodes 16 --deepspeed-log " + kFix + "fixture_slow_fabric_deepspeed.log",
      "--model");
  bad("calibrate --cluster 8xA100-80GB-NVSwitch --nodes 16 --deepspeed-log " + kFix +
          "fixture_slow_fabric_all_reduce.txt --model gpt2-medium --ds-config " + kFix + "fixture_slow_fabric_ds_config.json",
      "no DeepSpeed timer lines");
  bad("calibrate --deepspeed-runs " + kRuns + " --budget 0", "--budget");
  bad("calibrate --device rocm --model gpt2", "must be cuda");
  bad("calibrate --device cuda --model gpt2 --budget 1", "--device");
  bad("simulate --model gpt2 --gpus 8 --gpu A100-80GB --profile " + kRuns, "not a zeroplan cluster profile");
  bad("simulate --model gpt2 --gpus 8 --gpu A100-80GB --profile /no/such/profile.json", "/no/such/profile.json");
}

// simulate --host-probe-us: a profile fitted on runs recorded with the host probe carries the probe
// its host costs are at (host.probe_us); a host whose probe is known gets them scaled by the ratio.
TEST_CASE("simulate --host-probe-us: the host costs scaled from the profile's probe") {
  const std::string h100 = std::string(ZEROPLAN_SHARED_DIR) + "/calibration/profiles/h100-80gb_deepspeed-0.19.8.json";
  // BERT-base at stage 0 in bf16 (FP16_Optimizer), the H100 machine's run bertb-bf16-sdpa-s0.
  const std::string cfg = tmp("bertb_bf16_s0.json");
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 64, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}, "zero_optimization": {"stage": 0}})";
  const std::string base = "simulate --model bert-base-uncased --cluster 1xH100-80GB --seq-len 128 --ds-config " + cfg +
                           " --json --profile " + h100;
  auto iteration = [](const Run& x) {
    REQUIRE(x.status == 0);
    return nlohmann::json::parse(x.out)["results"][0]["time"]["iteration_ms"].get<double>();
  };
  auto step = [](const Run& x) { return nlohmann::json::parse(x.out)["results"][0]["time"]["step_ms"].get<double>(); };
  const Run at = run(base);
  const Run same = run(base + " --host-probe-us 5.3839");  // the profile's own probe (5.38 us): nothing moves
  const Run slow = run(base + " --host-probe-us 10.77");  // a host twice as slow
  CHECK(iteration(same) == zp::test::approx(iteration(at)).epsilon(0.001));
  CHECK(iteration(slow) > 1.2 * iteration(at));  // BERT-base at stage 0 is host-bound
  const auto hp = nlohmann::json::parse(slow.out)["host_probe"];
  CHECK(hp["probe_us"].get<double>() == 10.77);
  CHECK(hp["host_cost_factor"].get<double>() == zp::test::approx(10.77 / hp["profile_probe_us"].get<double>()));
  CHECK(hp["profile_probe_us"].get<double>() == zp::test::approx(5.38).epsilon(0.01));
  CHECK_FALSE(nlohmann::json::parse(at.out).contains("host_probe"));
  // The step's host work (FP16_Optimizer's loops with a read back per tensor) doubles with it.
  CHECK(step(slow) > 1.6 * step(at));
  bad(base + " --host-probe-us 0", "--host-probe-us");
  bad(base + " --host-probe-us -3", "(0, 10000]");
  bad(base + " --host-probe-us nan", "--host-probe-us");
  // The built-in preset's costs say no probe: nothing to scale from.
  bad("simulate --model gpt2 --cluster 1xH200-141GB --micro-batch 8 --seq-len 1024 --host-probe-us 5", "no probe");
  bad("plan --model gpt2 --cluster 1xH200-141GB --host-probe-us 5", "no probe");
  // plan takes it too: the same profile, a host twice as slow, a slower best candidate.
  auto best_ms = [](const Run& x) {
    REQUIRE(x.status == 0);
    return nlohmann::json::parse(x.out)["best"]["time"]["iteration_ms"].get<double>();
  };
  const std::string plan = "plan --model bert-base-uncased --cluster 1xH100-80GB --seq-len 128 --global-batch 64 --json "
                           "--ds-config " + cfg + " --profile " + h100;
  CHECK(best_ms(run(plan + " --host-probe-us 10.77")) > 1.1 * best_ms(run(plan)));
}

TEST_CASE("calibrate --list-params") {
  const Run r = run("calibrate --list-params");
  CHECK(r.status == 0);
  for (const char* name : {"compute.gemm_max_efficiency", "host.grad_hook_us", "collective.inter.bandwidth",
                           "collective.intra.latency.ring.ll128", "collective.fill_fraction"})
    CHECK(r.out.find(name) != std::string::npos);
}

// The same runs with the micro-benchmarks of all three models (what a user planning them would
// measure): fused attention at BERT's 128 tokens beside GPT-2's 1024 determines attention's own
// curve along the sequence (compute.attention_half_seq), which GPT-2's alone cannot.
TEST_CASE("calibrate: each model's micro-benchmarks fit attention's sequence curve and improve every held-out phase") {
  const Run r = calibrate_executor_runs({"gpt2", "bert-large-uncased", "llama-300m"});
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, double> after;
  for (const auto& p : j["held_out_phases"]) after[p["phase"].get<std::string>()] = p["mape_after"].get<double>();
  REQUIRE(after.size() == 4);
  CHECK(after["forward"] < 3.2);  // 2.7 / 3.7 / 3.3 / 3.1% (forward / backward / step / iteration)
  CHECK(after["backward"] < 4.2);
  CHECK(after["step"] < 4);
  CHECK(after["iteration"] < 3.6);
  bool fitted = false;
  for (const auto& p : j["parameters"])
    if (p["name"] == "compute.attention_half_seq") {
      fitted = true;  // "parameters" lists what was fitted, "refused" the rest
      CHECK(p["after"].get<double>() > 30);  // a flash kernel's loop over keys: about a hundred tokens
      CHECK(p["after"].get<double>() < 400);
    }
  CHECK(fitted);
}

// cuDNN's own memory (its handle and attention engines) from runs with --attention-kernel cudnn
// (tests/data/calibration/h100_executor_parts: 8, 8 and 10 MiB, and a run with the own kernels,
// which has none): the median goes into the profile, as sim/devices.json's H100 figure is.
TEST_CASE("calibrate --train-out: cuDNN's handle and engines into the profile") {
  const std::string dir = std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/calibration/h100_executor_parts/";
  const std::string prof = tmp("executor_profile_parts.json");
  std::string args;
  for (const char* f : {"gpt2-medium-own", "gpt2-medium-cudnn", "gpt2-medium-cudnn-fused-mlp", "bert-large-uncased-cudnn"})
    args += std::string(" --train-out ") + dir + f + ".json";
  const Run r = run("calibrate --cluster 1xH100-80GB" + args + " --out " + prof);
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("cuDNN's handle and attention engines 8.0 MiB") != std::string::npos);
  const auto e = nlohmann::json::parse(std::ifstream(prof))["executor_memory"];
  CHECK(e["cudnn_bytes"] == 8 << 20);
  CHECK(e["runs"] == 4);
  // The 2 MiB spread of cuDNN's figure (the driver's code memory steps) is no warning.
  CHECK(r.err.find("driver figures differ") == std::string::npos);
}

// The executor's memory outside the program, measured by train --device cuda's driver figures,
// goes into the profile, and simulate --executor takes it from there over the device
// database's (for a GPU the database never measured, the only source).
TEST_CASE("calibrate --train-out: the CUDA executor's context, library and NCCL figures into the profile") {
  const std::string dir = std::string(ZEROPLAN_SHARED_DIR) + "/tests/data/calibration/h200_executor/";
  const std::string prof = tmp("executor_profile.json");
  const Run r = run("calibrate --cluster 1xH200-141GB --train-out " + dir + "gpt2-s0.json --train-out " + dir +
                    "gpt2-s1.json --train-out " + dir + "bertl-s0.json --out " + prof);
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("zeroplan's CUDA executor on this GPU (3 train --out runs; simulate --executor reads them): context "
                   "526.9 MiB, libraries 4.0 MiB beyond the kernels' 96 MiB, one rank's NCCL communicator 578.0 MiB") !=
        std::string::npos);
  auto doc = nlohmann::json::parse(std::ifstream(prof));
  const auto& e = doc["executor_memory"];
  CHECK(e["context_bytes"] == 552468480);  // each run's after_context
  CHECK(e["library_bytes"] == 4194304);    // after_init - after_context - 96 MiB
  CHECK(e["nccl_one_rank_bytes"] == 606076928);
  CHECK(e["cudnn_bytes"].is_null());  // no run with --attention-kernel cudnn
  CHECK(e["runs"] == 3);
  // simulate --executor with the profile: its figures, not the database's.
  doc["executor_memory"]["context_bytes"] = 1LL << 30;
  const std::string edited = tmp("executor_profile_edited.json");
  std::ofstream(edited) << doc.dump();
  const std::string ds = tmp("executor_ds.json");
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}})";
  const Run with = run("simulate --model tiny-gpt2 --ds-config " + ds + " --seq-len 16 --gpus 1 --gpu h200 --executor cuda "
                       "--json --profile " + edited);
  REQUIRE(with.status == 0);
  const Run without = run("simulate --model tiny-gpt2 --ds-config " + ds + " --seq-len 16 --gpus 1 --gpu h200 --executor cuda --json");
  REQUIRE(without.status == 0);
  const auto uw = nlohmann::json::parse(with.out)["results"][0]["executor"]["device_used"];
  const auto uo = nlohmann::json::parse(without.out)["results"][0]["executor"]["device_used"];
  CHECK(uw["context_bytes"] == 1LL << 30);
  CHECK(uo["context_bytes"] == 552468480);
  // A profile of MPI runs only has no communicator figure: unknown for NCCL, known for MPI.
  doc["executor_memory"]["nccl_one_rank_bytes"] = nullptr;
  std::ofstream(edited) << doc.dump();
  const auto mpi_only = [&](const char* executor) {
    const Run m = run("simulate --model tiny-gpt2 --ds-config " + ds + " --seq-len 16 --gpus 1 --gpu h200 --executor " +
                      executor + " --json --profile " + edited);
    REQUIRE(m.status == 0);
    return nlohmann::json::parse(m.out)["results"][0]["executor"]["device_used"]["known"].get<bool>();
  };
  CHECK_FALSE(mpi_only("cuda"));
  CHECK(mpi_only("cuda-mpi"));
  // Runs whose figures differ (here one's context 8 MiB larger) are warned about, and their
  // medians kept.
  {
    auto other = nlohmann::json::parse(std::ifstream(dir + "gpt2-s1.json"));
    for (const char* k : {"after_context", "after_init", "after_comm"})
      other["driver_memory"][k] = other["driver_memory"][k].get<std::int64_t>() + (8 << 20);
    const std::string moved = tmp("executor_moved_run.json");
    std::ofstream(moved) << other.dump();
    const std::string p2 = tmp("executor_profile2.json");
    const Run w = run("calibrate --cluster 1xH200-141GB --train-out " + dir + "gpt2-s0.json --train-out " + moved +
                      " --train-out " + dir + "bertl-s0.json --out " + p2);
    REQUIRE(w.status == 0);
    CHECK(w.err.find("the train --out runs' driver figures differ by up to 8.0 MiB (context), 0.0 MiB (libraries) and "
                     "0.0 MiB (NCCL)") != std::string::npos);
    CHECK(nlohmann::json::parse(std::ifstream(p2))["executor_memory"]["context_bytes"] == 552468480);  // the median
  }
  // cuDNN's handle and engines: unknown on the H200 (sim/devices.json has no figure for it), so a
  // run through cuDNN's attention has no device-used prediction there; a profile with the
  // figure gives one.
  {
    const std::string ds16 = tmp("executor_ds16.json");
    std::ofstream(ds16) << R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}})";
    const auto used = [&](const std::string& extra) {
      const Run m = run("simulate --model tiny-gpt2 --ds-config " + ds16 + " --seq-len 16 --gpus 1 --gpu h200 --attention sdpa "
                        "--executor cuda --attention-kernel cudnn --json" + extra);
      REQUIRE(m.status == 0);
      return nlohmann::json::parse(m.out)["results"][0]["executor"]["device_used"];
    };
    CHECK(used("")["known"] == false);
    auto withc = nlohmann::json::parse(std::ifstream(prof));
    withc["executor_memory"]["cudnn_bytes"] = 6 << 20;
    const std::string pc = tmp("executor_profile_cudnn.json");
    std::ofstream(pc) << withc.dump();
    const auto u = used(" --profile " + pc);
    CHECK(u["known"] == true);
    CHECK(u["cudnn_bytes"] == 6 << 20);
    CHECK(u["total_bytes"].get<std::int64_t>() ==
          u["context_bytes"].get<std::int64_t>() + u["libraries_bytes"].get<std::int64_t>() +
              u["communicator_bytes"].get<std::int64_t>() + u["cudnn_bytes"].get<std::int64_t>() +
              u["reserved_bytes"].get<std::int64_t>() + u["scratch_bytes"].get<std::int64_t>() +
              u["pages_bytes"].get<std::int64_t>());
  }
  // A profile whose executor figures lack a key is refused.
  doc["executor_memory"].erase("library_bytes");
  std::ofstream(edited) << doc.dump();
  const Run bad = run("simulate --model tiny-gpt2 --gpus 1 --gpu h200 --profile " + edited);
  CHECK(bad.status == 2);
  CHECK(bad.err.find("executor_memory.library_bytes: missing required key") != std::string::npos);
}
