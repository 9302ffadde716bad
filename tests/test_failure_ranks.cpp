// Resuming on several ranks (mpirun -np 2) from checkpoints that must not be trusted: files
// of another step, of another run, a model config.json or ds_config changed since; and a
// refusal seen by one rank only. Every case ends on every rank with one line and exit
// status 2, never a hang (each run is under `timeout`: status 124 would be a hang).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace fs = std::filesystem;
using zp::test::ShellRun;

namespace {

fs::path dir() {
  const auto d = fs::temp_directory_path() / fmt::format("zeroplan-test-ranks-{}", ::getpid());
  fs::create_directories(d);
  return d;
}

std::string write(const std::string& name, const std::string& text) {
  std::ofstream(dir() / name) << text;
  return (dir() / name).string();
}

// Two ranks, as root and oversubscribed, ended after 120 s at the latest.
ShellRun train2(const std::string& args) {
  return zp::test::run_shell(fmt::format("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun "
                                         "--oversubscribe -np 2 {} train --seq-len 16 --quiet {}",
                                         ZEROPLAN_BIN, args));
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Both ranks printed exactly one line each.
void check_every_rank_said(const ShellRun& r, const std::string& what) {
  INFO(r.out);
  CHECK(r.status != 124);
  CHECK(r.status != 0);
  for (int rank : {0, 1}) {
    const std::string prefix = fmt::format("zeroplan: rank {}: ", rank);
    const auto at = r.out.find(prefix);
    REQUIRE(at != std::string::npos);
    CHECK(r.out.find(prefix, at + 1) == std::string::npos);
    CHECK(contains(r.out.substr(at, r.out.find('\n', at) - at), what));
  }
}

const std::string kCfg = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000}})";

