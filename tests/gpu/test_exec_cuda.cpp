// `zeroplan train --device cuda` against `--device cpu` on the same program, weights, data
// and dropout masks: 20 steps of each tiny family at stages 0-3, fp32, bf16 and fp16, with
// equal losses within the dtype's tolerance, the program's bytes equal (allocated per
// category at the peak, reserved: both follow the same program through the same
// caching-allocator rules, and on the GPU the reserved bytes are real cudaMalloc segments),
// and the driver's measurements present and consistent; and `zeroplan compare` of each GPU
// run with the simulator's prediction exact in bytes.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../test_util.hpp"
#include "exec/device_cuda.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path dir() {
  static const fs::path d = [] {
    fs::path p = fs::temp_directory_path() / "zeroplan-test-exec-cuda";
    fs::create_directories(p);
    return p;
  }();
  return d;
}

// The zeroplan binary: ZEROPLAN_BIN from the environment (a build copied elsewhere), else
// the one this test was built with.
std::string bin() {
  const char* e = std::getenv("ZEROPLAN_BIN");
  return e && *e ? e : ZEROPLAN_BIN;
}

struct Case {
  std::string model;
  int stage = 0;
  std::string dtype = "fp32";
  int gas = 2;
  std::string attention = "eager";
  bool ckpt = false;
  int np = 1;  // ranks (N > 1: all on the one GPU, collectives staged through host memory and MPI)
  // N > 1 only: NCCL between the ranks on the one GPU, each naming its own NCCL_HOSTID
  // (NCCL then takes them for separate hosts and connects them over loopback sockets).
  bool nccl = false;
  std::string variants = "";  // kernel variants of the graph for train and simulate, e.g. " --fused-loss"
  std::string zero_extra = "";  // more zero_optimization keys, e.g. R"(, "offload_optimizer": {"device": "cpu"})"
  // Flags of the GPU run (and of simulate --executor cuda) only, e.g. " --attention-kernel cudnn":
  // the CPU run it is held against takes the own kernels.
  std::string cuda_flags = "";
};

std::string name_of(const Case& c) {
  std::string v = c.variants + c.cuda_flags;
  std::replace(v.begin(), v.end(), ' ', '_');
  return fmt::format("{}-s{}-{}-g{}-{}{}-n{}{}{}{}", fs::path(c.model).stem().string(), c.stage, c.dtype, c.gas, c.attention, c.ckpt ? "-ckpt" : "",
                     c.np, c.nccl ? "-nccl" : "", v, c.zero_extra.empty() ? "" : fmt::format("-z{:08x}", std::hash<std::string>{}(c.zero_extra) & 0xffffffffu));
}

// mpirun for n ranks, each with NCCL_HOSTID=zp<rank> when `hostid` (NCCL over loopback
// sockets between ranks on one GPU); the command then runs under `bash -c`.
// mpirun's part of the command line; with `hostid`, NCCL over loopback sockets, for ranks that
// each claim a host of their own (rank_env gives each its NCCL_HOSTID).
std::string mpirun_prefix(int n, bool hostid) {
  const std::string head = fmt::format("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np {}", n);
  return hostid ? head + " -x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1" : head;
}
const char* const kRankHostId = "env NCCL_HOSTID=zp$OMPI_COMM_WORLD_RANK ";

std::string mpirun(int n, bool hostid, const std::string& cmd) {
  if (!hostid) return mpirun_prefix(n, false) + " " + cmd;
  return mpirun_prefix(n, true) + " bash -c 'exec " + kRankHostId + cmd + "'";
}

