#include "cli/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "calibration/profile.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"
#include "exec/interpreter.hpp"
#include "sim/collective_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/trace.hpp"

namespace zp::cli {

namespace {
constexpr std::size_t kPathEventsShown = 10;  // critical-path events in the table
}  // namespace

std::string attention_help() {
  return fmt::format("eager, sdpa or flash_attention_2, as transformers names them (default: the config.json's "
                     "attn_implementation, else {}, what transformers picks)",
                     models::attention_name(models::kDefaultAttention));
}

// ", fused_gelu, fused_loss (zeroplan's kernel variants)" for the ones on; "" for HF's graph.
std::string variant_names(const models::KernelVariants& v) {
  std::string on;
  for (const models::KernelVariantInfo& k : models::kernel_variants())
    if (v.*k.member) on += std::string(", ") + k.key;
  return on.empty() ? on : on + " (zeroplan's kernel variants, not HF's graph)";
}

void add_variant_flags(CLI::App* c, models::KernelVariants& v) {
  for (const models::KernelVariantInfo& k : models::kernel_variants())
    c->add_flag(k.flag, v.*k.member, std::string(k.help) + "; simulate predicts what train runs with the same flags");
}

std::string transformers_help() {
  return fmt::format("which transformers release's modelling code to follow where releases differ: 5 or 4.46 "
                     "(default: {}; docs/deepspeed_fidelity.md says what differs)",
                     models::transformers_name(models::kDefaultTransformers));
}

std::string keep_output_help() {
  return "the training loop keeps the model's output (logits, KV cache) until the micro-step ends, as `out = "
         "model(**batch); loss = out.loss; backward(loss)` does (default: it drops it after the forward, as HF Trainer)";
}

std::string host_probe_help() {
  return "this host's probe, microseconds per eager PyTorch op (python3 tools/host_probe.py on the training machine): "
         "DeepSpeed's host costs are scaled from the probe the profile's were measured at (--profile of a "
         "calibration on runs with a probe)";
}

std::string human_bytes(Bytes b) {
  const double v = static_cast<double>(b.v);
  const double a = std::fabs(v);
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", v / 1024.0);
  return fmt::format("{} B", b.v);
}

std::vector<std::pair<std::string, std::string>> input_files(const SimRequest& req, const Inputs& in) {
  return {{"--ds-config", req.ds_config}, {"--model", in.model.source}, {"--cluster", req.cluster}};
}

void check_output(const std::string& path, const std::string& flag, const SimRequest& req, const Inputs& in) {
  if (path.empty()) return;
  io::refuse_same_file(path, flag, input_files(req, in));
  io::AtomicWriter probe(path, flag);  // removed unwritten
}

Inputs load_inputs(const SimRequest& req) {
  if (req.gpus && *req.gpus < 1)
    throw InputError("--gpus", "", fmt::format("must be an integer >= 1, got {}", *req.gpus));
  if (req.cluster.empty() && req.nodes)
    throw InputError("--nodes", "", "needs --cluster (a preset, JSON file or NCCL topology XML)");
  for (int s : req.stages)
    if (s < 0 || s > 3) throw InputError("--stages", "", fmt::format("stage must be one of 0, 1, 2, 3, got {}", s));
  if (req.micro_batch && *req.micro_batch < 1)
    throw InputError("--micro-batch", "", fmt::format("must be an integer >= 1, got {}", *req.micro_batch));
  if (!req.executor.empty() && req.executor != "cuda" && req.executor != "cuda-mpi")
    throw InputError("--executor", "", fmt::format("must be cuda (train --device cuda, NCCL) or cuda-mpi (--comm mpi), "
                                                   "got '{}'", req.executor));
  if (req.attention_kernel != "own" && req.attention_kernel != "cudnn")
    throw InputError("--attention-kernel", "", fmt::format("must be own or cudnn, got '{}'", req.attention_kernel));
  if (req.attention_kernel == "cudnn" && req.executor.empty())
    throw InputError("--attention-kernel", "", "needs --executor cuda or cuda-mpi (it says which kernels the executor's run takes)");
  if (req.ranks_per_gpu < 1)
    throw InputError("--ranks-per-gpu", "", fmt::format("must be an integer >= 1, got {}", req.ranks_per_gpu));
  if (req.executor_workspaces && req.executor.empty())
    throw InputError("--executor-workspaces", "", "needs --executor cuda or cuda-mpi (it says what the executor's run holds)");
  if (req.ranks_per_gpu > 1 && req.executor != "cuda-mpi")
    throw InputError("--ranks-per-gpu", "", "needs --executor cuda-mpi (NCCL refuses two ranks on one GPU; "
                                            "train --comm mpi stages their collectives through the host)");
  Inputs in;
  if (!req.cluster.empty()) {
    in.cluster = sim::load_cluster(req.cluster, req.nodes, req.nic_gbps, req.gpu);
    const int size = in.cluster.nodes * in.cluster.gpus_per_node;
    if (req.gpus && *req.gpus > size)
      throw InputError("--gpus", "", fmt::format("{} ranks do not fit cluster {} of {} GPUs", *req.gpus, in.cluster.name, size));
    in.world_size = req.gpus.value_or(size);
    in.device = &sim::find_device(in.cluster.gpu);
  } else {
    if (!req.gpus) throw InputError("--gpus", "", "give --gpus N (with --gpu TYPE) or --cluster NAME|FILE");
    in.device = &sim::find_device(req.gpu.empty() ? std::string("A100-80GB") : req.gpu);
    in.cluster = sim::single_node(in.device->name, *req.gpus);
    in.world_size = *req.gpus;
  }
  if (req.ranks_per_gpu > in.world_size)
    throw InputError("--ranks-per-gpu", "", fmt::format("must be at most the {} ranks simulated, got {}", in.world_size,
                                                        req.ranks_per_gpu));
  if (req.rank && (*req.rank < 0 || *req.rank >= in.world_size))
    throw InputError("--rank", "", fmt::format("must be in [0, {}] for {} ranks, got {}", in.world_size - 1, in.world_size, *req.rank));
  in.profile = sim::default_profile(*in.device);
  in.executor_memory = in.device->executor;
  std::vector<std::string> profile_warnings;
  if (!req.profile.empty()) {
    // A cluster profile's coefficients replace the defaults (compute, host, collective), and
    // its executor figures the device database's.
    const calibration::ClusterProfile cp = calibration::load_cluster_profile(req.profile);
    calibration::apply_profile(cp, *in.device, in.profile, in.cluster);
    if (cp.executor_memory.measured) {
      // A profile from runs without cuDNN's attention has no figure for it: the device's stays.
      const sim::DeviceSpec::ExecutorMemory device = in.executor_memory;
      in.executor_memory = cp.executor_memory;
      if (!in.executor_memory.cudnn_measured && device.cudnn_measured) {
        in.executor_memory.cudnn = device.cudnn;
        in.executor_memory.cudnn_measured = true;
      }
    }
    profile_warnings = calibration::compatibility_warnings(cp, in.cluster, in.world_size, calibration::local_nccl_version());
    in.profile_file = req.profile;
    in.profile_rel_sd = cp.uncertainty.iteration_rel_sd;
    in.profile_basis = cp.uncertainty.basis;
    in.uncertainty_source = "profile " + req.profile;
  } else if (in.profile.iteration_rel_sd > 0) {
    // A preset measured against a framework carries that error; others carry none known.
    in.profile_rel_sd = in.profile.iteration_rel_sd;
    in.profile_basis = in.profile.uncertainty_basis;
    in.uncertainty_source = fmt::format("the {} preset", in.device->name);
  }
  in.collectives = std::make_shared<const sim::CollectiveModel>(in.cluster);
  // The host's optimizer throughput is shared by the ranks of a node.
  in.profile.cpu_adam_params_per_second /= std::max(1, std::min(in.world_size, in.cluster.gpus_per_node));
  if (req.host_probe_us) {
    // The host's DeepSpeed costs follow its probe: scaled from the probe they were measured at.
    if (!std::isfinite(*req.host_probe_us) || *req.host_probe_us <= 0 || *req.host_probe_us > sim::kMaxHostProbeUs)
      throw InputError("--host-probe-us", "",
                       fmt::format("must be a number in (0, {:g}] (microseconds per eager op, as "
                                   "tools/host_probe.py measures it), got {}",
                                   sim::kMaxHostProbeUs, *req.host_probe_us));
    if (in.profile.host.probe_us <= 0)
      throw InputError("--host-probe-us", "",
                       fmt::format("the {} host costs say no probe they were measured at, so there is nothing to scale "
                                   "from (a profile from zeroplan calibrate on runs recorded with a host probe has one: "
                                   "--profile)",
                                   req.profile.empty() ? in.device->name + " preset's" : "profile's"));
    in.host_probe_us = *req.host_probe_us;
    in.profile_probe_us = in.profile.host.probe_us;
    in.host_probe_scale = *req.host_probe_us / in.profile.host.probe_us;
    in.profile.host = sim::host_costs_at_probe(in.profile.host, *req.host_probe_us);
  }
  if (req.interference) {
    if (!std::isfinite(*req.interference) || *req.interference < 0 || *req.interference > 10)
      throw InputError("--interference", "", fmt::format("must be a number in [0, 10], got {}", *req.interference));
    in.profile.comm_compute_interference = *req.interference;
  }
  in.rank = req.rank;
  // --attention's value is checked before the model is read, so a bad value is named first.
  if (!req.attention.empty()) (void)models::parse_attention("--attention", "", req.attention);
  if (!req.transformers.empty()) in.transformers = models::parse_transformers("--transformers", "", req.transformers);
  in.keep_output = req.keep_output;
  in.variants = req.variants;
  in.model = models::load_model(req.model);
  const models::AttentionChoice attention = models::choose_attention(in.model, req.attention);
  in.attention = attention.attention;
  if (req.ds_config.empty()) {
    // No config: DeepSpeed's defaults, with one sample per GPU per micro-step.
    in.cfg = zero::default_ds_config();
    in.cfg.train_micro_batch_size_per_gpu = 1;
  } else {
    in.cfg = zero::load_ds_config(req.ds_config);
  }
  const std::string module_note =
      zero::apply_module_dtype(in.cfg, in.model.torch_dtype, in.model.source, in.model.torch_dtype_key);
  in.seq_len = req.seq_len.value_or(in.model.max_positions);
  if (in.seq_len < 1 || in.seq_len > in.model.max_positions)
    throw InputError("--seq-len", "", fmt::format("must be in [1, {}] (max_position_embeddings of {}), got {}",
                                                  in.model.max_positions, in.model.name, in.seq_len));
  in.activation_checkpointing = req.activation_checkpointing || in.cfg.activation_checkpointing_present;
  in.warnings = in.cfg.warnings;
  // Said where a ds_config asked for neither fp16 nor bf16 (without one, DeepSpeed's defaults are
  // what the user asked for).
  if (!module_note.empty() && !req.ds_config.empty()) in.warnings.push_back(module_note);
  in.warnings.insert(in.warnings.end(), profile_warnings.begin(), profile_warnings.end());
  if (!attention.note.empty()) in.warnings.push_back(attention.note);
  {
    models::GraphOptions go;
    go.seq_len = in.seq_len;
    go.act_dtype = in.cfg.model_dtype();
    go.attention = in.attention;
    go.transformers = in.transformers;
    go.gradient_checkpointing = in.activation_checkpointing;
    go.variants = in.variants;
    if (const std::string note = models::inert_variants_note(in.model, go); !note.empty()) in.warnings.push_back(note);
  }
  if (in.cfg.sparse_attention.present)
    in.warnings.push_back(fmt::format(
        "{}: sparse_attention: accepted but not modelled: attention FLOPs and memory are predicted for dense "
        "attention (an upper bound for the block-sparse layout)",
        in.cfg.file));
  if (in.cfg.model_dtype() == DType::bf16 && !in.device->bf16)
    in.warnings.push_back(fmt::format("{}: bf16.enabled: {} has no bf16 tensor cores", in.cfg.file, in.device->name));
  const std::int64_t hpz = in.cfg.zero.zero_hpz_partition_size;
  if (hpz > 1 && (hpz > in.world_size || in.world_size % hpz != 0))
    throw InputError(in.cfg.file, "zero_optimization.zero_hpz_partition_size",
                     fmt::format("{} must divide the world size {} (ranks per secondary group)", hpz, in.world_size));
  if (in.cfg.zero.round_robin_gradients)
    in.warnings.push_back(fmt::format("{}: zero_optimization.round_robin_gradients: accepted but not modelled: it "
                                      "reorders gradients among partitions, not their sizes", in.cfg.file));
  if (in.cfg.zero.offload_optimizer.device != zero::OffloadDevice::none && in.cfg.zero.offload_optimizer.ratio < 1.0)
    in.warnings.push_back(fmt::format("{}: zero_optimization.offload_optimizer.ratio: accepted but not modelled: "
                                      "the whole optimizer is predicted on the host", in.cfg.file));
  // Validate the batch for every requested stage now, so errors surface before work.
  const std::vector<int> stages = req.stages.empty() ? std::vector<int>{in.cfg.zero.stage} : req.stages;
  if (req.check_batch)
    for (int s : stages) (void)zero::resolve_batch(config_for_stage(in, req, s), in.world_size);
  return in;
}

zero::DsConfig config_for_stage(const Inputs& in, const SimRequest& req, int stage) {
  zero::DsConfig c = in.cfg;
  c.zero.stage = stage;
  if (req.micro_batch) {
    c.train_micro_batch_size_per_gpu = *req.micro_batch;
    if (c.train_batch_size) c.gradient_accumulation_steps.reset();
  }
  return c;
}

models::GraphOptions graph_options(const Inputs& in, const zero::DsConfig& cfg, const zero::Batch& batch) {
  models::GraphOptions go = sim::graph_options(cfg, batch, in.seq_len, in.attention, in.transformers, target(in));
  go.variants = in.variants;
  return go;
}

namespace {
// Whether `graph` is the one this configuration needs (else it is built again).
bool graph_fits(const models::OpGraph* graph, const Inputs& in, const zero::DsConfig& cfg, const zero::Batch& batch) {
  return graph && graph->opt.micro_batch == batch.micro_batch && graph->opt.act_dtype == cfg.model_dtype() &&
         graph->opt.attention == in.attention && graph->opt.transformers == in.transformers &&
         graph->opt.variants == in.variants && graph->opt.gradient_checkpointing == in.activation_checkpointing;
}

// The executor's device memory for one result (--executor): its scratch, by running the
// program on exec/cuda_memory.hpp's probe, and the driver's device-used figure. The program
// is lowered as `train --device cuda` runs it: without PyTorch's library workspaces, which it
// allocates only under --workspaces-of (--executor-workspaces: with the simulated GPU's). The
// H100 runs of tests/data/calibration/h100_executor held 62-66 MiB less than the program with
// them, and exactly what the program without them predicts.
ExecutorMemory executor_memory(const Inputs& in, const SimRequest& req, const zero::DsConfig& cfg,
                               const models::OpGraph& g, const StageResult& r, bool with_time) {
  if (const auto why = exec::unsupported_reason(g, r.program, cfg); !why.empty())
    throw InputError("--executor", "", fmt::format("{}: zeroplan's executor cannot run stage {} of this configuration: {}",
                                                   req.executor, r.stage, why));
  ExecutorMemory m;
  m.nccl = req.executor == "cuda";
  sim::Target t = target(in);
  t.library_workspaces = req.executor_workspaces;
  t.rank = r.rank;
  // The result's own program holds the workspaces: lowered again without them unless the run
  // holds them too.
  std::optional<sim::Prediction> without;
  if (!req.executor_workspaces) without = sim::predict(g, cfg, r.batch, t, false);
  const zero::Program& program = without ? without->program : r.program;
  m.memory = without ? without->memory : r.memory;
  m.peak_event = m.memory.peak_event >= 0 ? program.event_name(m.memory.peak_event) : std::string();
  const Bytes reserved = m.memory.reserved_peak;
  m.library_workspaces = zero::library_workspace_bytes(program);
  try {
    m.scratch = exec::predict_cuda_scratch(g, program, cfg, req.attention_kernel == "cudnn");
  } catch (const std::logic_error& e) {  // an op the CUDA device refuses (a layout, a dtype)
    throw InputError("--executor", "", fmt::format("{}: {}", req.executor, e.what()));
  }
  m.used = exec::predict_cuda_device_used(in.executor_memory, reserved, m.scratch, m.nccl);
  if (with_time && m.nccl) {
    sim::Target te = t;
    te.rank = r.rank;
    te.deepspeed = false;
    te.cudnn_attention = req.attention_kernel == "cudnn";
    m.time = sim::predict(g, cfg, r.batch, te, true).time;
  }
  // Ranks sharing the GPU: each one's program (lowered for it) and scratch, summed.
  for (int k = 0; k < req.ranks_per_gpu && req.ranks_per_gpu > 1; ++k) {
    exec::CudaDeviceUsed u = m.used;
    if (k != r.rank) {
      t.rank = k;
      const sim::Prediction p = sim::predict(g, cfg, r.batch, t, false);
      u = exec::predict_cuda_device_used(in.executor_memory, p.memory.reserved_peak, exec::predict_cuda_scratch(g, p.program, cfg,
                                                                                              req.attention_kernel == "cudnn"),
                                         m.nccl);
    }
    m.gpu_total += u.total;
    m.gpu_ranks.push_back(u);
  }
  return m;
}
}  // namespace

StageResult simulate_one(const Inputs& in, const zero::DsConfig& cfg, const models::OpGraph* graph, bool with_time) {
  const zero::Batch batch = zero::resolve_batch(cfg, in.world_size);
  models::OpGraph local;
  if (!graph_fits(graph, in, cfg, batch)) {
    local = models::build_graph(in.model, graph_options(in, cfg, batch));
    graph = &local;
  }
  sim::Prediction p = sim::predict(*graph, cfg, batch, target(in), with_time);
  StageResult r;
  r.stage = cfg.zero.stage;
  r.rank = p.rank;
  r.batch = p.batch;
  r.program = std::move(p.program);
  r.memory = std::move(p.memory);
  r.time = std::move(p.time);
  r.unsynchronised = std::move(p.unsynchronised);
  sim::ComputeModel cm(*target(in).profile, *graph);
  cm.deepspeed = target(in).deepspeed;  // the trace's split follows what priced the events
  r.ops = sim::op_trace_info(*graph, &cm);
  r.update = cm.update_pricing();
  return r;
}

sim::Target target(const Inputs& in) {
  sim::Target t;
  t.device = in.device;
  t.profile = &in.profile;
  t.collectives = in.collectives.get();
  t.world_size = in.world_size;
  t.rank = in.rank;
  t.activation_checkpointing = in.activation_checkpointing;
  t.keep_output = in.keep_output;
  return t;
}

nlohmann::json simulate_trace(const std::vector<StageResult>& rs) {
  nlohmann::json doc = {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
  // One process per (stage, rank); the iteration without the phases' synchronisations, where
  // the prediction has one, is a process of its own beside it.
  const auto append = [&](const zero::Program& program, const sim::TimeReport& report, const StageResult& r,
                          int pid, const std::string& name, bool unsynchronised) {
    zero::Program p = program;
    p.info.rank = pid;
    sim::append_chrome_trace(doc, p, report, r.ops, &r.update);
    for (auto& e : doc["traceEvents"])
      if (e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == pid) {
        e["args"]["name"] = name;
        e["args"]["unsynchronised"] = unsynchronised;
      }
  };
  for (const auto& r : rs) {
    append(r.program, r.time.report, r, r.stage * 100000 + r.rank, fmt::format("stage {} rank {}", r.stage, r.rank), false);
    if (r.unsynchronised)
      append(r.unsynchronised->program, r.unsynchronised->report, r, r.stage * 100000 + 50000 + r.rank,
             fmt::format("stage {} rank {}, phases unsynchronised", r.stage, r.rank), true);
  }
  return doc;
}

std::vector<StageResult> simulate(const Inputs& in, const SimRequest& req) {
  const std::vector<int> stages = req.stages.empty() ? std::vector<int>{in.cfg.zero.stage} : req.stages;
  std::vector<StageResult> out;
  models::OpGraph graph;
  bool have_graph = false;
  for (int s : stages) {
    const zero::DsConfig c = config_for_stage(in, req, s);
    const zero::Batch batch = zero::resolve_batch(c, in.world_size);
    if (!have_graph || !graph_fits(&graph, in, c, batch)) {
      graph = models::build_graph(in.model, graph_options(in, c, batch));
      have_graph = true;
    }
    out.push_back(simulate_one(in, c, &graph));
    if (!req.executor.empty()) out.back().executor = executor_memory(in, req, c, graph, out.back(), true);
  }
  return out;
}

namespace {
nlohmann::json path_event_json(const zero::Program& p, const sim::PathEvent& e) {
  nlohmann::json o = nlohmann::json::object();
  o["name"] = p.event_name(e.id);
  o["stream"] = zero::stream_name(e.stream);
  o["kind"] = zero::event_kind_name(e.kind);
  o["communication"] = e.communication();
  o["start_ms"] = e.start.ms();
  o["end_ms"] = e.end.ms();
  return o;
}

// Bytes per category (the categories' names as keys).
nlohmann::json category_json(const sim::CategoryBytes& b) {
  nlohmann::json out = nlohmann::json::object();
  for (int c = 0; c < zero::kNumCategories; ++c)
    out[zero::category_name(static_cast<zero::Category>(c))] = b[static_cast<std::size_t>(c)].v;
  return out;
}
}  // namespace

namespace {
nlohmann::json time_json(const sim::TimeSummary& t) {
  const auto& ph = t.report.phases;
  return {{"forward_ms", ph.forward.ms()},
          {"backward_ms", ph.backward.ms()},
          {"backward_allreduce_ms", ph.backward_allreduce.ms()},
          {"step_ms", ph.step.ms()},
          {"iteration_ms", t.iteration.ms()},
          {"synchronised_iteration_ms", ph.iteration.ms()},
          {"samples_per_s", t.samples_per_s},
          {"tokens_per_s", t.tokens_per_s},
          {"tflops", t.tflops},
          {"mfu", t.mfu}};
}
}  // namespace

nlohmann::json result_json(const StageResult& r, bool full_critical_path) {
  nlohmann::json cats = category_json(r.memory.at_peak);
  nlohmann::json host = category_json(r.memory.host_at_peak);
  nlohmann::json j;
  j["stage"] = r.stage;
  j["rank"] = r.rank;
  j["micro_batch"] = r.batch.micro_batch;
  j["gradient_accumulation_steps"] = r.batch.gas;
  j["train_batch_size"] = r.batch.train_batch_size;
  j["events"] = r.program.num_events();
  const auto& t = r.time;
  j["time"] = time_json(t);
  nlohmann::json kinds = nlohmann::json::object();
  for (int k = 0; k < zero::kNumCollKinds; ++k) {
    const auto ki = static_cast<std::size_t>(k);
    if (t.report.comm.count[ki] == 0) continue;
    kinds[zero::coll_kind_name(static_cast<zero::CollKind>(k))] = {
        {"count", t.report.comm.count[ki]},
        {"bytes", t.report.comm.bytes[ki].v},
        {"time_ms", t.report.comm.time[ki].ms()},
        {"exposed_ms", t.report.comm.exposed[ki].ms()}};
  }
  j["comm"] = {{"bytes_per_rank", t.report.comm.total.v}, {"by_kind", kinds}};
  // The critical path: what the iteration's length is made of, by kind and event by event.
  const auto path = sim::summarize_critical_path(r.program, t.report, kPathEventsShown);
  nlohmann::json cp = {{"num_events", path.num_events}};
  for (int k = 0; k < zero::kNumEventKinds; ++k)
    if (path.has_kind[static_cast<std::size_t>(k)])
      cp[std::string(zero::event_kind_name(static_cast<zero::EventKind>(k))) + "_ms"] = path.by_kind[static_cast<std::size_t>(k)].ms();
  nlohmann::json longest = nlohmann::json::array();
  for (const auto& e : path.longest) longest.push_back(path_event_json(r.program, e));
  cp["longest"] = std::move(longest);
  if (full_critical_path) {  // tens of thousands of events for a large model: opt-in
    // A stretch the path crosses the same way in many repeated micro-steps is listed once,
    // then {"repeats": n, ...}: the events before it n more times, each later by period_ms.
    nlohmann::json events = nlohmann::json::array();
    auto& list = events.get_ref<nlohmann::json::array_t&>();
    for (const auto& run : t.report.critical_path.runs) {
      for (zero::EventId e : run.events) list.push_back(path_event_json(r.program, sim::path_event(r.program, t.report, e)));
      if (run.times > 1 && !run.events.empty()) {
        const auto e = run.events.front();
        const Seconds period = t.report.at(e + run.step).start - t.report.at(e).start;
        list.push_back({{"repeats", run.times - 1}, {"events_each", run.events.size()}, {"period_ms", period.ms()}});
      }
    }
    cp["events"] = std::move(events);
  }
  j["critical_path"] = std::move(cp);
  j["memory"] = {
      {"peak_allocated_bytes", r.memory.peak_allocated.v},
      {"device_used_bytes", r.memory.device_used.v},
      {"reserved_bytes", r.memory.reserved_peak.v},
      {"context_bytes", r.memory.context.v},
      {"persistent_bytes", r.memory.persistent.v},
      {"host_bytes", r.memory.peak_host.v},
      {"host_by_category", host},
      {"peak_event", r.memory.peak_event >= 0 ? r.program.event_name(r.memory.peak_event) : std::string()},
      {"library_workspace_bytes", zero::library_workspace_bytes(r.program).v},
      {"fits", r.memory.fits},
      {"by_category", cats},
  };
  // What the reserved bytes are made of: the allocator's segments per stream and pool.
  auto pools = nlohmann::json::array();
  for (const auto& q : r.memory.pools)
    pools.push_back({{"stream", zero::stream_name(q.stream)},
                     {"pool", q.small ? "small" : "large"},
                     {"segments", q.segments},
                     {"bytes", q.bytes.v},
                     {"allocated_bytes", q.allocated.v},
                     {"segment_sizes", q.sizes}});
  j["memory"]["reserved_by_pool"] = std::move(pools);
  if (r.executor) {
    const ExecutorMemory& x = *r.executor;
    auto arenas = nlohmann::json::array();
    for (const auto& a : x.scratch.arenas)
      arenas.push_back({{"stream", zero::stream_name(static_cast<zero::Stream>(a.stream))},
                        {"slot", a.slot},
                        {"bytes", a.bytes.v},
                        {"largest_by", a.largest_by}});
    const auto& u = x.used;
    nlohmann::json used = {{"known", u.known},
                           {"context_bytes", u.context.v},
                           {"libraries_bytes", u.libraries.v},
                           {"communicator_bytes", u.communicator.v},
                           {"cudnn_bytes", u.cudnn.v},
                           {"reserved_bytes", u.reserved.v},
                           {"scratch_bytes", u.scratch.v},
                           {"pages_bytes", u.pages.v},
                           {"total_bytes", u.total.v}};
    j["executor"] = {{"device", "cuda"},
                     {"comm", x.nccl ? "nccl" : "mpi"},
                     {"device_scratch_bytes", x.scratch.total.v},
                     {"library_workspace_bytes", x.library_workspaces.v},
                     {"memory",
                      {{"peak_allocated_bytes", x.memory.peak_allocated.v},
                       {"reserved_bytes", x.memory.reserved_peak.v},
                       {"host_bytes", x.memory.peak_host.v},
                       {"host_by_category", category_json(x.memory.host_at_peak)},
                       {"peak_event", x.peak_event},
                       {"by_category", category_json(x.memory.at_peak)}}},
                     {"stream_contexts_bytes", x.scratch.stream_contexts.v},
                     {"context_buffer_bytes", x.scratch.context_buffer.v},
                     {"arenas", std::move(arenas)},
                     {"device_used", std::move(used)}};
    if (x.time) j["executor"]["time"] = time_json(*x.time);
    if (!x.gpu_ranks.empty()) {
      auto ranks = nlohmann::json::array();
      for (const auto& g : x.gpu_ranks)
        ranks.push_back({{"reserved_bytes", g.reserved.v}, {"scratch_bytes", g.scratch.v}, {"total_bytes", g.total.v}});
      j["executor"]["gpu_shared"] = {{"ranks", x.gpu_ranks.size()}, {"known", u.known}, {"total_bytes", x.gpu_total.v},
                                     {"per_rank", std::move(ranks)}};
    }
  }
  return j;
}

nlohmann::json simulate_json(const Inputs& in, const std::vector<StageResult>& rs, bool full_critical_path) {
  nlohmann::json j;
  j["model"] = in.model.name;
  j["world_size"] = in.world_size;
  j["gpu"] = in.device->name;
  j["cluster"] = {{"name", in.cluster.name}, {"nodes", in.cluster.nodes}, {"gpus_per_node", in.cluster.gpus_per_node}};
  j["seq_len"] = in.seq_len;
  j["attention"] = models::attention_name(in.attention);
  for (const models::KernelVariantInfo& k : models::kernel_variants()) j[k.key] = in.variants.*k.member;
  j["warnings"] = in.warnings;
  // The ds_config as read (canonical JSON; {} for DeepSpeed's defaults), so that compare can
  // tell a prediction of another configuration.
  j["ds_config"] = in.cfg.raw.is_object() ? zp::json::canonical(in.cfg.raw) : nlohmann::json::object();
  j["results"] = nlohmann::json::array();
  for (const auto& r : rs) {
    j["results"].push_back(result_json(r, full_critical_path));
    if (!in.uncertainty_source.empty()) {
      // One standard deviation of the profile's (or the preset's) residuals around the iteration time.
      const double t = r.time.iteration.ms(), s = in.profile_rel_sd;
      j["results"].back()["time"]["iteration_interval_ms"] = {t * (1 - s), t * (1 + s)};
    }
  }
  if (!in.profile_file.empty())
    j["profile"] = {{"file", in.profile_file}, {"iteration_rel_sd", in.profile_rel_sd}, {"basis", in.profile_basis}};
  if (in.host_probe_us > 0)
    j["host_probe"] = {{"probe_us", in.host_probe_us}, {"profile_probe_us", in.profile_probe_us},
                       {"host_cost_factor", in.host_probe_scale}};
  if (!in.uncertainty_source.empty())
    j["uncertainty"] = {{"source", in.uncertainty_source}, {"iteration_rel_sd", in.profile_rel_sd}, {"basis", in.profile_basis}};
  return j;
}

namespace {
// --executor: zeroplan's CUDA executor's device memory, part by part as its driver reports it.
std::string executor_table(const Inputs& in, const std::vector<StageResult>& rs) {
  const bool nccl = rs.front().executor->nccl;
  std::string out = fmt::format("\nzeroplan train --device cuda{} on this program: device used at the peak, as the "
                                "driver reports it (MiB)\n",
                                nccl ? "" : " --comm mpi");
  out += fmt::format("{:>5} {:>9} {:>10} {:>9} {:>10} {:>9} {:>7} {:>10}  {}\n", "stage", "context", "libraries",
                     nccl ? "nccl" : "comm", "reserved", "scratch", "pages", "dev_used", "largest scratch");
  auto mb = [](Bytes b) { return fmt::format("{:.0f}", b.mib()); };
  for (const auto& r : rs) {
    const ExecutorMemory& x = *r.executor;
    const exec::CudaArena* big = nullptr;
    for (const auto& a : x.scratch.arenas)
      if (!big || a.bytes > big->bytes) big = &a;
    const auto& u = x.used;
    out += fmt::format("{:>5} {:>9} {:>10} {:>9} {:>10} {:>9} {:>7} {:>10}  {}\n", r.stage,
                       u.known ? mb(u.context) : "?", u.known ? mb(u.libraries + u.cudnn) : "?",
                       u.known ? mb(u.communicator) : "?", mb(u.reserved), mb(u.scratch), mb(u.pages),
                       u.known ? mb(u.total) : "?",
                       big ? fmt::format("{} M, {}", mb(big->bytes), big->largest_by) : std::string("-"));
  }
  const auto& e = in.executor_memory;
  const bool cudnn = rs.front().executor->scratch.cudnn;
  if (!e.measured)
    out += fmt::format("?: not measured on {} (sim/devices.json has no executor_cuda entry for it: calibrate --train-out "
                       "on train --device cuda --out runs of it measures them into a profile)\n", in.device->name);
  else if (nccl && !e.nccl_measured)
    out += fmt::format("?: the communicator's memory was not measured ({} has no NCCL run)\n", e.source);
  else if (cudnn && !e.cudnn_measured)
    out += fmt::format("?: cuDNN's own memory (its handle and attention engines) was not measured on {} ({}: no run "
                       "with --attention-kernel cudnn)\n", in.device->name, e.source);
  else
    out += fmt::format("context, libraries{}: measured on {} ({}); scratch: the executor's own arenas (exec/cuda_memory.hpp); "
                       "pages: their rounding to 2 MiB\n",
                       nccl ? ", nccl (one rank's communicator)" : "", in.device->name, e.source);
  if (const auto& x = rs.front().executor->scratch; x.context_buffer.v > 0)
    out += fmt::format("scratch holds cuDNN's attention workspace ({} MiB, {}: kernels/common/sdpa_dims.hpp)\n",
                       mb(x.context_buffer), x.context_buffer_by);
  if (cudnn && e.cudnn_measured)
    out += fmt::format("libraries include cuDNN's handle and attention engines' code, {} MiB as measured on {}\n",
                       mb(e.cudnn), in.device->name);
  if (nccl && in.world_size > 1)
    out += "note: NCCL's buffers grow with its peers and channels; the nccl column is one rank's communicator\n";
  // Its time: none of DeepSpeed's host work, which the main table prices.
  for (const auto& r : rs)
    if (const auto& t = r.executor->time)
      out += fmt::format("stage {}: the executor's own step (no DeepSpeed Python, per-tensor loops or separate bias adds{}): "
                         "forward {:.1f} ms, backward {:.1f} ms, step {:.1f} ms, iteration {:.1f} ms, {:.1f} samples/s\n",
                         r.stage, r.executor->scratch.cudnn ? "; cuDNN's attention" : "", t->report.phases.forward.ms(),
                         t->report.phases.backward.ms(), t->report.phases.step.ms(), t->iteration.ms(),
                         t->samples_per_s);
  for (const auto& r : rs)
    if (!r.executor->gpu_ranks.empty())
      out += fmt::format("stage {}: ranks 0-{} on the one GPU use {} MiB of it together (each its own context, "
                         "libraries, program and scratch)\n",
                         r.stage, r.executor->gpu_ranks.size() - 1,
                         r.executor->used.known ? fmt::format("{:.0f}", r.executor->gpu_total.mib()) : std::string("?"));
  return out;
}
}  // namespace

std::string simulate_table(const Inputs& in, const std::vector<StageResult>& rs, bool critical_path) {
  std::string out;
  const auto& first = rs.front();
  out += fmt::format("{} on {} x {} ({} memory), micro-batch {}, seq-len {}, {}, {} attention{}\n", in.model.name,
                     in.world_size, in.device->name, human_bytes(in.device->memory), first.batch.micro_batch,
                     in.seq_len, dtype_name(in.cfg.model_dtype()), models::attention_name(in.attention),
                     std::string(in.activation_checkpointing ? ", activation checkpointing" : "") +
                         variant_names(in.variants));
  out += fmt::format("{:>5} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>5}  {}\n",
                     "stage", "gas", "params", "grads", "master", "optim", "comm_buf", "activ", "temps", "peak_alloc",
                     "dev_used", "host", "fits", "peak event");
  auto mb = [](Bytes b) { return fmt::format("{:.0f}M", b.mib()); };
  for (const auto& r : rs) {
    const auto& a = r.memory.at_peak;
    out += fmt::format("{:>5} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>5}  {}\n",
                       r.stage, r.batch.gas, mb(a[0]), mb(a[1]), mb(a[2]), mb(a[3]), mb(a[4]), mb(a[5]), mb(a[6]),
                       mb(r.memory.peak_allocated), mb(r.memory.device_used), mb(r.memory.peak_host),
                       r.memory.fits ? "yes" : "NO",
                       r.memory.peak_event >= 0 ? r.program.event_name(r.memory.peak_event) : "-");
  }
  out += fmt::format("sizes in MiB (M = 2^20 B) at the peak; dev_used = reserved (caching allocator) + {} context\n",
                     human_bytes(in.device->context_overhead));
  if (first.executor) out += executor_table(in, rs);
  out += fmt::format("\n{:>5} {:>10} {:>10} {:>11} {:>9} {:>10} {:>10} {:>8} {:>6} {:>10}\n", "stage", "fwd_ms", "bwd_ms",
                     "bwd_ar_ms", "step_ms", "iter_ms", "samples/s", "tflops", "mfu", "comm_MB");
  for (const auto& r : rs) {
    const auto& ph = r.time.report.phases;
    out += fmt::format("{:>5} {:>10.1f} {:>10.1f} {:>11.1f} {:>9.1f} {:>10.1f} {:>10.1f} {:>8.1f} {:>5.1f}% {:>10.1f}\n",
                       r.stage, ph.forward.ms(), ph.backward.ms(), ph.backward_allreduce.ms(), ph.step.ms(),
                       r.time.iteration.ms(), r.time.samples_per_s, r.time.tflops, 100.0 * r.time.mfu,
                       r.time.report.comm.total.mib());
  }
  for (const auto& r : rs)
    if (const auto& ph = r.time.report.phases; r.time.iteration < ph.iteration)
      out += fmt::format("stage {}: iter_ms is {:.1f} ms less than the phases timed apart: without a synchronisation, "
                         "the ZeRO step's loops run while the device finishes the backward\n",
                         r.stage, (ph.iteration - r.time.iteration).ms());
  out += fmt::format("times per optimizer step of {} micro-steps on {} ({}); bwd_ar_ms: backward time the compute "
                     "stream spent not computing (exposed communication, or waiting for the host); comm_MB: bytes "
                     "sent per rank\n",
                     first.batch.gas, in.cluster.name, in.profile.source.empty() ? "default profile" : "device profile");
  if (in.host_probe_us > 0)
    out += fmt::format("host costs x{:.2f}: this host's probe {:.2f} us per eager op against the profile's {:.2f} us "
                       "(--host-probe-us)\n",
                       in.host_probe_scale, in.host_probe_us, in.profile_probe_us);
  if (!in.uncertainty_source.empty()) {
    out += fmt::format("with {}: iteration times carry ±{:.1f}% (one standard deviation; {}):", in.uncertainty_source,
                       100 * in.profile_rel_sd, in.profile_basis);
    for (const auto& r : rs) {
      const double t = r.time.iteration.ms(), s = in.profile_rel_sd;
      out += fmt::format(" stage {} {:.1f}-{:.1f} ms;", r.stage, t * (1 - s), t * (1 + s));
    }
    out.back() = '\n';
  }
  if (!critical_path) return out;
  out += fmt::format("\ncritical path: the chain of events that sets the phases' sum (the program timed with a "
                     "synchronisation between its phases; iter_ms may be shorter, above), "
                     "its length by kind and its {} longest events\n", kPathEventsShown);
  for (const auto& r : rs) {
    const auto path = sim::summarize_critical_path(r.program, r.time.report, kPathEventsShown);
    std::map<std::string, double> by_kind;
    for (int k = 0; k < zero::kNumEventKinds; ++k)
      if (path.has_kind[static_cast<std::size_t>(k)])
        by_kind[zero::event_kind_name(static_cast<zero::EventKind>(k))] = path.by_kind[static_cast<std::size_t>(k)].ms();
    std::string kinds;
    for (const auto& [k, v] : by_kind) kinds += fmt::format("{}{} {:.1f} ms", kinds.empty() ? "" : ", ", k, v);
    out += fmt::format("stage {}: {} events; {}\n", r.stage, path.num_events, kinds);
    out += fmt::format("  {:>10} {:>10}  {:<9} {:<10} {}\n", "dur_ms", "start_ms", "stream", "kind", "event");
    for (const auto& e : path.longest)
      out += fmt::format("  {:>10.3f} {:>10.3f}  {:<9} {:<10} {}\n", e.duration().ms(), e.start.ms(),
                         zero::stream_name(e.stream), zero::event_kind_name(e.kind), r.program.event_name(e.id));
  }
  return out;
}

}  // namespace zp::cli