void copy_rank_files(const fs::path& from, const fs::path& to, int rank) {
  for (const char* part : {"model_states", "optim_states"}) {
    const auto name = fmt::format("zero_pp_rank_{}_mp_rank_00_{}.zpck", rank, part);
    fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

TEST_CASE("ranks resuming from different steps stop at once, every rank saying why") {
  const std::string cfg = write("steps.json", kCfg);
  const auto ck = dir() / "steps-ck";
  fs::remove_all(ck);
  REQUIRE(train2(fmt::format("--model tiny-gpt2 --ds-config {} --steps 10 --save-every 5 --checkpoint-dir {}", cfg,
                             ck.string()))
              .status == 0);
  copy_rank_files(ck / "global_step5", ck / "global_step10", 1);
  const ShellRun r =
      train2(fmt::format("--model tiny-gpt2 --ds-config {} --steps 12 --checkpoint-dir {} --resume", cfg, ck.string()));
  CHECK(r.status == 2);
  check_every_rank_said(r, "holds the state of step 5 (saved as global_step5), but lies in global_step10");
  CHECK(contains(r.out, "zeroplan: rank 0: stopped: rank 1 refused the checkpoint:"));
}

TEST_CASE("a checkpoint mixing two runs is refused on every rank") {
  const std::string cfg = write("runs.json", kCfg);
  const auto a = dir() / "runs-a", b = dir() / "runs-b";
  fs::remove_all(a);
  fs::remove_all(b);
  REQUIRE(train2(fmt::format("--model tiny-gpt2 --ds-config {} --steps 3 --checkpoint-dir {}", cfg, a.string())).status == 0);
  REQUIRE(train2(fmt::format("--model tiny-gpt2 --ds-config {} --steps 3 --seed 99 --checkpoint-dir {}", cfg, b.string()))
              .status == 0);
  copy_rank_files(b / "global_step3", a / "global_step3", 1);
  const ShellRun r =
      train2(fmt::format("--model tiny-gpt2 --ds-config {} --steps 5 --checkpoint-dir {} --resume", cfg, a.string()));
  CHECK(r.status == 2);
  check_every_rank_said(r, "global_step3: the ranks' files come from different runs");
  CHECK(contains(r.out, "seeds: rank 0 1234, rank 1 99): files of two runs were mixed"));
}

TEST_CASE("a model config.json or ds_config changed since the checkpoint is refused naming the keys; re-indented is not a change") {
  const std::string cfg = write("edit.json", kCfg);
  const auto model = dir() / "edit-model";
  fs::create_directories(model);
  std::ifstream cat(std::string(ZEROPLAN_SHARED_DIR) + "/models/catalog/tiny-gpt2.json");
  const nlohmann::json original = nlohmann::json::parse(cat);
  std::ofstream(model / "config.json") << original.dump(2);
  const auto ck = dir() / "edit-ck";
  fs::remove_all(ck);
  const std::string base = fmt::format("--model {} --checkpoint-dir {}", (model / "config.json").string(), ck.string());
  REQUIRE(train2(fmt::format("{} --ds-config {} --steps 2", base, cfg)).status == 0);

  // The same shapes, other heads and activation: the parameters would load, the model is another.
  nlohmann::json edited = original;
  edited["n_head"] = 2;
  edited["activation_function"] = "relu";
  std::ofstream(model / "config.json") << edited.dump(2);
  ShellRun r = train2(fmt::format("{} --ds-config {} --steps 3 --resume", base, cfg));
  CHECK(r.status == 2);
  check_every_rank_said(r, "meta.model_digest: the model's config.json changed since the checkpoint was written: "
                           "activation_function: \"gelu_new\" in the checkpoint vs \"relu\" now; n_head: 4 in the "
                           "checkpoint vs 2 now");
  std::ofstream(model / "config.json") << original.dump(7);  // re-indented: the same model

  // The ds_config re-indented, keys reordered, 5000 written 5e3: the same config, resumed.
  const std::string same = write("edit-same.json", "{\"zero_optimization\": {\"reduce_bucket_size\": 5e3, \"stage\": 2},\n"
                                                   "   \"optimizer\": {\"params\": {\"lr\": 0.002}, \"type\": \"AdamW\"},\n"
                                                   "   \"gradient_accumulation_steps\": 1, "
                                                   "\"train_micro_batch_size_per_gpu\": 2}");
  r = train2(fmt::format("{} --ds-config {} --steps 3 --resume", base, same));
  CHECK(r.status == 0);
  // Another learning rate: refused, naming the key.
  const std::string other = write("edit-other.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000}})");
  r = train2(fmt::format("{} --ds-config {} --steps 4 --resume", base, other));
  CHECK(r.status == 2);
  check_every_rank_said(r, "the checkpoint was written with another ds_config: optimizer.params.lr: 0.002 in the "
                           "checkpoint vs 0.003 now");
}

TEST_CASE("a refusal only one rank sees stops every rank before training") {
  const std::string cfg = write("one-rank.json", kCfg);
  // Rank 1's measurements path is a folder; rank 0's is fine.
  const auto out = dir() / "one-rank-out.json";
  fs::remove_all(dir() / "one-rank-out.rank1.json");
  fs::create_directories(dir() / "one-rank-out.rank1.json");
  const ShellRun r = train2(fmt::format("--model tiny-gpt2 --ds-config {} --steps 50 --out {}", cfg, out.string()));
  CHECK(r.status == 2);
  check_every_rank_said(r, "one-rank-out.rank1.json: --out: is a directory");
  CHECK(contains(r.out, "zeroplan: rank 0: stopped: rank 1 refused its input:"));
  CHECK_FALSE(fs::exists(dir() / "one-rank-out.rank0.json"));
}

// A peer that stops mid-training (SIGSTOP: it hangs, holding its sockets open) or is
// killed: every rank ends within --comm-timeout of reaching the collective, with one line
// naming the rank, the collective, its bytes and its group for the hang.
// 6 s: on a loaded 2-core machine a healthy peer was once more than 3 s late to a collective,
// and the waiting rank rightly ended the job before the test's signal.
TEST_CASE("a hung or dead peer ends every rank within --comm-timeout") {
  const std::string cfg = write("hang.json", kCfg);
  for (const std::string fault : {"STOP", "KILL"})
    zp::test::check_peer_fault(
        zp::test::fault_peer("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2",
                             fmt::format("{} train --model tiny-gpt2 --ds-config {} --seq-len 16 --steps 100000000 "
                                         "--comm-timeout 6", ZEROPLAN_BIN, cfg),
                             fault, dir() / fmt::format("hang-{}.log", fault)),
        fault,
        // Which collective rank 0 waits in depends on where the peer stopped (the gradients'
        // all-reduce, or the step's all-gather after it: both seen), so the line is checked for
        // the rank, a size and the group, with the collective's name between them.
        {"zeroplan: rank 0: MPI ", " B (",
         " on group [0,1] did not complete within 6 s: a peer died or hangs (--comm-timeout)"},
        6.0);
}

// A peer that hangs between a step's collectives and the step's report (the loss's sum over
// the ranks, an MPI call outside the program): the report is bounded by --comm-timeout like
// the collectives, so rank 0 ends the job instead of waiting for ever. The hang is made by
// ZEROPLAN_TEST_STOP_BEFORE_REPORT (rank 1 stops itself there; exec/trainer.cpp).
TEST_CASE("a peer hung before a step's report ends every rank within --comm-timeout") {
  const std::string cfg = write("report.json", kCfg);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = zp::test::run_shell(fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe -np 2 "
      "-x ZEROPLAN_TEST_STOP_BEFORE_REPORT=1:3 {} train --model tiny-gpt2 --ds-config {} --seq-len 16 --steps 10 "
      "--comm-timeout 3 --quiet",
      ZEROPLAN_BIN, cfg));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  MESSAGE("rank 1 stopped before step 3's report: mpirun status ", r.status, " after ", seconds, " s");
  CHECK(r.status != 0);
  CHECK(r.status != 124);  // not ended by the test's own timeout
  CHECK(seconds < 30.0);
  CHECK(r.out.find("zeroplan: rank 0: MPI all_reduce of 8 B (1 x fp64, the step's report) on group [0,1] did not "
                   "complete within 3 s: a peer died or hangs (--comm-timeout)") != std::string::npos);
}