json train(const Case& c, const std::string& device) {
  const std::string name = name_of(c) + "-" + device;
  const std::string precision = c.dtype == "fp32" ? "" : fmt::format(R"("{}": {{"enabled": true}},)", c.dtype);
  const fs::path cfg = dir() / (name_of(c) + ".json");
  std::ofstream(cfg) << fmt::format(
      R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {}, {}
 "optimizer": {{"type": "AdamW", "params": {{"lr": 0.002, "weight_decay": 0.01}}}}, "gradient_clipping": 1.0,
 "zero_optimization": {{"stage": {}, "reduce_bucket_size": 5000, "stage3_prefetch_bucket_size": 3000,
   "stage3_param_persistence_threshold": 100{}}}}})",
      c.gas, precision, c.stage, c.zero_extra);
  const fs::path out = dir() / (name + ".out.json");
  const fs::path rank0 = c.np == 1 ? out : dir() / (name + ".out.rank0.json");
  const std::string cmd = fmt::format("{} train --model {} --ds-config {} --steps 20 --seq-len 16 --quiet "
                                      "--attention {} --device {} --workspaces-of H200-141GB --out {}{}{}{}",
                                      bin(), c.model, cfg.string(), c.attention, device, out.string(),
                                      c.ckpt ? " --activation-checkpointing" : "", c.nccl && device == "cuda" ? " --comm nccl" : "",
                                      c.variants + (device == "cuda" ? c.cuda_flags : ""));
  const auto r = zp::test::run_shell(c.np == 1 ? cmd : mpirun(c.np, c.nccl && device == "cuda", cmd));
  INFO(name, "\n", r.out);
  REQUIRE(r.status == 0);
  std::ifstream in(rank0);
  REQUIRE(in.good());
  return json::parse(in);
}

// The loss tolerance of a dtype over 20 steps (relative): fp32 differs by summation order
// only (cuBLASLt's and the CUDA reductions' against Eigen's); 16-bit runs round each
// tensor, so single roundings differ and the training paths drift apart slowly.
double tolerance(const std::string& dtype) { return dtype == "fp32" ? 2e-4 : 3e-2; }

// The cluster preset of the GPU a run measured, whose entry in sim/devices.json holds the
// context, library and NCCL figures the driver's device-used bytes are predicted with; "" for
// a GPU without them (the bytes are then predicted on the H200's preset, the device-used
// figure not held). train's --workspaces-of H200-141GB gives PyTorch's workspaces of any sm_90
// GPU (33,554,432 B a cuBLAS handle on the H100 and the H200 alike).
std::string cluster_of(const std::string& gpu) {
  if (gpu.find("H200") != std::string::npos) return "8xH200-141GB-NVSwitch";
  if (gpu.find("H100 80GB HBM3") != std::string::npos) return "8xH100-80GB-NVSwitch";  // the SXM part the figures are of
  return "";
}

// zeroplan compare of rank 0's GPU measurement with the simulator's prediction for it:
// allocated bytes per category, reserved bytes and every collective kind exact; the
// device's own scratch exact (simulate --executor, exec/cuda_memory.hpp); and, for one
// process on a GPU whose context, libraries and NCCL figures sim/devices.json holds (an H100
// or an H200), or ranks sharing it over MPI, the driver's device-used peak within 1% of the
// prediction.
void check_compare(const Case& c) {
  const fs::path cfg = dir() / (name_of(c) + ".json");
  const fs::path measured = dir() / (name_of(c) + "-cuda.out" + (c.np == 1 ? ".json" : ".rank0.json"));
  const fs::path predicted = dir() / (name_of(c) + ".predicted.json");
  const json m = json::parse(std::ifstream(measured));
  const std::string cluster = cluster_of(m["config"]["gpu"].get<std::string>());
  const auto r = zp::test::run_shell(fmt::format(
      "{0} simulate --model {1} --ds-config {2} --cluster {11} --gpus {3} --rank 0 --seq-len 16 "
      "--attention {4}{5}{8}{10} --executor {9} --executor-workspaces --json > {6} && "
      "{0} compare --predicted {6} --measured {7} --json",
      bin(), c.model, cfg.string(), c.np, c.attention, c.ckpt ? " --activation-checkpointing" : "", predicted.string(),
      measured.string(), c.variants,
      c.np == 1 || c.nccl ? std::string("cuda") : fmt::format("cuda-mpi --ranks-per-gpu {}", c.np), c.cuda_flags,
      cluster.empty() ? std::string("8xH200-141GB-NVSwitch") : cluster), false);
  INFO(r.out);
  REQUIRE(r.status == 0);
  const json cmp = json::parse(r.out);
  CHECK(cmp["exact_memory"] == true);
  CHECK(cmp["exact_comm"] == true);
  const auto& dm = cmp["driver_memory"];
  CHECK(dm["device scratch"]["predicted"] == dm["device scratch"]["measured"]);
  // One process, or ranks sharing the GPU over MPI (held against the sum of theirs), where the
  // GPU's figures cover every part the run has (the H200 has no figure for cuDNN's own memory).
  if ((c.np == 1 || !c.nccl) && !cluster.empty() && !dm.contains("device_used_within_1pct"))
    MESSAGE(name_of(c), ": no device-used prediction on ", cluster, " (a part of this run not measured there)");
  if ((c.np == 1 || !c.nccl) && !cluster.empty() && dm.contains("device_used_within_1pct")) {
    MESSAGE(name_of(c), ": device used predicted ", dm["device_used_predicted"].get<std::int64_t>() >> 20,
            " MiB, measured ", m["driver_memory"]["peak"].get<std::int64_t>() >> 20, " MiB (",
            100.0 * dm["device_used_diff"].get<double>(), "%)");
    CHECK(dm["device_used_within_1pct"] == true);
  }
}

