#include "exec/trainer.hpp"

#include "exec/lr_schedule.hpp"

#include <sys/resource.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"
#include "exec/allocator.hpp"
#include "exec/checkpoint.hpp"
#include "exec/data.hpp"
#include "exec/interpreter.hpp"
#include "kernels/cpu/isa.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"
#include "exec/device_cuda.hpp"
#include "exec/device_placed.hpp"
#include "exec/safetensors.hpp"
#include "sim/device.hpp"
#include "sim/engine.hpp"
#include "sim/memory.hpp"
#include "sim/trace.hpp"
#include "zero/ds_config.hpp"
#include "zero/lower.hpp"

namespace zp::exec {

using nlohmann::json;

std::string rank_path(const std::string& out, int rank, int world) {
  if (world == 1) return out;
  std::filesystem::path p(out);
  const std::string ext = p.has_extension() ? p.extension().string() : std::string(".json");
  return (p.parent_path() / fmt::format("{}.rank{}{}", p.stem().string(), rank, ext)).string();
}

namespace {

// A hang between a step's collectives and its report, on purpose, for the failure tests
// (tests/test_failure_ranks.cpp): ZEROPLAN_TEST_STOP_BEFORE_REPORT=RANK:STEP makes that rank
// stop itself (SIGSTOP) there, with its sockets open, as a peer that hangs would.
void stop_for_test(int rank, std::int64_t step) {
  const char* v = std::getenv("ZEROPLAN_TEST_STOP_BEFORE_REPORT");
  int r = -1;
  long long k = -1;
  if (v != nullptr && std::sscanf(v, "%d:%lld", &r, &k) == 2 && r == rank && k == step) std::raise(SIGSTOP);
}

json categories(const std::array<Bytes, zero::kNumCategories>& c) {
  json j = json::object();
  for (int i = 0; i < zero::kNumCategories; ++i) j[zero::category_name(static_cast<zero::Category>(i))] = c[static_cast<std::size_t>(i)].v;
  return j;
}

std::int64_t rss_peak_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::int64_t>(ru.ru_maxrss) * 1024;
}

// Everything a rank reads and checks before training.
struct Setup {
  zero::DsConfig cfg;
  zero::Batch batch;
  std::unique_ptr<models::OpGraph> graph;
  zero::Program prog;
  LrSchedule schedule;
  std::unique_ptr<DataSource> data;
  CheckpointMeta meta;
  std::string out;                 // this rank's --out path ("" for none)
  Bytes need{0};                   // predicted host bytes of this rank (device + host categories)
  std::string micro_batch_key;     // where the micro-batch came from, for messages
  std::map<std::string, NamedTensor> init;  // --init-weights
};

std::string random_hex() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}


// Bytes this process may still allocate: MemAvailable, bounded by the cgroup's limit when
// one is set (containers); -1 when unknown.
std::int64_t available_memory() {
  std::int64_t avail = -1;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  std::int64_t kb = 0;
  std::string unit;
  while (mi >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  std::ifstream lim("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::string l;
  std::int64_t c = 0;
  if (lim >> l && l != "max" && cur >> c) {
    try {
      const std::int64_t room = std::stoll(l) - c;
      avail = avail < 0 ? room : std::min(avail, room);
    } catch (const std::exception&) {
    }
  }
  return avail;
}

std::string gb(std::int64_t b) { return fmt::format("{:.1f} GB", static_cast<double>(b) / 1e9); }

// Each rank's "refused" of the gathered agreement documents.
std::vector<std::string> refusals_of(const std::vector<json>& all) {
  std::vector<std::string> r;
  for (const auto& a : all) r.push_back(a["refused"].get<std::string>());
  return r;
}

// Every host's ranks together must fit in the memory that host has available: a run that
// cannot is refused before it allocates (the prediction is the program's own memory
// replay). Every rank sees every host, so all of them refuse alike.
void check_host_memory(const std::vector<json>& all, const Setup& s) {
  std::map<std::string, std::tuple<std::int64_t, std::int64_t, int>> hosts;  // need, available, ranks
  for (const auto& a : all) {
    auto [it, fresh] = hosts.try_emplace(a["host"].get<std::string>(), 0, -1, 0);
    auto& [need, avail, ranks] = it->second;
    need += a["need"].get<std::int64_t>();
    ++ranks;
    const std::int64_t v = a["available"].get<std::int64_t>();
    if (v >= 0) avail = avail < 0 ? v : std::min(avail, v);
  }
  for (const auto& [host, h] : hosts) {
    const auto& [need, avail, ranks] = h;
    if (avail < 0 || need <= avail) continue;
    throw InputError(s.micro_batch_key, "",
                     fmt::format("the predicted peak memory of {} per rank ({} for the {} rank{} on host {}) exceeds "
                                 "the {} available there; lower the micro-batch, use --activation-checkpointing, or "
                                 "run fewer ranks per host",
                                 gb(need / ranks), gb(need), ranks, ranks == 1 ? "" : "s", host, gb(avail)));
  }
}

// The checkpoint folder exists (or is created), is a folder and takes new files: found
// before training, not at the first save.
void check_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec, ec2;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir, ec2))
    throw InputError(dir, "--checkpoint-dir", fmt::format("cannot create the checkpoint folder: {}", ec.message()));
  if (!fs::is_directory(dir, ec2)) throw InputError(dir, "--checkpoint-dir", "is not a folder");
  io::AtomicWriter probe((fs::path(dir) / "latest").string(), "--checkpoint-dir");  // removed unwritten
}

