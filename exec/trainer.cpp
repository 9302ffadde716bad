#include "exec/trainer.hpp"

#include "exec/lr_schedule.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "exec/allocator.hpp"
#include "exec/checkpoint.hpp"
#include "exec/data.hpp"
#include "exec/interpreter.hpp"
#include "kernels/cpu/isa.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"
#include "sim/device.hpp"
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

}  // namespace

json train(const TrainOptions& opt, Comm& comm) {
  const int N = comm.size(), rank = comm.rank();
  // ---- inputs (every rank reads the same; errors happen before any collective)
  const kernels::cpu::Isa gemm_isa = kernels::cpu::gemm_isa();  // ZEROPLAN_CPU_ISA is checked here
  const auto mcfg = models::load_model(opt.model);
  zero::DsConfig cfg;
  if (opt.ds_config.empty()) {
    // No config: DeepSpeed's defaults, with one sample per rank per micro-step (as simulate).
    cfg = zero::default_ds_config();
    cfg.train_micro_batch_size_per_gpu = 1;
  } else {
    cfg = zero::load_ds_config(opt.ds_config);
  }
  if (opt.micro_batch) {
    if (*opt.micro_batch < 1) throw InputError("--micro-batch", "", fmt::format("must be >= 1, got {}", *opt.micro_batch));
    cfg.train_micro_batch_size_per_gpu = *opt.micro_batch;
    if (cfg.train_batch_size) cfg.gradient_accumulation_steps.reset();
  }
  if (const auto note = zero::apply_module_dtype(cfg, mcfg.torch_dtype, mcfg.source, mcfg.torch_dtype_key);
      !note.empty() && rank == 0)
    std::fprintf(stderr, "warning: %s\n", note.c_str());
  const zero::Batch batch = zero::resolve_batch(cfg, N);
  models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = opt.seq_len;
  go.act_dtype = cfg.model_dtype();
  // --attention when given, else the config.json's attn_implementation, else the default.
  const models::AttentionChoice att = models::choose_attention(mcfg, opt.attention);
  go.attention = att.attention;
  if (!att.note.empty() && rank == 0) std::fprintf(stderr, "warning: %s\n", att.note.c_str());
  if (!opt.transformers.empty()) go.transformers = models::parse_transformers("--transformers", "", opt.transformers);
  go.gradient_checkpointing = opt.activation_checkpointing;
  const auto g = models::build_graph(mcfg, go);
  zero::LowerOptions lo;
  lo.world_size = N;
  lo.rank = rank;
  lo.activation_checkpointing = opt.activation_checkpointing;
  lo.keep_output = opt.keep_output;
  lo.cublas_workspace = opt.cublas_workspace;
  lo.cublaslt_workspace = opt.cublaslt_workspace;
  const zero::Program prog = zero::lower(g, cfg, batch, lo);
  prog.validate();
  if (const auto why = unsupported_reason(g, prog, cfg); !why.empty())
    throw InputError(opt.ds_config.empty() ? opt.model : opt.ds_config, "", why);
  if (opt.steps < 1) throw InputError("--steps", "", fmt::format("must be >= 1, got {}", opt.steps));
  const LrSchedule schedule = parse_lr_schedule(cfg);
  DataSource data(opt.data, g, opt.seed);
  if (opt.resume && opt.checkpoint_dir.empty()) throw InputError("--resume", "", "needs --checkpoint-dir");
  if (opt.resume && !has_checkpoint(opt.checkpoint_dir))
    throw InputError(opt.checkpoint_dir, "latest", "--resume: no checkpoint to resume from");
  if (opt.save_every < 0) throw InputError("--save-every", "", fmt::format("must be >= 0, got {}", opt.save_every));
  std::string cfg_text;
  if (!opt.ds_config.empty()) {
    std::ifstream cf(opt.ds_config);
    cfg_text.assign(std::istreambuf_iterator<char>(cf), std::istreambuf_iterator<char>());
  }
  CheckpointMeta meta;
  meta.model = g.cfg.name;
  meta.config_digest = cfg_text.empty() ? std::string() : config_digest(cfg_text);
  meta.stage = prog.info.stage;
  meta.world_size = N;
  meta.rank = rank;
  meta.seed = opt.seed;
  const std::string out = opt.out.empty() ? std::string() : rank_path(opt.out, rank, N);
  if (!out.empty()) {
    std::ofstream probe(out);
    if (!probe) throw InputError(out, "", "--out: cannot write the measurements file");
  }
  if (!opt.trace.empty()) {
    std::ofstream probe(rank_path(opt.trace, rank, N));
    if (!probe) throw InputError(rank_path(opt.trace, rank, N), "", "--trace: cannot write the trace file");
  }

  // ---- run (from here a failure on one rank must end every rank)
  TrackingAllocator mem(prog.buffers.size(), opt.memory_limit);
  Interpreter interp(g, prog, cfg, comm, mem, opt.seed);
  json losses = json::array(), norms = json::array(), scales = json::array(), skipped = json::array();
  json lrs = json::array();  // the learning rate each step ran with
  std::vector<double> event_sum(prog.events.size(), 0.0);
  double timed = 0.0;
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
                     {"backend", "cpu+mpi"},
                     {"cpu_gemm", kernels::cpu::isa_name(gemm_isa)}};
    doc["losses"] = losses;
    doc["grad_norms"] = norms;
    doc["loss_scales"] = scales;   // fp16 dynamic loss scale per step (1 otherwise)
    doc["skipped_steps"] = skipped;  // fp16: the update was skipped after an overflow
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
    // Seconds per phase of one step (the sum of its events' measured times; events run
    // one at a time on CPU, so phases do not overlap).
    json phases = json::object();
    for (std::size_t i = static_cast<std::size_t>(prog.step_begin); i < prog.events.size(); ++i) {
      const char* ph = zero::phase_name(prog.events[i].phase);
      const double v = timed_steps > 0 ? event_sum[i] / static_cast<double>(timed_steps) : 0.0;
      phases[ph] = phases.value(ph, 0.0) + v;
    }
    doc["phases"] = phases;
    return doc;
  };
  auto write_partial = [&](const std::string& error) {
    if (out.empty()) return;
    std::ofstream f(out);
    f << measurements(error).dump(1) << "\n";
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
    // Every rank checks its own files; a refusal (corrupt, other world size) is bad input.
    interp.create_first_step_buffers();  // the optimizer states the checkpoint restores
    const auto model = interp.checkpoint_blobs(CheckpointPart::model_states);
    const auto optim = interp.checkpoint_blobs(CheckpointPart::optim_states);
    // Each rank checks its own files; all ranks then agree before going on, so a refusal
    // on one rank ends every rank instead of leaving the others waiting.
    CheckpointMeta got;
    std::string refused;
    try {
      got = load_checkpoint(opt.checkpoint_dir, meta, model, optim);
    } catch (const InputError& e) {
      refused = e.what();
    }
    if (comm.sum_for_report(refused.empty() ? 0.0 : 1.0) > 0.0) {
      if (!refused.empty()) std::fprintf(stderr, "zeroplan: rank %d: %s\n", rank, refused.c_str());
      throw RankRefused("checkpoint refused");
    }
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
      // The scheduler and the optimizer advance only on applied updates (not fp16 overflows).
      std::int64_t applied = 0;
      for (const auto& k : skipped) applied += k.get<bool>() ? 0 : 1;
      const double lr = schedule.lr_for(applied);
      interp.set_update(lr, applied + 1, schedule.betas_for(applied));
      lrs.push_back(lr);
      const auto r = interp.step(s, mbs);
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
    const std::string path = rank_path(opt.trace, rank, N);
    std::ofstream f(path);
    f << sim::chrome_trace(prog, tr).dump() << "\n";
    if (!f) comm.abort(fmt::format("cannot write {}", path));
  }
  if (!out.empty()) {
    std::ofstream f(out);
    f << doc.dump(1) << "\n";
    if (!f) comm.abort(fmt::format("cannot write {}", out));
  }
  return doc;
}

}  // namespace zp::exec