void check(const Case& c) {
  const json cpu = train(c, "cpu");
  const json gpu = train(c, "cuda");
  check_compare(c);
  INFO(name_of(c));
  // NCCL when every rank has its own GPU (or its own NCCL_HOSTID), else MPI through the host.
  CHECK(gpu["config"]["backend"] == (c.np == 1 || c.nccl ? "cuda+nccl" : "cuda+mpi"));
  const auto& lc = cpu["losses"];
  const auto& lg = gpu["losses"];
  REQUIRE(lc.size() == 20);
  REQUIRE(lg.size() == 20);
  double worst = 0.0;
  for (std::size_t i = 0; i < lc.size(); ++i) {
    const double a = lc[i].get<double>(), b = lg[i].get<double>();
    REQUIRE(std::isfinite(b));
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
  }
  MESSAGE(name_of(c), ": worst relative loss difference over 20 steps ", worst, " (first ", lc[0].get<double>(), " / ",
          lg[0].get<double>(), ", last ", lc[19].get<double>(), " / ", lg[19].get<double>(), ")");
  CHECK(worst <= tolerance(c.dtype));
  // Training happened: the loss fell on both.
  CHECK(lg[19].get<double>() < lg[0].get<double>());
  // The program's bytes: the same on both devices.
  CHECK(gpu["memory"]["peak_allocated"] == cpu["memory"]["peak_allocated"]);
  CHECK(gpu["memory"]["at_peak"] == cpu["memory"]["at_peak"]);
  CHECK(gpu["memory"]["reserved_peak"] == cpu["memory"]["reserved_peak"]);
  CHECK(gpu["comm"] == cpu["comm"]);
  // The driver saw the context, the libraries and at least the reserved segments.
  const auto& dm = gpu["driver_memory"];
  CHECK(dm["after_context"].get<std::int64_t>() > 0);
  CHECK(dm["after_init"].get<std::int64_t>() > dm["after_context"].get<std::int64_t>());
  MESSAGE(name_of(c), ": driver memory MiB: context ", dm["after_context"].get<std::int64_t>() >> 20, ", init ",
          dm["after_init"].get<std::int64_t>() >> 20, ", comm ", dm["after_comm"].get<std::int64_t>() >> 20, ", reserved ",
          gpu["memory"]["reserved_peak"].get<std::int64_t>() >> 20, ", scratch ", dm["device_scratch"].get<std::int64_t>() >> 20,
          ", peak ", dm["peak"].get<std::int64_t>() >> 20, ", unexplained ", dm["unexplained_at_peak"].get<std::int64_t>() >> 20);
  if (c.np == 1) {
    // One process on the GPU: the driver's peak is the context, the libraries, NCCL, the
    // program's reserved segments and the device's scratch, within 1%.
    const auto unexplained = dm["unexplained_at_peak"].get<std::int64_t>();
    CHECK(std::abs(static_cast<double>(unexplained)) <= 0.01 * dm["peak"].get<double>());
  }
  if (gpu["config"]["backend"] == "cuda+nccl") {
    CHECK(dm["after_comm"].get<std::int64_t>() >= dm["after_init"].get<std::int64_t>());
    MESSAGE(name_of(c), ": NCCL ", gpu["config"]["nccl_version"].get<std::string>(), " communicator: ",
            (dm["after_comm"].get<std::int64_t>() - dm["after_init"].get<std::int64_t>()) / 1048576, " MiB of device memory");
  }
  CHECK(dm["peak"].get<std::int64_t>() >= dm["after_init"].get<std::int64_t>() + gpu["memory"]["reserved_peak"].get<std::int64_t>());
  // The program's streams ran as CUDA streams, every use of a buffer across them ordered
  // by the program's dependencies (exec/stream_order.hpp).
  CHECK(gpu["stream_waits"]["use"].get<std::int64_t>() == 0);
  CHECK(gpu["stream_waits"] == cpu["stream_waits"]);
  // Every event of the step was timed on the device.
  double sum = 0.0;
  for (const auto& e : gpu["events"]) sum += e["seconds"].get<double>();
  CHECK(sum > 0.0);
}

