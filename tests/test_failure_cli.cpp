// What the commands do on hostile input and paths (docs/failure.md), one process each:
// outputs through devices, FIFOs, symlinks and directories; outputs that are inputs;
// concurrent writers of one --out; plan when nothing fits; a bad --checkpoint-dir;
// inputs nested too deep or without end; the scale edges; and the smaller refusals.
#include <algorithm>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using zp::test::ShellRun;

namespace {

const std::string kBin = ZEROPLAN_BIN;

fs::path dir() {
  const auto d = fs::temp_directory_path() / fmt::format("zeroplan-test-failure-{}", ::getpid());
  fs::create_directories(d);
  return d;
}

std::string path(const std::string& name) { return (dir() / name).string(); }

std::string write(const std::string& name, const std::string& text) {
  std::ofstream(dir() / name) << text;
  return path(name);
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ShellRun sh(const std::string& cmd) { return zp::test::run_shell(cmd); }
ShellRun cmd(const std::string& args) { return sh(kBin + " " + args); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The lines of `out` that start with "zeroplan:" (errors) and those that do not.
int error_lines(const std::string& out) {
  int n = 0;
  std::size_t pos = 0;
  while ((pos = out.find("zeroplan:", pos)) != std::string::npos) {
    ++n;
    pos += 9;
  }
  return n;
}

int temporaries(const fs::path& d) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().find(".tmp") != std::string::npos) ++n;
  return n;
}

const std::string kCfg = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000}})";

const std::string kPlan = "plan --model tiny-gpt2 --gpus 2 --gpu A100-80GB --global-batch 8 --seq-len 32 --search stage,micro_batch";

}  // namespace

