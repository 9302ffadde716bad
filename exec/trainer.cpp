#include "exec/trainer.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "exec/allocator.hpp"
#include "exec/data.hpp"
#include "exec/interpreter.hpp"
#include "models/graph.hpp"
#include "models/model_config.hpp"
#include "sim/device.hpp"
#include "sim/memory.hpp"
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
  const zero::Batch batch = zero::resolve_batch(cfg, N);
  models::GraphOptions go;
  go.micro_batch = batch.micro_batch;
  go.seq_len = opt.seq_len;
  go.act_dtype = cfg.model_dtype();
  const auto g = models::build_graph(mcfg, go);
  zero::LowerOptions lo;
  lo.world_size = N;
  lo.rank = rank;
  lo.activation_checkpointing = opt.activation_checkpointing;
  const zero::Program prog = zero::lower(g, cfg, batch, lo);
  prog.validate();
  if (const auto why = unsupported_reason(g, prog, cfg); !why.empty())
    throw InputError(opt.ds_config.empty() ? opt.model : opt.ds_config, "", why);
  if (opt.steps < 1) throw InputError("--steps", "", fmt::format("must be >= 1, got {}", opt.steps));
  DataSource data(opt.data, g, opt.seed);
  const std::string out = opt.out.empty() ? std::string() : rank_path(opt.out, rank, N);
  if (!out.empty()) {
    std::ofstream probe(out);
    if (!probe) throw InputError(out, "", "--out: cannot write the measurements file");
  }

  // ---- run (from here a failure on one rank must end every rank)
  TrackingAllocator mem(prog.buffers.size(), opt.memory_limit);
  Interpreter interp(g, prog, cfg, comm, mem, opt.seed);
  json losses = json::array(), norms = json::array();
  std::vector<double> event_sum(prog.events.size(), 0.0);
  double timed = 0.0;
  std::int64_t timed_steps = 0;
  try {
    interp.prologue();
    comm.barrier();
    for (std::int64_t s = 1; s <= opt.steps; ++s) {
      std::vector<MicroBatch> mbs;
      for (int m = 0; m < batch.gas; ++m) mbs.push_back(data.batch(s, m, static_cast<int>(batch.gas), rank, N));
      const auto r = interp.step(s, mbs);
      const double loss = comm.sum_for_report(r.loss) / N;
      losses.push_back(loss);
      norms.push_back(r.grad_norm);
      if (s > 1 || opt.steps == 1) {  // the first step warms caches
        timed += r.seconds;
        ++timed_steps;
        for (std::size_t i = 0; i < event_sum.size(); ++i) event_sum[i] += interp.event_seconds()[i];
      }
      if (rank == 0 && !opt.quiet) std::printf("step %4lld  loss %.6f  %.1f ms\n", static_cast<long long>(s), loss, r.seconds * 1e3);
    }
  } catch (const AllocationFailed& e) {
    const auto pred = sim::replay_memory(prog, sim::DeviceSpec{}, sim::MemoryOptions{false, false});
    comm.abort(fmt::format("{} (predicted peak for this program: {} B)", e.what(), pred.peak_allocated.v));
  } catch (const std::exception& e) {
    comm.abort(fmt::format("training failed: {}", e.what()));
  }

  // ---- measurements
  const auto& mr = mem.report();
  const auto& cc = comm.counters();
  json doc;
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
                   {"backend", "cpu+mpi"}};
  doc["losses"] = losses;
  doc["grad_norms"] = norms;
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
    by_kind[zero::coll_kind_name(static_cast<zero::CollKind>(k))] = {{"bytes_per_step", cc.bytes_sent[i] / opt.steps},
                                                                   {"calls_per_step", cc.calls[i] / opt.steps}};
    total += cc.bytes_sent[i];
  }
  doc["comm"] = {{"bytes_per_rank", total / opt.steps}, {"by_kind", by_kind}};
  json events = json::array();
  for (std::size_t i = static_cast<std::size_t>(prog.step_begin); i < prog.events.size(); ++i)
    events.push_back({{"id", prog.event_name(static_cast<zero::EventId>(i))},
                      {"seconds", timed_steps > 0 ? event_sum[i] / static_cast<double>(timed_steps) : 0.0}});
  doc["events"] = events;
  if (!out.empty()) {
    std::ofstream f(out);
    f << doc.dump(1) << "\n";
    if (!f) comm.abort(fmt::format("cannot write {}", out));
  }
  return doc;
}

}  // namespace zp::exec