// The catalog's tiny GPT-2 with one key of its config set to `value`, written as `name` in the
// test folder.
fs::path tiny_gpt2_with(const char* key, std::int64_t value, const char* name) {
  json m = json::parse(std::ifstream(std::string(ZEROPLAN_DATA_DIR) + "/models/catalog/tiny-gpt2.json"));
  m[key] = value;
  const fs::path p = dir() / name;
  std::ofstream(p) << m.dump();
  return p;
}

}  // namespace

TEST_CASE("train --device cuda: the three families at stages 0-3, fp32, against the cpu device") {
  for (const char* m : {"tiny-gpt2", "tiny-bert", "tiny-llama"})
    for (int stage = 0; stage <= 3; ++stage) check({m, stage, "fp32"});
}

TEST_CASE("train --device cuda: bf16 and fp16, sdpa and checkpointing") {
  for (const char* m : {"tiny-gpt2", "tiny-bert", "tiny-llama"})
    for (int stage : {0, 2, 3}) check({m, stage, "bf16"});
  check({"tiny-gpt2", 1, "fp16"});
  check({"tiny-llama", 3, "fp16"});
  check({"tiny-gpt2", 2, "bf16", 2, "sdpa"});
  check({"tiny-llama", 1, "fp32", 1, "sdpa", true});
  // zeroplan's kernel variants: GPT-2's GELU as one op, the loss as one cross entropy on the
  // 16-bit logits (fp16: the loss scale flows through the fused backward).
  check({"tiny-gpt2", 2, "bf16", 2, "sdpa", false, 1, false, " --fused-gelu --fused-loss"});
  check({"tiny-gpt2", 0, "fp16", 2, "eager", false, 1, false, " --fused-gelu --fused-loss"});
  check({"tiny-llama", 3, "bf16", 2, "sdpa", false, 1, false, " --fused-loss"});
  // A vocabulary of odd size (GPT-2's 50257 in small): the fused loss's logits in rows padded
  // to 16 bytes, the head's products and the loss on those strides, the gradient's padding
  // poisoned and never read. (Products this small run whole on the padded strides; the cut
  // plan, from ContextOptions::staged_min_work up, is test_kernels_cuda's.)
  const fs::path odd = tiny_gpt2_with("vocab_size", 257, "tiny-gpt2-v257.json");
  check({odd.string(), 2, "bf16", 2, "sdpa", false, 1, false, " --fused-gelu --fused-loss"});
  check({odd.string(), 0, "fp32", 2, "sdpa", false, 1, false, " --fused-loss"});
}

// --fused-residual-norm: dropout, residual sum and LayerNorm as one op (BERT's two a layer,
// GPT-2's ln_2 and its MLP tail with the next ln_1 or ln_f; under checkpointing ln_2's alone),
// its CUDA kernels against the CPU device's composition of the chain's kernels.
TEST_CASE("train --device cuda --fused-residual-norm: BERT and GPT-2 against the cpu device") {
  check({"tiny-bert", 1, "bf16", 2, "sdpa", false, 1, false, " --fused-residual-norm"});
  check({"tiny-bert", 3, "fp32", 2, "eager", false, 1, false, " --fused-residual-norm"});
  check({"tiny-bert", 0, "fp16", 2, "sdpa", false, 1, false, " --fused-residual-norm"});
  check({"tiny-gpt2", 2, "bf16", 2, "sdpa", false, 1, false, " --fused-gelu --fused-loss --fused-residual-norm"});
  check({"tiny-gpt2", 0, "bf16", 2, "sdpa", true, 1, false, " --fused-residual-norm"});
}