// Whether the ranks' checkpoint files (each already checked by its rank) belong to one
// step of one run; "" when they do, else one line saying what differs and where.
std::string checkpoint_disagreement(const std::vector<json>& states, const std::string& dir) {
  const auto differs = [&](const char* key) {
    for (const auto& st : states)
      if (st[key] != states.front()[key]) return true;
    return false;
  };
  const auto listing = [&](const char* key) {
    std::string s;
    for (std::size_t r = 0; r < states.size(); ++r)
      s += fmt::format("{}rank {} {}", r ? ", " : "", r,
                       states[r][key].is_string() ? zp::json::printable(states[r][key].get<std::string>())
                                                  : zp::json::printable(states[r][key].dump()));
    return s;
  };
  if (differs("tag") || differs("step"))
    return fmt::format("{}: the ranks would resume different steps ({}); every rank must resume the same step",
                       dir, listing("step"));
  if (differs("run_id") || differs("seed"))
    return fmt::format("{}/{}: the ranks' files come from different runs (run ids: {}; seeds: {}): files of two runs "
                       "were mixed",
                       dir, states.front()["tag"].get<std::string>(), listing("run_id"), listing("seed"));
  return "";
}

// Reads and checks everything this rank needs, in place (the data source keeps a reference
// to the graph). Any problem → InputError.
void prepare(Setup& s, const TrainOptions& opt, int N, int rank) {
  kernels::cpu::gemm_isa();  // ZEROPLAN_CPU_ISA is checked here
  const auto mcfg = models::load_model(opt.model);
  zero::DsConfig& cfg = s.cfg;
  if (opt.ds_config.empty()) {
    // No config: DeepSpeed's defaults, with one sample per rank per micro-step (as simulate).
    cfg = zero::default_ds_config();
    cfg.train_micro_batch_size_per_gpu = 1;
  } else {
    cfg = zero::load_ds_config(opt.ds_config);
  }
  s.micro_batch_key = opt.ds_config.empty() ? std::string("--micro-batch") : opt.ds_config + ": train_micro_batch_size_per_gpu";
  if (opt.micro_batch) {
    if (*opt.micro_batch < 1) throw InputError("--micro-batch", "", fmt::format("must be >= 1, got {}", *opt.micro_batch));
    cfg.train_micro_batch_size_per_gpu = *opt.micro_batch;
    if (cfg.train_batch_size) cfg.gradient_accumulation_steps.reset();
    s.micro_batch_key = fmt::format("--micro-batch {}", *opt.micro_batch);
  }
  if (const auto note = zero::apply_module_dtype(cfg, mcfg.torch_dtype, mcfg.source, mcfg.torch_dtype_key);
      !note.empty() && rank == 0)
    std::fprintf(stderr, "warning: %s\n", note.c_str());
  s.batch = zero::resolve_batch(cfg, N);
  models::GraphOptions go;
  go.micro_batch = s.batch.micro_batch;
  go.seq_len = opt.seq_len;
  go.act_dtype = cfg.model_dtype();
  // --attention when given, else the config.json's attn_implementation, else the default.
  const models::AttentionChoice att = models::choose_attention(mcfg, opt.attention);
  go.attention = att.attention;
  if (!att.note.empty() && rank == 0) std::fprintf(stderr, "warning: %s\n", att.note.c_str());
  if (!opt.transformers.empty()) go.transformers = models::parse_transformers("--transformers", "", opt.transformers);
  go.gradient_checkpointing = opt.activation_checkpointing;
  go.variants = opt.variants;
  if (rank == 0)
    if (const std::string note = models::inert_variants_note(mcfg, go); !note.empty())
      std::fprintf(stderr, "warning: %s\n", note.c_str());
  s.graph = std::make_unique<models::OpGraph>(models::build_graph(mcfg, go));
  const models::OpGraph& g = *s.graph;
  zero::LowerOptions lo;
  lo.world_size = N;
  lo.rank = rank;
  lo.activation_checkpointing = opt.activation_checkpointing;
  lo.keep_output = opt.keep_output;
  lo.cublas_workspace = opt.cublas_workspace;
  lo.cublaslt_workspace = opt.cublaslt_workspace;
  s.prog = zero::expand(zero::lower(g, cfg, s.batch, lo));  // every micro-step: the executor runs each
  s.prog.validate();
  if (const auto why = unsupported_reason(g, s.prog, cfg); !why.empty())
    throw InputError(opt.ds_config.empty() ? opt.model : opt.ds_config, "", why);
  if (opt.device != "cpu" && opt.device != "cuda")
    throw InputError("--device", "", fmt::format("must be cpu or cuda, got '{}'", opt.device));
  if (opt.device == "cuda") {
    if (!cuda_device_built()) throw InputError("--device", "", "cuda: this zeroplan was built without CUDA (no toolkit at configure time)");
  }
  if (!opt.init_weights.empty()) {
    s.init = read_safetensors(opt.init_weights);
    for (const auto& prm : g.params) {
      const auto it = s.init.find(prm.name);
      if (it == s.init.end())
        throw InputError(opt.init_weights, prm.name, fmt::format("--init-weights: the model's parameter is not in the file ({} tensors in it)", s.init.size()));
      if (it->second.shape != prm.shape)
        throw InputError(opt.init_weights, prm.name, fmt::format("--init-weights: shape [{}] in the file, the model's is [{}]",
                                                                 fmt::join(it->second.shape, ", "), fmt::join(prm.shape, ", ")));
    }
  }
  if (!opt.save_weights.empty() && s.prog.info.stage == 3 && N > 1)
    throw InputError("--save-weights", "", "stage 3 with several ranks holds each parameter in shards; gathering them is not written yet (run 1 rank, or stages 0-2)");
  if (opt.allow_tf32 && opt.device != "cuda") throw InputError("--allow-tf32", "", "needs --device cuda");
  if (opt.attention_kernel != "own" && opt.attention_kernel != "cudnn")
    throw InputError("--attention-kernel", "", fmt::format("must be own or cudnn, got '{}'", opt.attention_kernel));
  if (opt.attention_kernel == "cudnn" && opt.device != "cuda")
    throw InputError("--attention-kernel", "", "cudnn needs --device cuda");
  if (opt.attention_kernel == "cudnn")
    if (const std::string why = cudnn_attention_refusal(); !why.empty())
      throw InputError("--attention-kernel", "", "cudnn: " + why);
  if (opt.comm != "auto" && opt.comm != "nccl" && opt.comm != "mpi")
    throw InputError("--comm", "", fmt::format("must be auto, nccl or mpi, got '{}'", opt.comm));
  if (opt.comm == "nccl" && opt.device != "cuda") throw InputError("--comm", "", "nccl needs --device cuda");
  if (opt.comm == "nccl" && !nccl_built())
    throw InputError("--comm", "", "nccl: this zeroplan was built without NCCL (nccl.h not found at configure time); use --comm mpi");
  if (!(opt.comm_timeout > 0.0)) throw InputError("--comm-timeout", "", fmt::format("must be > 0 seconds, got {}", opt.comm_timeout));
  if (opt.steps < 1) throw InputError("--steps", "", fmt::format("must be >= 1, got {}", opt.steps));
  s.schedule = parse_lr_schedule(cfg);
  s.data = std::make_unique<DataSource>(opt.data, g, opt.seed);
  if (opt.resume && opt.checkpoint_dir.empty()) throw InputError("--resume", "", "needs --checkpoint-dir");
  if (opt.resume && !has_checkpoint(opt.checkpoint_dir))
    throw InputError(opt.checkpoint_dir, "latest", "--resume: no checkpoint to resume from");
  if (opt.save_every < 0) throw InputError("--save-every", "", fmt::format("must be >= 0, got {}", opt.save_every));

  // The run's identity: the model and ds_config as parsed (canonical JSON, so spacing and
  // key order do not matter), recorded in every checkpoint file.
  CheckpointMeta& meta = s.meta;
  meta.model = g.cfg.name;
  if (!opt.ds_config.empty()) {
    meta.config = zp::json::canonical(zp::json::parse_file(opt.ds_config));
    meta.config_digest = zp::json::digest(meta.config);
  }
  meta.model_config = zp::json::canonical(zp::json::parse_file(mcfg.source));
  meta.model_digest = zp::json::digest(meta.model_config);
  meta.stage = s.prog.info.stage;
  meta.world_size = N;
  meta.rank = rank;
  meta.seed = opt.seed;

  // Outputs: never one of the inputs, writable now (a temporary is created and removed;
  // the file itself is not touched before the run ends).
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"--ds-config", opt.ds_config}, {"--model", mcfg.source}, {"--data", opt.data == "synthetic" ? "" : opt.data},
      {"--init-weights", opt.init_weights}};
  s.out = opt.out.empty() ? std::string() : rank_path(opt.out, rank, N);
  const std::string trace = opt.trace.empty() ? std::string() : rank_path(opt.trace, rank, N);
  for (const auto& [flag, path] : {std::pair{std::string("--out"), s.out}, std::pair{std::string("--trace"), trace},
                                   std::pair{std::string("--save-weights"), rank == 0 ? opt.save_weights : std::string()},
                                   std::pair{std::string("--save-batch"), rank == 0 ? opt.save_batch : std::string()}}) {
    if (path.empty()) continue;
    io::refuse_same_file(path, flag, inputs);
    io::AtomicWriter probe(path, flag);
  }
  if (!s.out.empty() && !trace.empty()) {
    io::refuse_same_file(trace, "--trace", {{"--out", s.out}});
    std::error_code ec;
    if (std::filesystem::weakly_canonical(trace, ec) == std::filesystem::weakly_canonical(s.out, ec))
      throw InputError(trace, "--trace", "is the same path as --out; give two files");
  }
  if (!opt.checkpoint_dir.empty()) check_checkpoint_dir(opt.checkpoint_dir);

  // What this rank will hold at its peak, from the program's own memory replay.
  const auto pred = sim::replay_memory(s.prog, sim::DeviceSpec{}, sim::MemoryOptions{false, false});
  s.need = Bytes{pred.peak_allocated.v + pred.peak_host.v};
  if (opt.memory_limit.v > 0) s.need = Bytes{std::min(s.need.v, opt.memory_limit.v + pred.peak_host.v)};
}

}  // namespace