TEST_CASE("--out writes through /dev/stdout, devices and symlinks; refuses a directory without leaving a temporary") {
  // The system's /dev/stdout, /dev/null and /dev/full are not handed to the command under
  // test (a regression would replace them for the whole machine): stand-ins of the same
  // kind are made here, a symlink to /proc/self/fd/1 and, as root, device nodes 1:3, 1:7.
  const auto stdout_link = dir() / "stdout";
  fs::remove(stdout_link);
  fs::create_symlink("/proc/self/fd/1", stdout_link);
  // stdout redirected to a file: the ds_config goes into it, before the report.
  const std::string captured = path("captured.txt");
  ShellRun r = sh(fmt::format("{} {} --out {} > {}", kBin, kPlan, stdout_link.string(), captured));
  REQUIRE(r.status == 0);
  const std::string text = slurp(captured);
  REQUIRE(text.rfind("{\n", 0) == 0);
  CHECK(json::parse(text.substr(0, text.find("\n}\n") + 3))["train_batch_size"] == 8);
  CHECK(contains(text, "ds_config written to " + stdout_link.string()));
  // Into a pipe; the link stays a link.
  r = sh(fmt::format("{} {} --out {} | head -c 1", kBin, kPlan, stdout_link.string()));
  CHECK(r.out == "{");
  CHECK(fs::is_symlink(stdout_link));
  // A device stays a device.
  if (::geteuid() == 0) {
    const std::string null = path("null"), full = path("full");
    fs::remove(null);
    fs::remove(full);
    REQUIRE(::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
    REQUIRE(::mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0);
    r = cmd(kPlan + " --out " + null);
    CHECK(r.status == 0);
    CHECK(fs::is_character_file(null));
    r = cmd(kPlan + " --out " + full);
    CHECK(r.status == 2);
    CHECK(contains(r.out, "zeroplan: " + full + ": --out: cannot write: No space left on device"));
    CHECK(fs::is_character_file(full));
  }
  // A directory: one line, exit 2, checked before the search, nothing left in or beside it.
  const auto d = dir() / "outdir";
  fs::create_directories(d);
  r = cmd(kPlan + " --out " + d.string());
  CHECK(r.status == 2);
  CHECK(r.out == fmt::format("zeroplan: {}: --out: is a directory; give the path of a file to write\n", d.string()));
  CHECK(fs::is_empty(d));
  CHECK_FALSE(fs::exists(d.string() + ".tmp"));
  CHECK(temporaries(dir()) == 0);
  r = cmd(fmt::format("simulate --model tiny-gpt2 --gpus 1 --gpu cpu --seq-len 16 --trace {}", d.string()));
  CHECK(r.status == 2);
  CHECK(contains(r.out, "--trace: is a directory"));
  r = cmd(fmt::format("train --model tiny-gpt2 --steps 1 --seq-len 16 --quiet --out {}", d.string()));
  CHECK(r.status == 2);
  CHECK(contains(r.out, "--out: is a directory"));
}

TEST_CASE("an output that is an input is refused before any work, and the input is left as it was") {
  const std::string cfg = write("in-cfg.json", kCfg);
  const std::vector<std::string> cmds = {
      fmt::format("train --model tiny-gpt2 --ds-config {0} --steps 1 --seq-len 16 --quiet --out {0}", cfg),
      fmt::format("train --model tiny-gpt2 --ds-config {0} --steps 1 --seq-len 16 --quiet --trace {0}", cfg),
      fmt::format("simulate --model tiny-gpt2 --ds-config {0} --gpus 1 --gpu cpu --seq-len 16 --trace {0}", cfg),
      fmt::format("plan --model tiny-gpt2 --ds-config {0} --gpus 2 --gpu A100-80GB --global-batch 8 --seq-len 16 "
                  "--search stage --out {0}",
                  cfg),
  };
  for (const auto& c : cmds) {
    CAPTURE(c);
    const ShellRun r = cmd(c);
    CHECK(r.status == 2);
    CHECK(error_lines(r.out) == 1);
    CHECK(contains(r.out, "is the same file as the input --ds-config"));
    CHECK(slurp(cfg) == kCfg);
  }
  // Another name for the same file (a hard link), and the model's own config.json.
  const std::string hard = path("hard-link.json");
  fs::remove(hard);
  fs::create_hard_link(cfg, hard);
  ShellRun r = cmd(fmt::format("simulate --model tiny-gpt2 --ds-config {} --gpus 1 --gpu cpu --seq-len 16 --trace {}", cfg, hard));
  CHECK(r.status == 2);
  CHECK(slurp(cfg) == kCfg);
  const std::string model = write("model-config.json", slurp(std::string(ZEROPLAN_SHARED_DIR) + "/models/catalog/tiny-gpt2.json"));
  const std::string before = slurp(model);
  r = cmd(fmt::format("train --model {0} --steps 1 --seq-len 16 --quiet --out {0}", model));
  CHECK(r.status == 2);
  CHECK(contains(r.out, "is the same file as the input --model"));
  CHECK(slurp(model) == before);
}

TEST_CASE("concurrent plan --out of one file: every run succeeds and the file is always one whole ds_config") {
  const std::string out = path("same.json");
  const std::string a = kBin + " " + kPlan + " --out " + out + " > /dev/null 2>&1";
  const std::string b = kBin + " plan --model tiny-gpt2 --gpus 2 --gpu A100-80GB --global-batch 16 --seq-len 32 "
                        "--search stage,micro_batch --out " + out + " > /dev/null 2>&1";
  for (int trial = 0; trial < 4; ++trial) {
    CAPTURE(trial);
    const ShellRun r = sh(fmt::format("{} & p=$!; {}; rb=$?; wait $p; echo \"$? $rb\"", a, b));
    CHECK(r.out == "0 0\n");
    const auto j = json::parse(slurp(out), nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK((j["train_batch_size"] == 8 || j["train_batch_size"] == 16));
    CHECK(temporaries(dir()) == 0);
  }
}

TEST_CASE("concurrent simulate --trace of one file: the trace is always one whole JSON document") {
  // Traces are large (a few hundred KB here), so writers that share a file would interleave.
  const std::string out = path("same-trace.json");
  const std::string base = kBin + " simulate --model gpt2 --gpus 2 --gpu A100-80GB --seq-len 256 --micro-batch 2 --trace " +
                           out;
  for (int trial = 0; trial < 8; ++trial) {
    CAPTURE(trial);
    const ShellRun r = sh(fmt::format("{0} --stages 0 > /dev/null 2>&1 & p=$!; {0} --stages 3 > /dev/null 2>&1; rb=$?; "
                                      "wait $p; echo \"$? $rb\"",
                                      base));
    CHECK(r.out == "0 0\n");
    const auto j = json::parse(slurp(out), nullptr, false);
    CHECK_FALSE(j.is_discarded());
    CHECK(temporaries(dir()) == 0);
  }
}

TEST_CASE("plan when nothing fits: exit status 3, --out not written, an older file not passed off as the result") {
  const std::string stale = write("stale.json", "{\"stale\": true}\n");
  const ShellRun r = cmd("plan --model Llama-2-7b --gpus 1 --gpu V100-16GB --global-batch 8 --seq-len 512 "
                        "--search stage,micro_batch --out " + stale);
  CHECK(r.status == 3);
  CHECK(contains(r.out, "nothing fits"));
  CHECK(contains(r.out, fmt::format("warning: --out {}: not written: nothing fits; the file there is from before and "
                                    "is not a result of this plan",
                                    stale)));
  CHECK(slurp(stale) == "{\"stale\": true}\n");
  const std::string fresh = path("never-written.json");
  fs::remove(fresh);
  const ShellRun j = cmd("plan --model Llama-2-7b --gpus 1 --gpu V100-16GB --global-batch 8 --seq-len 512 "
                        "--search stage,micro_batch --json --out " + fresh);
  CHECK(j.status == 3);
  CHECK_FALSE(fs::exists(fresh));
  const auto doc = json::parse(j.out.substr(j.out.find('{')));
  CHECK(doc["ds_config_written"] == false);
  CHECK(doc["nothing_fits"] == true);
}

TEST_CASE("a bad --checkpoint-dir is refused before the first step") {
  const std::string file = write("not-a-dir", "x");
  const auto loop_a = dir() / "ck-loop-a", loop_b = dir() / "ck-loop-b";
  fs::remove(loop_a);
  fs::remove(loop_b);
  fs::create_symlink(loop_b, loop_a);
  fs::create_symlink(loop_a, loop_b);
  for (const auto& [ck, expect] : std::vector<std::pair<std::string, std::string>>{
           {file, "cannot create the checkpoint folder: Not a directory"},
           {"/proc/ck", "cannot create the checkpoint folder"},
           {loop_a.string(), "Too many levels of symbolic links"}}) {
    CAPTURE(ck);
    const ShellRun r = cmd(fmt::format("train --model tiny-gpt2 --steps 300 --seq-len 16 --checkpoint-dir {}", ck));
    INFO(r.out);
    CHECK(r.status == 2);
    CHECK(error_lines(r.out) == 1);
    CHECK(contains(r.out, ck + ": --checkpoint-dir: "));
    CHECK(contains(r.out, expect));
    CHECK_FALSE(contains(r.out, "step    1"));
  }
}

TEST_CASE("inputs nested 100,000 levels deep or without end are refused with one line") {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"a\":";
  deep += '1';
  deep.append(100000, '}');
  const std::string cfg = write("deep.json", deep);
  std::string xml = R"(<system version="1">)";
  for (int i = 0; i < 100000; ++i) xml += "<cpu>";
  for (int i = 0; i < 100000; ++i) xml += "</cpu>";
  const std::string topo = write("deep.xml", xml + "</system>");
  const std::string zero_xml = write("zero-topo.json", R"({"nccl_topo_xml": "/dev/zero"})");
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"simulate --model gpt2 --gpus 2 --ds-config " + cfg, "nested more than 128 levels deep"},
      {"explain --model gpt2 --gpus 2 --stage 1 --vs-stage 2 --ds-config " + cfg, "nested more than 128 levels deep"},
      {"plan --model gpt2 --gpus 2 --global-batch 8 --ds-config " + cfg, "nested more than 128 levels deep"},
      {"train --model tiny-gpt2 --steps 1 --ds-config " + cfg, "nested more than 128 levels deep"},
      {"simulate --gpus 2 --model " + cfg, "nested more than 128 levels deep"},
      {"collectives --cluster " + topo, "elements nested more than 128 levels deep"},
      {"simulate --model gpt2 --gpus 2 --ds-config /dev/zero", "/dev/zero: more than 8 MiB: too large for a JSON configuration"},
      {"simulate --model gpt2 --gpus 2 --ds-config /dev/urandom", "/dev/urandom: more than 8 MiB"},
      {"train --model tiny-gpt2 --steps 1 --ds-config /dev/zero", "/dev/zero: more than 8 MiB"},
      {"collectives --cluster " + zero_xml, "/dev/zero: more than 8 MiB: too large for an NCCL topology XML"},
      {"compare --predicted /dev/zero --measured /dev/zero", "/dev/zero: more than 256 MiB"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const ShellRun r = cmd(c.args);
    CHECK(r.status == 2);
    CHECK(error_lines(r.out) == 1);
    CHECK(contains(r.out, c.expect));
  }
}

TEST_CASE("scale edges: exhaustive plans say how long they take; a micro-batch beyond memory is refused before allocating") {
  ShellRun r = cmd("plan --model bert-large-uncased --cluster 4xV100-16GB-PCIe --seq-len 128 --global-batch 256 "
                  "--exhaustive --search stage,micro_batch --top 1");
  REQUIRE(r.status == 0);
  const auto grid = r.out.find("exhaustive: 28 candidates to simulate (every point of the grid)");
  const auto estimate = r.out.find("exhaustive: about ");
  CHECK(grid != std::string::npos);
  CHECK(estimate != std::string::npos);
  CHECK(grid < estimate);
  CHECK(contains(r.out, "exhaustive: 100%  28/28"));
  // 10^6 samples of tiny-gpt2 need hundreds of GB: refused with both numbers, before a byte is allocated.
  r = cmd("train --model tiny-gpt2 --seq-len 32 --steps 1 --micro-batch 1000000");
  CHECK(r.status == 2);
  CHECK(error_lines(r.out) == 1);
  CHECK(contains(r.out, "zeroplan: --micro-batch 1000000: the predicted peak memory of "));
  CHECK(contains(r.out, " GB per rank"));
  CHECK(contains(r.out, "GB available there"));
}

TEST_CASE("compare refuses a prediction made from another ds_config, naming the keys") {
  const std::string cfg = write("cmp-a.json", kCfg);
  const std::string other = write("cmp-b.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e3}})");
  const std::string reindented = write("cmp-c.json", "{\n\n   \"zero_optimization\": {\"reduce_bucket_size\": 5000,"
                                                     " \"stage\": 2}, \"gradient_accumulation_steps\": 1,\n"
                                                     "\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"params\":"
                                                     " {\"lr\": 0.002}, \"type\": \"AdamW\"}}");
  REQUIRE(cmd(fmt::format("train --model tiny-gpt2 --ds-config {} --seq-len 16 --steps 2 --quiet --out {}", cfg,
                         path("cmp-m.json")))
              .status == 0);
  REQUIRE(sh(fmt::format("{} simulate --model tiny-gpt2 --ds-config {} --gpus 1 --gpu cpu --seq-len 16 --json > {}", kBin,
                         other, path("cmp-p.json")))
              .status == 0);
  ShellRun r = cmd(fmt::format("compare --predicted {} --measured {}", path("cmp-p.json"), path("cmp-m.json")));
  CHECK(r.status == 2);
  CHECK(contains(r.out, "the runs were made from different ds_configs: optimizer.params.lr: 0.003 in the prediction "
                        "vs 0.002 in the measurement; simulate with the measured run's ds_config"));
  REQUIRE(sh(fmt::format("{} simulate --model tiny-gpt2 --ds-config {} --gpus 1 --gpu cpu --seq-len 16 --json > {}", kBin,
                         reindented, path("cmp-p2.json")))
              .status == 0);
  r = cmd(fmt::format("compare --predicted {} --measured {}", path("cmp-p2.json"), path("cmp-m.json")));
  CHECK(r.status == 0);
}

TEST_CASE("plan keeps every key of BASE.json it did not search exactly, \"auto\" included") {
  const std::string base = write("hf-auto.json", R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
 "gradient_accumulation_steps": "auto", "fp16": {"enabled": "auto"},
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
 "zero_optimization": {"stage": 2, "overlap_comm": true, "allgather_bucket_size": 5e8}})");
  const std::string out = path("hf-auto-out.json");
  ShellRun r = cmd("plan --model gpt2 --ds-config " + base + " --gpus 2 --seq-len 128 --search stage,micro_batch --out " + out);
  CHECK(r.status == 2);
  CHECK(contains(r.out, "train_batch_size is \"auto\" (a placeholder the Hugging Face Trainer fills in); give the "
                        "global batch with --global-batch G"));
  r = cmd("plan --model gpt2 --ds-config " + base + " --gpus 2 --seq-len 128 --global-batch 16 --search stage,micro_batch "
         "--out " + out);
  REQUIRE(r.status == 0);
  const auto j = json::parse(slurp(out));
  CHECK(j["fp16"]["enabled"] == "auto");
  CHECK(j["optimizer"]["params"]["lr"] == "auto");
  CHECK(j["optimizer"]["params"]["weight_decay"] == "auto");
  CHECK(j["zero_optimization"]["overlap_comm"] == true);
  CHECK(j["zero_optimization"]["allgather_bucket_size"].is_number_float());  // 5e8 as written
  CHECK(j["train_batch_size"] == 16);
  CHECK(j["train_micro_batch_size_per_gpu"].get<int>() * j["gradient_accumulation_steps"].get<int>() * 2 == 16);
  // The batch keys all "auto": simulate says so and what to pass.
  r = cmd("simulate --model gpt2 --gpus 2 --ds-config " + base);
  CHECK(r.status == 2);
  CHECK(contains(r.out, "train_batch_size: the batch sizes are \"auto\" (placeholders the Hugging Face Trainer fills "
                        "in from its own arguments), so no batch size is set; pass --micro-batch B"));
}