// --fused-mlp: GPT-2's c_fc, GELU and c_proj as one op, the GELU and its derivative as
// cuBLASLt's epilogues, against the CPU device's twin (the GELU of the fp32 sums); with an MLP
// width of 100, where the epilogues refuse the operands, through the chain's kernels (its
// temporary predicted by the same rule: the compare's scratch is exact either way; its GELU is
// of the rounded pre-activation, one 16-bit rounding away from the CPU twin's).
TEST_CASE("train --device cuda --fused-mlp: GPT-2 against the cpu device, epilogues and the chain") {
  check({"tiny-gpt2", 0, "fp32", 2, "eager", false, 1, false, " --fused-mlp"});
  check({"tiny-gpt2", 2, "bf16", 2, "sdpa", false, 1, false, " --fused-gelu --fused-loss --fused-residual-norm --fused-mlp"});
  check({"tiny-gpt2", 3, "fp16", 2, "sdpa", false, 1, false, " --fused-mlp"});
  check({"tiny-gpt2", 1, "bf16", 2, "sdpa", true, 1, false, " --fused-mlp"});
  const fs::path odd = tiny_gpt2_with("n_inner", 100, "tiny-gpt2-inner100.json");
  check({odd.string(), 0, "bf16", 2, "sdpa", false, 1, false, " --fused-mlp"});
}

// cuDNN's flash attention (train --attention-kernel cudnn) in training, held against the CPU
// device's own kernels: its dropout masks are cuDNN's own (tiny GPT-2's and BERT's attention
// dropout 0.1), so the losses agree within the 16-bit tolerance, not to the mask; the program's
// bytes are equal, and the compare with simulate --attention-kernel cudnn is exact, cuDNN's
// backward workspace in the device's scratch included. Causal and not, stages 0-3, checkpointing
// (the forward recomputed through cuDNN) and the Llama's grouped key/value heads (2 for 4, which
// cuDNN takes as they are, with its larger backward workspace).
// That cuDNN ran, and not the own kernels in its place, shows in the compare: the device's
// scratch holds cuDNN's backward workspace, which simulate --attention-kernel cudnn predicts.
TEST_CASE("train --device cuda --attention-kernel cudnn: against the cpu device's own kernels") {
  if (const std::string why = zp::exec::cudnn_attention_refusal(); !why.empty()) {
    MESSAGE("skipped: " << why);
    return;
  }
  const std::string cudnn = " --attention-kernel cudnn";
  check({"tiny-gpt2", 2, "bf16", 2, "sdpa", false, 1, false, " --fused-gelu --fused-loss", "", cudnn});
  check({"tiny-gpt2", 0, "fp16", 2, "sdpa", false, 1, false, "", "", cudnn});
  check({"tiny-bert", 1, "bf16", 2, "sdpa", false, 1, false, "", "", cudnn});
  check({"tiny-llama", 3, "bf16", 2, "sdpa", true, 1, false, "", "", cudnn});
}

// overlap_comm: reductions on the reduction stream, stage 3's fetches on the allgather stream,
// each a CUDA stream of its own, overlapping the compute stream's work.
TEST_CASE("train --device cuda: overlap_comm, the program's streams as CUDA streams") {
  const std::string overlap = R"(, "overlap_comm": true)";
  check({"tiny-gpt2", 2, "bf16", 2, "sdpa", false, 1, false, "", overlap});
  check({"tiny-llama", 3, "bf16", 2, "sdpa", false, 1, false, "", overlap});
  check({"tiny-bert", 1, "fp16", 2, "eager", false, 1, false, "", overlap});
  check({"tiny-gpt2", 2, "fp32", 2, "eager", false, 2, true, "", overlap});
  check({"tiny-llama", 3, "fp32", 2, "eager", false, 2, true, "", overlap});
}

