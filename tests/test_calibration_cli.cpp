// `zeroplan calibrate` end to end, and --profile on simulate and plan: the slow-fabric fixtures
// (a cluster unlike the presets) give a profile that reproduces them and changes plan's choice;
// the recorded H200 runs calibrate; every bad input is one line and exit status 2.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct Run {
  int status = -1;
  std::string out;   // stdout
  std::string err;   // stderr
};

Run run(const std::string& args) {
  const auto dir = std::filesystem::temp_directory_path() / "zeroplan-test-calibration-cli";
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
  const auto dir = std::filesystem::temp_directory_path() / "zeroplan-test-calibration-cli";
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
  CHECK(b["iteration_interval_ms"][0].get<double>() == doctest::Approx(it * (1 - s)));
  CHECK(b["iteration_interval_ms"][1].get<double>() == doctest::Approx(it * (1 + s)));
  // The table says it too.
  const Run t = run(base + " --profile " + fixture_profile());
  CHECK(t.out.find("with profile " + fixture_profile() + ": iteration times carry ±") != std::string::npos);
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
    CHECK(p["runs"].get<int>() == 30);  // 38 runs, 8 of them GPT-2 at stage 0 or 1
    CHECK(p.contains("mape_before"));
  }
  CHECK(phases == 7);  // forward, backward, step, iteration (wall) and forward, backward, step (GPU busy)
  for (const auto& s : j["sources"])
    if (s["fitted"].get<int>() > 0) CHECK(s["mape_fitted_after"].get<double>() < s["mape_fitted_before"].get<double>());
  CHECK(j["uncertainty"]["basis"].get<std::string>().find("30 held-out runs") != std::string::npos);
  // The profile reads back and plans with it.
  const Run s = run("simulate --model gpt2 --gpus 1 --gpu H200-141GB --micro-batch 8 --seq-len 1024 --profile " + out);
  CHECK(s.status == 0);
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

TEST_CASE("calibrate --list-params") {
  const Run r = run("calibrate --list-params");
  CHECK(r.status == 0);
  for (const char* name : {"compute.gemm_max_efficiency", "host.grad_hook_us", "collective.inter.bandwidth",
                           "collective.intra.latency.ring.ll128", "collective.fill_fraction"})
    CHECK(r.out.find(name) != std::string::npos);
}