TEST_CASE("smaller refusals: --gpu with a cluster preset, --data of a directory, plan --verify as root") {
  ShellRun r = cmd("simulate --model gpt2 --cluster 8xA100-80GB-NVSwitch --gpu H200-141GB --micro-batch 1");
  CHECK(r.status == 2);
  CHECK(contains(r.out, "--gpu: cluster '8xA100-80GB-NVSwitch' names its own GPU"));
  r = cmd("simulate --model gpt2 --micro-batch 1 --seq-len 128 --cluster " + std::string(ZEROPLAN_SHARED_DIR) +
         "/tests/data/nccl_topo_8gpu_nvswitch.xml --gpu H200-141GB");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "x H200-141GB"));
  r = cmd("train --model tiny-gpt2 --steps 1 --seq-len 16 --data " + dir().string());
  CHECK(r.status == 2);
  CHECK(contains(r.out, ": --data: is a directory; expected \"synthetic\" or a file of uint16 token ids"));
  r = cmd("train --model tiny-gpt2 --steps 1 --seq-len 16 --data /dev/zero");
  CHECK(r.status == 2);
  CHECK(contains(r.out, "/dev/zero: --data: is not a regular file"));
  if (::geteuid() == 0) {
    r = sh("env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM " + kBin +
           " plan --model tiny-gpt2 --gpus 2 --gpu cpu --global-batch 8 --seq-len 32 --search stage --verify --verify-top 1");
    CHECK(r.status == 0);
    CHECK(contains(r.out, "not run: mpirun refuses to run as root unless OMPI_ALLOW_RUN_AS_ROOT=1 and "
                          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set"));
    CHECK_FALSE(contains(r.out, "(exit 1): ---"));
  }
}

TEST_CASE("train --device: bad values, and cuda where it cannot run, end in one line and exit status 2") {
  // Each: `train --model tiny-gpt2 --steps 1` with these flags, and the line it must print.
  const std::pair<const char*, const char*> refusals[] = {
      {"--device tpu", "--device: must be cpu or cuda, got 'tpu'"},
      {"--allow-tf32", "--allow-tf32: needs --device cuda"},
      {"--comm tcp", "--comm: must be auto, nccl or mpi, got 'tcp'"},
      {"--comm nccl", "--comm: nccl needs --device cuda"},
      {"--comm-timeout 0", "--comm-timeout: must be > 0 seconds"},
      {"--attention-kernel flash", "--attention-kernel: must be own or cudnn, got 'flash'"},
      {"--attention-kernel cudnn", "--attention-kernel: cudnn needs --device cuda"},
  };
  for (const auto& [flags, line] : refusals) {
    const auto refused = sh(kBin + " train --model tiny-gpt2 --steps 1 " + flags);
    INFO(flags, "\n", refused.out);
    CHECK(refused.status == 2);
    CHECK(contains(refused.out, line));
  }
  ShellRun r;
  // No GPU here (or no CUDA in this build): refused before anything runs; with a GPU it trains.
  r = sh(kBin + " train --model tiny-gpt2 --steps 1 --quiet --device cuda");
  INFO(r.out);
  if (r.status != 0) {
    CHECK(r.status == 2);
    CHECK((r.out.find("--device cuda: no CUDA device is visible") != std::string::npos ||
           r.out.find("built without CUDA") != std::string::npos));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
  // cuDNN is opened at run time, not linked: where it cannot be loaded (here a library that is
  // not there), cuDNN's attention is refused with one line before any device work; a build
  // without cuDNN's attention or without CUDA says that instead.
  r = sh("ZEROPLAN_CUDNN_LIBRARY=/nonexistent/libcudnn.so.9 " + kBin +
         " train --model tiny-gpt2 --steps 1 --quiet --device cuda --attention-kernel cudnn");
  INFO(r.out);
  CHECK(r.status == 2);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK((contains(r.out, "zeroplan: --attention-kernel: cudnn: cuDNN 9 could not be loaded (/nonexistent/libcudnn.so.9: "
                         "cannot open shared object file") ||
         contains(r.out, "zeroplan: --attention-kernel: cudnn: this build has no cuDNN attention") ||
         contains(r.out, "built without CUDA")));
  // A library that loads but is not cuDNN: refused the same way, naming it.
  r = sh("ZEROPLAN_CUDNN_LIBRARY=libc.so.6 " + kBin +
         " train --model tiny-gpt2 --steps 1 --quiet --device cuda --attention-kernel cudnn");
  INFO(r.out);
  CHECK(r.status == 2);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK((contains(r.out, "zeroplan: --attention-kernel: cudnn: libc.so.6 is not cuDNN (no cudnnGetVersion in it)") ||
         contains(r.out, "this build has no cuDNN attention") || contains(r.out, "built without CUDA")));
}

// The CUDA binary needs neither cuDNN nor NVRTC to start: they are opened at first use of
// --attention-kernel cudnn, not listed among the libraries the loader must find.
TEST_CASE("zeroplan does not link cuDNN or NVRTC") {
  const auto r = sh("readelf -d " + kBin + " | grep NEEDED");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "libc.so"));
  CHECK_FALSE(contains(r.out, "libcudnn"));
  CHECK_FALSE(contains(r.out, "libnvrtc"));
}