// ZeRO-Offload: the optimizer's partition (and at stage 3 the params' partitions) in host
// memory, its Adam on the CPU (exec/device_placed.hpp), the same losses and device bytes.
TEST_CASE("train --device cuda: offload to the CPU") {
  const std::string opt = R"(, "offload_optimizer": {"device": "cpu"})";
  check({"tiny-gpt2", 2, "bf16", 2, "eager", false, 1, false, "", opt});
  check({"tiny-gpt2", 1, "fp16", 1, "eager", false, 1, false, "", opt});
  check({"tiny-llama", 3, "fp32", 2, "eager", false, 1, false, "", opt + R"(, "offload_param": {"device": "cpu"})"});
  check({"tiny-bert", 2, "fp32", 2, "eager", false, 2, false, "", opt});
}

TEST_CASE("train --device cuda: 2 and 4 ranks on one GPU (host-staged collectives)") {
  for (int stage = 1; stage <= 3; ++stage) check({"tiny-gpt2", stage, "fp32", 2, "eager", false, 2});
  check({"tiny-llama", 3, "bf16", 2, "eager", false, 4});
  check({"tiny-bert", 2, "fp32", 1, "eager", false, 4});
}

TEST_CASE("train --device cuda --comm nccl: ranks on one GPU, each with its own NCCL_HOSTID") {
  // Real NCCL collectives between processes (over loopback sockets, as between hosts):
  // losses as the cpu device's, bytes per collective kind as the program's.
  check({"tiny-gpt2", 2, "fp32", 2, "eager", false, 2, true});
  check({"tiny-llama", 3, "fp32", 2, "eager", false, 2, true});
  check({"tiny-bert", 1, "bf16", 1, "eager", false, 4, true});
}

// Checkpoints on the GPU: the device's state is written through the device a chunk at a
// time, and a run resumed from it continues as if never stopped (the same kernels on the
// same bytes: the losses are bitwise equal); the files are the program's buffers in their
// storage dtype, so the CPU device resumes a GPU checkpoint too (within the dtype's tolerance).
TEST_CASE("train --device cuda: checkpoint and resume") {
  for (const auto& [stage, dtype, np] : {std::tuple{1, "fp32", 1}, std::tuple{3, "bf16", 1}, std::tuple{2, "fp32", 2}}) {
    const Case c{"tiny-gpt2", stage, dtype};
    const std::string precision = c.dtype == "fp32" ? "" : fmt::format(R"("{}": {{"enabled": true}},)", c.dtype);
    const fs::path cfg = dir() / fmt::format("ckpt-s{}-{}.json", stage, dtype);
    std::ofstream(cfg) << fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, {}
 "optimizer": {{"type": "AdamW", "params": {{"lr": 0.002}}}}, "zero_optimization": {{"stage": {}}}}})",
                                      precision, stage);
    const fs::path ck = dir() / fmt::format("ckpt-s{}-{}-n{}", stage, dtype, np);
    fs::remove_all(ck);
    const auto run = [&](const std::string& device, const std::string& extra, const std::string& out) {
      const std::string cmd = fmt::format("{} train --model tiny-gpt2 --ds-config {} --seq-len 16 --quiet --device {} --out {} {}",
                                          bin(), cfg.string(), device, (dir() / out).string(), extra);
      const auto r = zp::test::run_shell(np == 1 ? cmd : mpirun(np, false, cmd));
      INFO(cmd, "\n", r.out);
      REQUIRE(r.status == 0);
      std::ifstream in(dir() / (np == 1 ? out : fs::path(out).stem().string() + ".rank0.json"));
      REQUIRE(in.good());
      return json::parse(in)["losses"].get<std::vector<double>>();
    };
    const std::string tag = fmt::format("ckpt-s{}-{}-n{}", stage, dtype, np);
    INFO(tag);
    const auto full = run("cuda", "--steps 6", tag + "-full.json");
    run("cuda", fmt::format("--steps 3 --checkpoint-dir {}", ck.string()), tag + "-first.json");
    CHECK(fs::exists(ck / "latest"));
    CHECK(fs::exists(ck / "global_step3" / fmt::format("zero_pp_rank_{}_mp_rank_00_optim_states.zpck", np - 1)));
    const auto resumed = run("cuda", fmt::format("--steps 6 --checkpoint-dir {} --resume", ck.string()), tag + "-resumed.json");
    REQUIRE(full.size() == 6);
    CHECK(resumed == full);
    // The CPU device resumes the GPU's step-6 checkpoint and trains on.
    const auto cont_gpu = run("cuda", fmt::format("--steps 8 --checkpoint-dir {} --resume", ck.string()), tag + "-gpu8.json");
    std::ofstream(ck / "latest", std::ios::trunc) << "global_step6";  // back to step 6, for the CPU
    const auto cont_cpu = run("cpu", fmt::format("--steps 8 --checkpoint-dir {} --resume", ck.string()), tag + "-cpu8.json");
    REQUIRE(cont_gpu.size() == 8);
    REQUIRE(cont_cpu.size() == 8);
    for (std::size_t i = 6; i < 8; ++i) CHECK(std::abs(cont_cpu[i] - cont_gpu[i]) <= tolerance(c.dtype) * std::abs(cont_gpu[i]));
  }
}