json train(const TrainOptions& opt, Comm& boot) {
  const int N = boot.size(), rank = boot.rank();
  // ---- inputs: every rank reads and checks the same; a refusal on any rank is agreed on
  // (one gather) before anything is allocated, so no rank is left waiting for another.
  auto setup = std::make_unique<Setup>();
  std::string refused;
  std::unique_ptr<Device> device;  // nullptr: the CPU device
  try {
    prepare(*setup, opt, N, rank);
  } catch (const InputError& e) {
    refused = e.what();
  }
  if (refused.empty() && opt.device == "cuda") {
    try {
      CudaDeviceOptions co;
      co.local_rank = local_rank(rank);
      co.allow_tf32 = opt.allow_tf32;
      co.cudnn_attention = opt.attention_kernel == "cudnn";
      device = make_cuda_device(co);
    } catch (const std::runtime_error& e) {  // no usable GPU: refused like bad input, on every rank
      refused = e.what();
    }
  }
  const char* hostid = std::getenv("NCCL_HOSTID");
  json mine = {{"refused", refused}, {"host", host_name()}, {"run_id", random_hex()},
               {"need", refused.empty() ? setup->need.v : 0}, {"available", available_memory()},
               {"gpu", device ? cuda_bus_id(*device) : ""}, {"nccl_hostid", hostid ? hostid : ""}};
  std::vector<json> all;
  for (const auto& t : boot.gather_for_report(mine.dump())) all.push_back(json::parse(t));
  stop_if_refused(refusals_of(all), rank, "");
  check_host_memory(all, *setup);

  // ---- the communicator: NCCL on the GPUs when every rank has its own (NCCL refuses
  // two ranks on one device unless each names its own NCCL_HOSTID), else MPI (staged
  // through host memory on GPUs).
  std::unique_ptr<Comm> nccl;
  if (device && opt.comm != "mpi") {
    std::string shared;
    for (std::size_t a = 0; a < all.size() && shared.empty(); ++a)
      for (std::size_t b = a + 1; b < all.size() && shared.empty(); ++b)
        if (all[a]["host"] == all[b]["host"] && all[a]["gpu"] == all[b]["gpu"] && all[a]["nccl_hostid"] == all[b]["nccl_hostid"])
          shared = fmt::format("ranks {} and {} share GPU {} on {}", a, b, all[a]["gpu"].get<std::string>(),
                               all[a]["host"].get<std::string>());
    if (opt.comm == "nccl" && !shared.empty())
      throw InputError("--comm", "", fmt::format("nccl: {}; NCCL needs one GPU per rank: use --comm mpi (staged through "
                                                 "host memory), or give each rank its own GPU", shared));
    if (shared.empty() && nccl_built()) {
      try {
        NcclOptions no;
        no.timeout_s = opt.comm_timeout;
        nccl = make_nccl_comm(boot, *device, setup->prog.groups, no);
      } catch (const std::exception& e) {  // a peer may be inside the same init: end them all
        boot.abort(fmt::format("--comm nccl: {}", e.what()));
      }
      mark_after_comm(device.get());
    }
  }
  Comm& comm = nccl ? *nccl : boot;
  // The ranks on this rank's GPU (itself included): the driver's figures are theirs together.
  const auto ranks_on_gpu = std::count_if(all.begin(), all.end(), [&](const json& a) {
    return a["host"] == mine["host"] && a["gpu"] == mine["gpu"];
  });
  // The MPI communicator bounds its calls too when NCCL carries the program's collectives: the
  // step's reports (the loss) and the checkpoints' barriers still go through it.
  boot.set_timeout(opt.comm_timeout);

  Setup& S = *setup;
  const models::OpGraph& g = *S.graph;
  const zero::DsConfig& cfg = S.cfg;
  const zero::Batch& batch = S.batch;
  const zero::Program& prog = S.prog;
  const LrSchedule& schedule = S.schedule;
  const DataSource& data = *S.data;
  CheckpointMeta& meta = S.meta;
  meta.run_id = all.front()["run_id"].get<std::string>();  // rank 0's draw names the run
  const std::string& out = S.out;

  // ---- run (from here a failure on one rank must end every rank)
  // A program with host buffers (offload) on a GPU: each call goes where its operands
  // live, the optimizer of the offloaded partition runs on the CPU (exec/device_placed.hpp).
  std::unique_ptr<PlacedDevice> placed;
  if (device && runs_placed(prog)) placed = std::make_unique<PlacedDevice>(*device);
  Device* run_on = placed ? static_cast<Device*>(placed.get()) : device.get();
  TrackingAllocator mem(prog.buffers.size(), opt.memory_limit, run_on);
  Interpreter interp(g, prog, cfg, comm, mem, opt.seed, run_on);
  if (!S.init.empty()) interp.set_initial_weights(&S.init);
  json losses = json::array(), norms = json::array(), scales = json::array(), skipped = json::array();
  json lrs = json::array();  // the learning rate each step ran with
  std::vector<double> event_sum(prog.events.size(), 0.0);
  double timed = 0.0;
  sim::PhaseTimes phase_sum;  // Σ over the timed steps
  std::int64_t timed_steps = 0;
  std::int64_t first = 1;
  // The measurements document (also written, with "error", when a run fails midway).
  auto measurements = [&](const std::string& error) {
    const std::int64_t done = std::max<std::int64_t>(1, static_cast<std::int64_t>(losses.size()) - (first - 1));
    const auto& mr = mem.report();
    const auto& cc = comm.counters();
    json doc;
    if (!error.empty()) doc["error"] = error;  // a failed run still reports what it measured
    doc["config"] = {{"model", g.cfg.name},
                     {"ds_config", opt.ds_config},
                     {"ds_config_json", meta.config.is_object() ? meta.config : json::object()},
                     {"stage", prog.info.stage},
                     {"world_size", N},
                     {"rank", rank},
                     {"micro_batch", batch.micro_batch},
                     {"gas", batch.gas},
                     {"seq_len", g.opt.seq_len},
                     {"steps", opt.steps},
                     {"seed", opt.seed},
                     {"data", opt.data},
                     {"activation_checkpointing", opt.activation_checkpointing},
                     {"attention", models::attention_name(g.opt.attention)},
                     {"backend", fmt::format("{}+{}", device ? "cuda" : "cpu", comm.backend())},
                     // PyTorch's workspaces the program holds (train --workspaces-of)
                     {"library_workspace_bytes", zero::library_workspace_bytes(prog).v},
                     {"nccl_version", nccl ? nccl_version() : ""},
                     {"allow_tf32", opt.allow_tf32},
                     {"attention_kernel", opt.attention_kernel},
                     {"cpu_gemm", kernels::cpu::isa_name(kernels::cpu::gemm_isa())}};
    for (const models::KernelVariantInfo& k : models::kernel_variants())
      doc["config"][k.key] = g.opt.variants.*k.member;
    if (device) {
      // What the driver saw in use on the GPU (the context, the libraries, the program's
      // segments and the device's own scratch), beside the program's reserved bytes.
      const DriverMemory dm = driver_memory(device.get());
      doc["config"]["gpu"] = dm.gpu;
      doc["config"]["ranks_on_gpu"] = ranks_on_gpu;  // the driver's figures are this GPU's, all of them
      doc["driver_memory"] = {{"total", dm.total.v},
                              {"after_context", dm.after_context.v},
                              {"after_init", dm.after_init.v},
                              {"after_comm", dm.after_comm.v},
                              {"peak", dm.peak.v},
                              {"device_scratch", dm.device_scratch.v},
                              {"cublaslt_loaded", dm.cublaslt_loaded.v},
                              {"cudnn", dm.cudnn.v},
                              {"outside_program_at_peak", dm.peak.v - mr.reserved_peak.v},
                              // what the parts above do not explain: driver granularity,
                              // NCCL's lazily made buffers, memory of other processes
                              {"unexplained_at_peak", dm.peak.v - mr.reserved_peak.v - dm.device_scratch.v -
                                                          dm.cublaslt_loaded.v - dm.cudnn.v -
                                                          std::max(dm.after_init.v, dm.after_comm.v)}};
    }
    // A model given as a config.json (not a catalogue name): its config, so that the file can be
    // read back where that path does not exist (calibrate --train-out on another machine).
    if (std::error_code ec; !opt.model.empty() && std::filesystem::exists(opt.model, ec)) {
      const std::filesystem::path p = std::filesystem::is_directory(opt.model, ec)
                                          ? std::filesystem::path(opt.model) / "config.json"
                                          : std::filesystem::path(opt.model);
      try {
        doc["config"]["model_config_json"] = zp::json::parse_file(p.string());
      } catch (const std::exception&) {
        // the run read it at start-up; a file changed since is not worth failing the report for
      }
    }
    doc["losses"] = losses;
    doc["grad_norms"] = norms;
    doc["loss_scales"] = scales;   // fp16 dynamic loss scale per step (1 otherwise)
    doc["skipped_steps"] = skipped;  // the update was skipped after an overflow (fp16; bf16 where DeepSpeed checks)
    doc["learning_rates"] = lrs;     // per step (the ds_config's scheduler)
    const double per_step = timed_steps > 0 ? timed / static_cast<double>(timed_steps) : 0.0;
    doc["step_seconds"] = per_step;
    doc["samples_per_s"] = per_step > 0 ? static_cast<double>(batch.train_batch_size) / per_step : 0.0;
    doc["memory"] = {{"peak_allocated", mr.peak_allocated.v},
                     {"peak_event", mr.peak_event >= 0 ? prog.event_name(mr.peak_event) : ""},
                     {"at_peak", categories(mr.at_peak)},
                     {"category_peak", categories(mr.category_peak)},
                     {"reserved_peak", mr.reserved_peak.v},
                     {"peak_host", mr.peak_host.v},
                     {"rss_peak", rss_peak_bytes()}};
    json by_kind = json::object();
    std::int64_t total = 0;
    for (int k = 0; k < zero::kNumCollKinds; ++k) {
      const auto i = static_cast<std::size_t>(k);
      if (cc.calls[i] == 0) continue;
      by_kind[zero::coll_kind_name(static_cast<zero::CollKind>(k))] = {{"bytes_per_step", cc.bytes_sent[i] / done},
                                                                     {"calls_per_step", cc.calls[i] / done}};
      total += cc.bytes_sent[i];
    }
    doc["comm"] = {{"bytes_per_rank", total / done}, {"by_kind", by_kind}};
    json events = json::array();
    for (std::size_t i = static_cast<std::size_t>(prog.step_begin); i < prog.events.size(); ++i) {
      json ev = {{"id", prog.event_name(static_cast<zero::EventId>(i))},
                 {"start", interp.event_starts()[i]},
                 {"seconds", timed_steps > 0 ? event_sum[i] / static_cast<double>(timed_steps) : 0.0}};
      // Collectives: the bytes this rank sent in the last step, as the backend counted them.
      if (prog.events[i].kind == zero::EventKind::collective) ev["bytes_sent"] = interp.event_bytes_sent()[i];
      events.push_back(std::move(ev));
    }
    doc["events"] = events;
    // The cross-stream waits a device with one stream per program stream needed over the run
    // (exec/stream_order.hpp): "use" counts buffer uses the program's dependencies left
    // unordered (0 for a program whose dependencies are complete).
    const auto& sw = interp.stream_waits();
    doc["stream_waits"] = {{"dependency", sw.dep_waits}, {"use", sw.touch_waits}, {"reuse", sw.reuse_waits},
                           {"steps", static_cast<std::int64_t>(losses.size()) - (first - 1)},
                           {"unordered_uses", sw.unordered}};
    // Seconds per phase of one step: the sum of its events' measured times (the CPU device
    // runs events one at a time; on a GPU events of different streams may overlap, and a
    // phase's sum then counts the overlapped time once per stream).
    json phases = json::object();
    for (std::size_t i = static_cast<std::size_t>(prog.step_begin); i < prog.events.size(); ++i) {
      const char* ph = zero::phase_name(prog.events[i].phase);
      const double v = timed_steps > 0 ? event_sum[i] / static_cast<double>(timed_steps) : 0.0;
      phases[ph] = phases.value(ph, 0.0) + v;
    }
    doc["phases"] = phases;
    // The same step by the simulator's phase definitions (sim::PhaseTimes: forward and
    // backward intervals per micro-step, the step after the last, the whole makespan), so
    // that compare lays it beside the prediction phase by phase; mean over the timed steps.
    const double per = 1.0 / static_cast<double>(std::max<std::int64_t>(1, timed_steps));
    doc["phase_times"] = {{"forward", phase_sum.forward.v * per},
                          {"backward", phase_sum.backward.v * per},
                          {"backward_exposed_comm", phase_sum.backward_allreduce.v * per},
                          {"step", phase_sum.step.v * per},
                          {"iteration", phase_sum.iteration.v * per}};
    return doc;
  };
  auto write_partial = [&](const std::string& error) {
    if (out.empty()) return;
    try {
      io::write_atomic(out, measurements(error).dump(1) + "\n", "--out");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zeroplan: rank %d: %s\n", rank, e.what());
    }
  };

  auto allocation_failed = [&](const AllocationFailed& e) {
    const auto pred = sim::replay_memory(prog, sim::DeviceSpec{}, sim::MemoryOptions{false, false});
    comm.abort(fmt::format("{} (predicted peak for this program: {} B)", e.what(), pred.peak_allocated.v));
  };
  try {
    interp.prologue();
  } catch (const AllocationFailed& e) {
    write_partial(e.what());
    allocation_failed(e);
  }
  if (opt.resume) {
    // Each rank checks its own files (structure, checksums, that they hold their folder's
    // step, this run's model, config and world size); then every rank checks that all
    // ranks resume the same step of the same run, before any collective of training.
    interp.create_first_step_buffers();  // the optimizer states the checkpoint restores
    const auto model = interp.checkpoint_blobs(CheckpointPart::model_states);
    const auto optim = interp.checkpoint_blobs(CheckpointPart::optim_states);
    CheckpointMeta got;
    std::string ck_refused, tag;
    try {
      tag = latest_tag(opt.checkpoint_dir);
      got = load_checkpoint(opt.checkpoint_dir, meta, model, optim, tag);
    } catch (const InputError& e) {
      ck_refused = e.what();
    }
    const json state = {{"refused", ck_refused}, {"tag", tag},        {"step", got.step},
                        {"run_id", got.run_id},  {"seed", got.seed}};
    std::vector<json> states;
    for (const auto& t : comm.gather_for_report(state.dump())) states.push_back(json::parse(t));
    stop_if_refused(refusals_of(states), rank, "the checkpoint");
    if (const auto why = checkpoint_disagreement(states, opt.checkpoint_dir); !why.empty()) {
      std::fprintf(stderr, "zeroplan: rank %d: %s\n", rank, why.c_str());
      throw RankRefused("checkpoint refused");
    }
    if (!got.run_id.empty()) meta.run_id = got.run_id;  // a resumed run keeps its identity
    first = got.step + 1;
    if (got.extra.contains("losses")) losses = got.extra["losses"];
    if (got.extra.contains("grad_norms")) norms = got.extra["grad_norms"];
    if (got.extra.contains("loss_scales")) scales = got.extra["loss_scales"];
    if (got.extra.contains("skipped_steps")) skipped = got.extra["skipped_steps"];
    if (got.extra.contains("learning_rates")) lrs = got.extra["learning_rates"];
    interp.set_scaler_state(got.extra.at("scaler"));
    if (rank == 0 && !opt.quiet) std::printf("resumed from %s at step %lld\n", opt.checkpoint_dir.c_str(), static_cast<long long>(got.step));
  }
  auto save = [&](std::int64_t s) {
    meta.step = s;
    meta.extra = {{"losses", losses}, {"grad_norms", norms}, {"loss_scales", scales}, {"skipped_steps", skipped},
                  {"learning_rates", lrs}, {"scaler", interp.scaler_state()}};
    save_checkpoint(opt.checkpoint_dir, meta, interp.checkpoint_blobs(CheckpointPart::model_states),
                    interp.checkpoint_blobs(CheckpointPart::optim_states));
    comm.barrier();  // every rank's files are in place before `latest` names them
    if (rank == 0) write_latest(opt.checkpoint_dir, s);
  };
  try {
    comm.barrier();
    for (std::int64_t s = first; s <= opt.steps; ++s) {
      std::vector<MicroBatch> mbs;
      for (int m = 0; m < batch.gas; ++m) mbs.push_back(data.batch(s, m, static_cast<int>(batch.gas), rank, N));
      // The scheduler and the optimizer advance only on applied updates (not overflows).
      std::int64_t applied = 0;
      for (const auto& k : skipped) applied += k.get<bool>() ? 0 : 1;
      const double lr = schedule.lr_for(applied);
      interp.set_update(lr, applied + 1, schedule.betas_for(applied));
      lrs.push_back(lr);
      if (s == 1 && rank == 0 && !opt.save_batch.empty()) {
        json jb = json::object();
        for (std::size_t i = 0; i < g.inputs.size(); ++i) {
          json per = json::array();
          for (const auto& m : mbs) per.push_back(m[i]);
          jb[g.tensors[static_cast<std::size_t>(g.inputs[i])].name] = {{"shape", g.tensors[static_cast<std::size_t>(g.inputs[i])].shape}, {"micro_batches", per}};
        }
        io::write_atomic(opt.save_batch, jb.dump() + "\n", "--save-batch");
      }
      const auto r = interp.step(s, mbs);
      stop_for_test(rank, s);
      const double loss = comm.sum_for_report(r.loss) / N;
      losses.push_back(loss);
      norms.push_back(r.grad_norm);
      scales.push_back(r.loss_scale);
      skipped.push_back(r.skipped);
      if (!opt.checkpoint_dir.empty() && ((opt.save_every > 0 && s % opt.save_every == 0) || s == opt.steps)) save(s);
      if (s > first || opt.steps == first) {  // the first step warms caches
        timed += r.seconds;
        ++timed_steps;
        for (std::size_t i = 0; i < event_sum.size(); ++i) event_sum[i] += interp.event_seconds()[i];
        // The step's phases by the simulator's definitions (intervals of the timeline: events
        // of several streams overlap on a GPU); host events are not run here, so not timed.
        std::vector<double> st(prog.events.size()), en(prog.events.size());
        for (std::size_t i = 0; i < st.size(); ++i) {
          const bool untimed = prog.events[i].kind == zero::EventKind::host;
          st[i] = untimed ? std::nan("") : interp.event_starts()[i];
          en[i] = untimed ? std::nan("") : interp.event_starts()[i] + interp.event_seconds()[i];
        }
        const sim::PhaseTimes ph = sim::phases_of_timeline(prog, st, en);
        phase_sum.forward += ph.forward;
        phase_sum.backward += ph.backward;
        phase_sum.backward_allreduce += ph.backward_allreduce;
        phase_sum.step += ph.step;
        phase_sum.iteration += ph.iteration;
      }
      if (rank == 0 && !opt.quiet)
        std::printf("step %4lld  loss %.6f  %.1f ms%s\n", static_cast<long long>(s), loss, r.seconds * 1e3,
                    r.skipped ? fmt::format("  (overflow: skipped, loss scale {:g})", r.loss_scale).c_str() : "");
    }
  } catch (const AllocationFailed& e) {
    write_partial(e.what());
    allocation_failed(e);
  } catch (const std::exception& e) {
    write_partial(e.what());
    comm.abort(fmt::format("training failed: {}", e.what()));
  }

  json doc = measurements("");
  if (!opt.trace.empty() && timed_steps > 0) {
    // The last step as measured, in the simulator's layout: one track per stream, one
    // slice per event named by its event id, the allocated-bytes counters.
    sim::TimeReport tr;
    tr.events.resize(prog.events.size());
    for (std::size_t i = static_cast<std::size_t>(prog.step_begin); i < prog.events.size(); ++i) {
      tr.events[i].start = Seconds{interp.event_starts()[i]};
      tr.events[i].end = Seconds{interp.event_starts()[i] + interp.event_seconds()[i]};
    }
    try {
      io::write_atomic(rank_path(opt.trace, rank, N), sim::chrome_trace(prog, tr).dump() + "\n", "--trace");
    } catch (const std::exception& e) {
      comm.abort(e.what());
    }
  }
  if (!opt.save_weights.empty() && rank == 0) {
    try {
      std::vector<std::pair<std::string, NamedTensor>> w;
      for (const auto& prm : g.params) w.emplace_back(prm.name, NamedTensor{prm.shape, interp.param_values(prm.id), "F32"});
      write_safetensors(opt.save_weights, w, "--save-weights");
    } catch (const std::exception& e) {
      comm.abort(e.what());
    }
  }
  if (!out.empty()) {
    try {
      io::write_atomic(out, doc.dump(1) + "\n", "--out");
    } catch (const std::exception& e) {
      comm.abort(e.what());
    }
  }
  return doc;
}

}  // namespace zp::exec
