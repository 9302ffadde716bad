// `zeroplan train --out` measurements → one observation per timed event. The program is
// lowered again from the file's configuration, so its event names line up with the measured
// ones (ARCHITECTURE.md: event ids are shared); each compute, copy and optimizer event
// becomes a kernel observation and each collective a collective one, priced event by event.
#include <array>
#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "calibration/sources.hpp"
#include "core/error.hpp"
#include "core/json_util.hpp"
#include "models/model_config.hpp"
#include "calibration/predictor.hpp"
#include "exec/cuda_memory.hpp"
#include "sim/predict.hpp"
#include "sim/trace.hpp"

namespace zp::calibration {

namespace fs = std::filesystem;

Dataset read_train_out(const std::string& path, const RunArgs& args, const sim::ClusterSpec& cluster) {
  const json::json doc = json::parse_file(path);
  const json::Reader root{path, ""};
  if (!doc.is_object() || !doc.contains("config") || !doc.contains("events"))
    throw InputError(path, "", "not a `zeroplan train --out` measurements file (no \"config\" and \"events\")");
  if (doc.contains("error") && doc.at("error").is_string())
    throw InputError(path, "error",
                     fmt::format("the run failed ({}): its times are not a step's", json::printable(doc.at("error").get<std::string>())));
  const auto& c = doc.at("config");
  const json::Reader cr = root.sub("config");
  cr.require_object(c, "config");
  const std::string model = args.model.empty() ? cr.get_string(c, "model", "") : args.model;
  if (model.empty()) throw InputError(path, "config.model", "missing required key");
  // The ds_config and the model as the run read them (train --out records both) win over the
  // path and the name it gives: on another machine the path may be missing or another file,
  // and a config.json's name may be a catalogue entry's. --ds-config / --model override them.
  const bool embedded = args.ds_config.empty() && c.contains("ds_config_json") && c.at("ds_config_json").is_object() &&
                        !c.at("ds_config_json").empty();
  std::string ds_path = args.ds_config.empty() ? cr.get_string(c, "ds_config", "") : args.ds_config;
  if (!embedded && !ds_path.empty() && !fs::exists(ds_path) && fs::exists(fs::path(path).parent_path() / ds_path))
    ds_path = (fs::path(path).parent_path() / ds_path).string();
  if (!embedded && !ds_path.empty() && !fs::exists(ds_path))
    throw InputError(path, "config.ds_config",
                     fmt::format("the ds_config the run used ({}) is not here; give it with --ds-config", json::printable(ds_path)));
  const int world = static_cast<int>(cr.get_int(c, "world_size", 1, 1, 1 << 20));
  const int rank = static_cast<int>(cr.get_int(c, "rank", 0, 0, world - 1));
  if (world > cluster.world_size())
    throw InputError(path, "config.world_size",
                     fmt::format("{} ranks do not fit cluster {} of {} GPUs", world, cluster.name, cluster.world_size()));
  const bool model_embedded = args.model.empty() && c.contains("model_config_json") && c.at("model_config_json").is_object();
  models::ModelConfig mc = model_embedded ? models::parse_model_config(path + " (config.model_config_json)",
                                                                       c.at("model_config_json").dump())
                                          : models::load_model(model);
  if (model_embedded) mc.name = model;
  zero::DsConfig cfg = embedded        ? zero::parse_ds_config(path + " (config.ds_config_json)", c.at("ds_config_json"))
                       : ds_path.empty() ? zero::default_ds_config()
                                         : zero::load_ds_config(ds_path);
  if (ds_path.empty()) cfg.train_micro_batch_size_per_gpu = 1;
  // As `zeroplan train` ran it: without fp16/bf16, in the dtype the model config names.
  const std::string dtype_note = zero::apply_module_dtype(cfg, mc.torch_dtype, mc.source, mc.torch_dtype_key);
  const std::int64_t micro = args.micro_batch.value_or(cr.get_int(c, "micro_batch", 1, 1, 1 << 24));
  cfg.train_micro_batch_size_per_gpu = micro;
  if (cfg.train_batch_size) cfg.gradient_accumulation_steps.reset();
  const zero::Batch batch = zero::resolve_batch(cfg, world);
  const std::int64_t seq = args.seq_len.value_or(cr.get_int(c, "seq_len", mc.max_positions, 1, mc.max_positions));
  // --attention, else what the run recorded (train --out writes it), else the model's default.
  const std::string att_arg = !args.attention.empty() ? args.attention : cr.get_string(c, "attention", "");
  const models::Attention att = models::choose_attention(mc, att_arg).attention;
  const bool ckpt = args.activation_checkpointing || cr.get_bool(c, "activation_checkpointing", false) ||
                    cfg.activation_checkpointing_present;

  const sim::DeviceSpec& dev = sim::find_device(cluster.gpu);
  sim::Target t;
  t.device = &dev;
  t.world_size = world;
  t.rank = rank;
  t.activation_checkpointing = ckpt;
  models::GraphOptions go = sim::graph_options(cfg, batch, seq, att, models::kDefaultTransformers, t);
  // The kernel variants the run trained with (train --fused-gelu, ...): its graph.
  for (const models::KernelVariantInfo& k : models::kernel_variants())
    go.variants.*k.member = cr.get_bool(c, k.key, false);
  const models::OpGraph g = models::build_graph(mc, go);
  const sim::Prediction pred = sim::predict(g, cfg, batch, t, false);
  const zero::Program& prog = pred.program;

  const auto& evs = doc.at("events");
  if (!evs.is_array()) throw InputError(path, "events", "must be an array");
  const std::size_t first = static_cast<std::size_t>(std::max<zero::EventId>(prog.step_begin, 0));
  // The program event each measured one is, by name and in order. Events the program gained
  // after a file was written are allowed to be missing from it, in the step only: the step's
  // fixed host part apart from its loops (ZeRO's, the bare optimizer's), and a bf16 run's overflow check (the lowering
  // decides where there is one; a run recorded before them did neither).
  auto added_later = [&](std::size_t j) {
    const zero::Event& ev = prog.events[j];
    if (ev.micro_step >= 0) return false;
    if (ev.kind == zero::EventKind::host) return prog.event_name(static_cast<zero::EventId>(j)) == "step/host.optimizer_step.rest";
    return ev.kind == zero::EventKind::collective && ev.trigger == zero::Trigger::overflow_check &&
           cfg.precision == zero::Precision::bf16;
  };
  std::vector<zero::EventId> at(evs.size(), -1);
  std::vector<std::int32_t> unmeasured;
  {
    std::size_t j = first;
    for (std::size_t i = 0; i < evs.size(); ++i) {
      const std::string name = evs[i].is_object() && evs[i].contains("id") && evs[i].at("id").is_string()
                                   ? evs[i].at("id").get<std::string>()
                                   : std::string{};
      while (j < prog.events.size() && added_later(j) && prog.event_name(static_cast<zero::EventId>(j)) != name) ++j;
      if (j == prog.events.size())
        throw InputError(path, "events",
                         fmt::format("{} events measured, the program lowered from its configuration has {}: give the "
                                     "--model, --ds-config and --attention it ran with",
                                     evs.size(), prog.events.size() - first));
      at[i] = static_cast<zero::EventId>(j++);
    }
    while (j < prog.events.size() && added_later(j)) ++j;
    for (std::size_t k = first, i = 0; k < prog.events.size(); ++k) {
      if (i < at.size() && at[i] == static_cast<zero::EventId>(k)) { ++i; continue; }
      unmeasured.push_back(static_cast<std::int32_t>(k));
    }
    if (j != prog.events.size())
      throw InputError(path, "events",
                       fmt::format("{} events measured, the program lowered from its configuration has {}: give the "
                                   "--model, --ds-config and --attention it ran with",
                                   evs.size(), prog.events.size() - first));
  }
  Dataset ds;
  if (!dtype_note.empty()) ds.warnings.push_back(dtype_note);
  ds.files.push_back(path);
  const std::string backend = cr.get_string(c, "backend", "");
  // The driver's figures of a GPU this rank had to itself (sharing ranks' are the GPU's).
  if (doc.contains("driver_memory") && cr.get_int(c, "ranks_on_gpu", world == 1 ? 1 : 0, 0, 1 << 20) == 1) {
    const auto& dm = doc.at("driver_memory");
    const json::Reader dr = root.sub("driver_memory");
    dr.require_object(dm, "driver_memory");
    const std::int64_t big = std::int64_t{1} << 50;
    for (const char* k : {"after_context", "after_init", "after_comm"})
      if (!dm.contains(k)) throw InputError(path, dr.key_path(k), "missing required key");
    const std::int64_t ctx = dr.get_int(dm, "after_context", 0, 1, big), init = dr.get_int(dm, "after_init", 0, 1, big);
    const std::int64_t comm = dr.get_int(dm, "after_comm", 0, 0, big);
    const auto own = static_cast<std::int64_t>(exec::kComputeContextBytes);
    if (init < ctx + own)
      throw InputError(path, dr.key_path("after_init"),
                       fmt::format("{} B, less than the context's {} B and the kernels' {} B of workspace and scratch", init,
                                   ctx, own));
    DriverFigures f;
    f.file = path;
    f.gpu_name = cr.get_string(c, "gpu", "");
    f.context = ctx;
    f.libraries = init - ctx - own;
    if (backend == "cuda+nccl" && world == 1) {  // one rank's communicator (more peers: more buffers)
      if (comm < init) throw InputError(path, dr.key_path("after_comm"), fmt::format("{} B, less than after_init's {} B", comm, init));
      f.nccl = comm - init;
    }
    // cuDNN's handle and engines, in a run where cuDNN ran an attention (a run recorded before
    // the key has no figure; one whose attentions cuDNN does not take, fp32 or eager, made no
    // handle and has 0).
    if (cr.get_enum(c, "attention_kernel", "own", {"own", "cudnn"}) == "cudnn" && dm.contains("cudnn")) {
      const std::int64_t b = dr.get_int(dm, "cudnn", 0, 0, big);
      if (b > 0) f.cudnn = b;
    }
    ds.driver.push_back(f);
  }
  const bool tf32 = cr.get_bool(c, "allow_tf32", false);  // train --allow-tf32
  const std::string kernel = cr.get_enum(c, "attention_kernel", "own", {"own", "cudnn"});  // train --attention-kernel
  const bool cudnn = kernel == "cudnn";
  // The run (rank 0's configuration of its world size) its events and phases belong to, named
  // by the file.
  ds.runs.push_back(make_run(fs::path(path).stem().string(), path, model, cfg, seq, att, world, ckpt));
  ds.runs.back().model_config = mc;
  ds.runs.back().zeroplan_executor = true;
  ds.runs.back().cudnn_attention = cudnn;
  ds.runs.back().cuda = backend.rfind("cuda", 0) == 0;
  ds.runs.back().unmeasured_events = unmeasured;
  ds.runs.back().rank = rank;
  ds.runs.back().variants = go.variants;
  // Per timer phase, the sum of its device events' measured times (the executor runs them one
  // after another, so this is what its phases took).
  std::array<double, kNumPhaseNames> phase_sum{};
  int kept = 0;
  for (std::size_t i = 0; i < evs.size(); ++i) {
    const json::Reader er = root.sub(fmt::format("events[{}]", i));
    const auto& e = evs[i];
    if (!e.is_object()) throw InputError(path, er.path, "must be an object");
    const zero::EventId id = at[i];
    const std::string name = er.get_string(e, "id", "");
    const std::string want = prog.event_name(id);
    if (name != want)
      throw InputError(path, er.key_path("id"),
                       fmt::format("measured '{}' where the program has '{}': the file comes from another model, "
                                   "ds_config or attention (give the ones it ran with)",
                                   json::printable(name), want));
    if (!e.contains("seconds") || !e.at("seconds").is_number())
      throw InputError(path, er.key_path("seconds"), "must be a number of seconds");
    const double s = e.at("seconds").get<double>();
    if (!std::isfinite(s) || s < 0)
      throw InputError(path, er.key_path("seconds"), fmt::format("must be a non-negative time, got {}", e.at("seconds").dump()));
    const zero::Event& ev = prog.events[static_cast<std::size_t>(id)];
    if (sim::on_device(ev)) phase_sum[static_cast<std::size_t>(timer_phase(ev))] += s;
    if (ev.kind == zero::EventKind::marker || s == 0) continue;
    Observation o;
    o.kind = ObsKind::kernel;
    o.source = fmt::format("{}: {}", path, name);
    o.measured = Seconds{s};
    o.tags = ds.runs.back().tags;
    o.tags["source"] = "train";
    o.tags["file"] = path;
    o.tags["event"] = name;
    o.tags["backend"] = backend;
    o.tags["phase"] = phase_label(timer_phase(ev));
    KernelSample& k = o.kernel;
    k.name = name;
    k.run = 0;
    k.dtype = g.opt.act_dtype;
    k.tf32 = tf32;
    k.cudnn_attention = cudnn;
    switch (ev.kind) {
      case zero::EventKind::compute: {
        k.flops = ev.flops;
        k.bytes = ev.mem_bytes;
        k.backward = ev.phase == zero::Phase::backward;
        k.cls = KernelClass::memory;
        if (ev.op >= 0) {
          const models::Op& op = g.ops[static_cast<std::size_t>(ev.op)];
          k.gemms = op.gemms;
          k.op_kind = op.kind;
          k.padded_rows = !op.outputs.empty() && g.tensors[static_cast<std::size_t>(op.outputs[0])].row_pitch != 0;
          k.staged = backend.rfind("cuda", 0) == 0 && op.fn == models::Fn::linear;
          if (op.fn == models::Fn::sdpa || op.fn == models::Fn::flash_attention) {
            k.cls = KernelClass::attention;
            k.dropout = op.alpha;
          } else if (!op.gemms.empty()) {
            k.cls = KernelClass::gemm;
          }
          o.tags["op"] = models::op_kind_name(op.kind);
        }
        break;
      }
      case zero::EventKind::copy:
        k.bytes = ev.mem_bytes;
        k.pieces = std::max<std::int64_t>({1, static_cast<std::int64_t>(ev.slice_end - ev.slice_begin), ev.tensors});
        k.copy_kernel = ev.copy_kernel;
        k.host_bound = ev.host_bound;
        k.cls = ev.src == zero::Placement::host && ev.dst == zero::Placement::host ? KernelClass::copy_host
                : ev.src != ev.dst                                                 ? KernelClass::copy_h2d
                                                                                   : KernelClass::copy_d2d;
        o.tags["op"] = ev.copy_kernel == zero::CopyKernel::memcpy ? "copy" : zero::copy_kernel_name(ev.copy_kernel);
        break;
      case zero::EventKind::host:
        continue;  // the framework's host work: the executor runs none of it
      case zero::EventKind::optimizer:
        if (ev.src == zero::Placement::host) continue;  // CPU Adam: the host's optimizer, not a kernel
        k.cls = KernelClass::memory;
        k.optimizer = true;
        k.flops = ev.flops;
        k.bytes = ev.mem_bytes;
        k.reduce_bytes = ev.reduce_bytes;
        if (ev.reduce_bytes.v > 0) k.pieces = std::max(1, ev.tensors);
        o.tags["op"] = "optimizer";
        break;
      case zero::EventKind::collective: {
        k.cls = KernelClass::collective;
        o.coll.kind = ev.coll;
        o.coll.bytes = Bytes{ev.elements * dtype_size(ev.dtype)};
        o.coll.group = prog.groups[static_cast<std::size_t>(ev.group)].ranks;
        o.coll.ranks = static_cast<int>(o.coll.group.size());
        o.coll.dtype = std::string(dtype_name(ev.dtype));
        o.tags["op"] = zero::coll_kind_name(ev.coll);
        // A scalar all-reduce reduces the gradients locally first (the norm, the overflow check).
        k.bytes = ev.mem_bytes;
        k.pieces = ev.tensors;
        if (o.coll.ranks < 2) {
          if (ev.tensors <= 0 && ev.mem_bytes.v <= 0) continue;  // a group of one moves nothing
          k.cls = KernelClass::reduction;  // what is left: the local reduction
          o.tags["op"] = zero::trigger_name(ev.trigger);
        }
        break;
      }
      case zero::EventKind::marker: continue;
    }
    o.tags["kind"] = kernel_class_name(k.cls);
    o.label = fmt::format("{} ({})", name, kernel_class_name(k.cls));
    ds.obs.push_back(std::move(o));
    ++kept;
  }
  if (kept == 0)
    throw InputError(path, "events", "no event has a measured time (a run of one step is not timed: train 2 or more)");
  // Each event weighs in the fit by its share of its class's time in the step
  // (Observation::weight): among bandwidth-bound kernels a 2 ms loss counts more than a 10 µs
  // add, while each class keeps the weight its number of events gives it.
  std::map<KernelClass, std::pair<double, int>> per_class;  // time, events
  for (const auto& o : ds.obs) {
    auto& [time, n] = per_class[o.kernel.cls];
    time += o.measured.v;
    ++n;
  }
  for (auto& o : ds.obs) {
    const auto& [time, n] = per_class[o.kernel.cls];
    o.weight = std::sqrt(o.measured.v * n / time);
  }
  const std::string src = fmt::format("{}: phases", path);
  double total = 0;
  for (PhaseName ph : {PhaseName::forward, PhaseName::backward, PhaseName::step}) {
    const double v = phase_sum[static_cast<std::size_t>(ph)];
    total += v;
    if (v > 0) add_phase(ds, 0, ph, Quantity::events, v, 0, 1, false, src, "train");
  }
  add_phase(ds, 0, PhaseName::iteration, Quantity::events, total, 0, 1, false, src, "train");
  return ds;
}

}  // namespace zp::calibration