// collectives --measure through zeroplan's NCCL communicator between two ranks (on the one
// GPU, each its own NCCL_HOSTID: NCCL over loopback sockets), beside the model's prediction.
TEST_CASE("collectives --measure --device cuda: a sweep through the NCCL communicator") {
  const fs::path file = dir() / "sweep_nccl.txt";
  fs::remove(file);
  const auto r = zp::test::run_shell(
      mpirun(2, true, fmt::format("{} collectives --measure --device cuda --cluster 8xH200-141GB-NVSwitch --min 1K --max 4M "
                                  "--factor 4 --iters 5 --warmup 2 --out {} --json",
                                  bin(), file.string())),
      false);
  INFO(r.out);
  REQUIRE(r.status == 0);
  const json m = json::parse(r.out);
  CHECK(m["backend"] == "nccl");
  CHECK(m["ranks"] == 2);
  CHECK(m["nodes"] == 1);  // one host, however many NCCL_HOSTIDs
  cudaDeviceProp prop{};  // the GPU the ranks run on, named as the driver names it
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(m["gpu"].get<std::string>() == std::string(prop.name));
  for (const auto& b : m["collectives"]) {
    CHECK(b["rows"].size() == 7);  // 1K, 4K, ..., 4M
    for (const auto& row : b["rows"]) CHECK(row["busbw_gbps"].get<double>() > 0);
    MESSAGE(b["collective"].get<std::string>(), ": ", b["rows"].back().dump());
  }
  CHECK(fs::exists(file));
}

// A peer stopped (SIGSTOP: hung) or killed mid-training ends every rank, with one line
// naming the rank and the collective for the hung peer, within the timeout. Which collective
// rank 0 is waiting in depends on where the peer stopped (the step's scalar all-reduce, or the
// parameters' all-gather after it: both seen on the H200), so the line is checked for the rank,
// the group and the timeout, with the collective's name and size between them.
TEST_CASE("train --device cuda --comm nccl: a hung or dead peer ends the job") {
  const fs::path cfg = dir() / "fault.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})";
  for (const std::string fault : {"STOP", "KILL"})
    zp::test::check_peer_fault(
        zp::test::fault_peer(mpirun_prefix(2, true),
                             fmt::format("{}{} train --model tiny-gpt2 --ds-config {} --steps 1000000 --seq-len 16 "
                                         "--device cuda --comm nccl --comm-timeout 5",
                                         kRankHostId, bin(), cfg.string()),
                             fault, dir() / fmt::format("fault-{}.log", fault)),
        fault,
        {"zeroplan: rank 0: NCCL ", " B (", " on group [0,1] did not complete within 5 s of the stream reaching it"}, 5.0);
}

TEST_CASE("train --device cuda: bad input") {
  {  // NCCL refuses two ranks on one GPU: said before NCCL is asked
    const auto r = zp::test::run_shell(mpirun(2, false, fmt::format("{} train --model tiny-gpt2 --device cuda --comm nccl --steps 1", bin())));
    CHECK(r.status == 2);
    CHECK(r.out.find("--comm") != std::string::npos);
    CHECK(r.out.find("share GPU") != std::string::npos);
  }
  const auto r = zp::test::run_shell(fmt::format("{} train --model tiny-gpt2 --device tpu --steps 1", bin()));
  CHECK(r.status == 2);
  CHECK(r.out.find("--device") != std::string::npos);
  CHECK(r.out.find("cpu or cuda") != std::string::npos);
}