TEST_CASE("plan --verify-device: a bad value is refused before the search") {
  auto r = sh(kBin + " plan --model tiny-gpt2 --cluster cpu-local --global-batch 8 --seq-len 32 --verify --verify-device tpu");
  CHECK(r.status == 2);
  CHECK(r.out == "zeroplan: --verify-device: must be cpu, cuda or auto, got 'tpu'\n");
  r = sh(kBin + " plan --model tiny-gpt2 --cluster cpu-local --global-batch 8 --seq-len 32 --verify --verify-attention-kernel flash");
  CHECK(r.status == 2);
  CHECK(r.out == "zeroplan: --verify-attention-kernel: must be own or cudnn, got 'flash'\n");
  r = sh(kBin + " plan --model tiny-gpt2 --cluster cpu-local --global-batch 8 --seq-len 32 --verify --verify-device cpu "
                "--verify-attention-kernel cudnn");
  CHECK(r.status == 2);
  CHECK(r.out == "zeroplan: --verify-attention-kernel: cudnn needs GPUs (--verify-device cuda or auto)\n");
  r = sh(kBin + " simulate --model tiny-gpt2 --gpus 1 --gpu H100-80GB --seq-len 32 --attention-kernel cudnn");
  CHECK(r.status == 2);
  CHECK(r.out == "zeroplan: --attention-kernel: needs --executor cuda or cuda-mpi (it says which kernels the executor's "
                 "run takes)\n");
}
