#include "cli/plan.hpp"
#include "exec/device_cuda.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "cli/explain.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"
#include "sim/device.hpp"

namespace zp::cli {

namespace fs = std::filesystem;
using planner::Dim;
using planner::Evaluation;
using planner::get;

namespace {

std::vector<Dim> parse_search(const std::string& s) {
  std::vector<Dim> out;
  if (s.empty() || s == "all") return out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok.empty()) throw InputError("--search", "", fmt::format("empty key in '{}'", s));
    out.push_back(planner::parse_dim(tok));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string size_str(std::int64_t v) {
  if (v >= 1000000000 && v % 100000000 == 0) return fmt::format("{:g}e9", static_cast<double>(v) / 1e9);
  if (v >= 1000000 && v % 100000 == 0) return fmt::format("{:g}e6", static_cast<double>(v) / 1e6);
  if (v >= 1000 && v % 100 == 0) return fmt::format("{:g}e3", static_cast<double>(v) / 1e3);
  return fmt::format("{}", v);
}

// The knobs a candidate sets, in words, for the table and the comparisons.
std::string knob_value(const planner::Problem& pb, const Evaluation& e, Dim d) {
  const std::int64_t v = get(e.knobs, d);
  if (!planner::relevant(pb, e.knobs, d)) return "-";
  switch (d) {
    case Dim::activation_checkpointing:
    case Dim::offload_optimizer:
    case Dim::contiguous_gradients:
    case Dim::reduce_scatter:
    case Dim::use_multi_rank_bucket_allreduce:
      return v ? "on" : "off";
    case Dim::overlap_comm:
      return v < 0 ? (get(e.knobs, Dim::stage) == 3 ? "on" : "off") : (v ? "on" : "off");
    case Dim::stage:
    case Dim::micro_batch:
    case Dim::zero_hpz_partition_size:
      return fmt::format("{}", v);
    default:
      return size_str(v);
  }
}

std::string differences(const planner::Problem& pb, const Evaluation& a, const Evaluation& b) {
  std::string s;
  for (int d = 0; d < planner::kNumDims; ++d) {
    const Dim dim = static_cast<Dim>(d);
    const std::string va = knob_value(pb, a, dim), vb = knob_value(pb, b, dim);
    if (va == vb || ((va == "-" || vb == "-") && dim != Dim::stage)) continue;  // a knob one side does not have
    s += fmt::format("{}{} {} vs {}", s.empty() ? "" : ", ", planner::dim_name(dim), va, vb);
  }
  if (a.batch.gas != b.batch.gas) s += fmt::format(", GAS {} vs {}", a.batch.gas, b.batch.gas);
  return s.empty() ? "the same knobs" : s;
}

nlohmann::json evaluation_json(const planner::Problem& pb, const Evaluation& e) {
  nlohmann::json knobs = nlohmann::json::object();
  for (int d = 0; d < planner::kNumDims; ++d) {
    const Dim dim = static_cast<Dim>(d);
    if (!planner::relevant(pb, e.knobs, dim)) continue;
    const std::int64_t v = get(e.knobs, dim);
    switch (dim) {
      case Dim::activation_checkpointing:
      case Dim::offload_optimizer:
      case Dim::contiguous_gradients:
      case Dim::reduce_scatter:
      case Dim::use_multi_rank_bucket_allreduce:
        knobs[planner::dim_name(dim)] = v != 0;
        break;
      case Dim::overlap_comm:
        knobs[planner::dim_name(dim)] = v < 0 ? get(e.knobs, Dim::stage) == 3 : v != 0;
        break;
      default:
        knobs[planner::dim_name(dim)] = v;
    }
  }
  return {{"stage", get(e.knobs, Dim::stage)},
          {"micro_batch", e.batch.micro_batch},
          {"gradient_accumulation_steps", e.batch.gas},
          {"train_batch_size", e.batch.train_batch_size},
          {"knobs", knobs},
          {"rank", e.rank},
          {"fits", e.fits},
          {"memory", {{"peak_allocated_bytes", e.peak_allocated.v},
                      {"reserved_bytes", e.reserved.v},
                      {"device_used_bytes", e.device_used.v},
                      {"device_limit_bytes", e.device_limit.v},
                      {"margin", e.margin()},
                      {"host_bytes_per_node", e.host_per_node.v},
                      {"host_limit_bytes", e.host_limit.v},
                      {"peak_event", e.peak_event}}},
          {"time", {{"forward_ms", e.forward_ms},
                    {"backward_ms", e.backward_ms},
                    {"backward_allreduce_ms", e.backward_allreduce_ms},
                    {"step_ms", e.step_ms},
                    {"iteration_ms", e.iteration_ms},
                    {"phase_overlap_ms", e.phase_overlap_ms},
                    {"samples_per_s", e.samples_per_s},
                    {"tokens_per_s", e.tokens_per_s},
                    {"tflops", e.tflops},
                    {"mfu", e.mfu},
                    {"compute_bound_ms", e.compute_bound_ms}}},
          {"comm", {{"bytes_per_rank", e.comm_bytes}}},
          {"gpu_hours_per_million_tokens", e.gpu_hours_per_mtok},
          {"cost_per_million_tokens", e.cost_per_mtok},
          {"extrapolated_from_shorter_gas", e.extrapolated}};
}

std::string gib(Bytes b) { return fmt::format("{:.2f}", b.gib()); }

std::string table(const planner::Problem& pb, const std::vector<Evaluation>& rows, int top) {
  std::string t = fmt::format("{:>4} {:>5} {:>5} {:>5} {:>5} {:>7} {:>7} {:>7} {:>6} {:>4} {:>5} {:>22} {:>8} {:>7} {:>10} {:>6} {:>9}\n",
                              "rank", "stage", "micro", "gas", "ckpt", "offload", "rbs", "overlap", "contig", "rs",
                              "hpz", "s3 prefetch/persist/live", "mem_GiB", "margin", "samples/s", "mfu", "iter_ms");
  int n = 0;
  for (const auto& e : rows) {
    if (n >= top) break;
    ++n;
    const std::string s3 =
        get(e.knobs, Dim::stage) == 3
            ? fmt::format("{}/{}/{}", knob_value(pb, e, Dim::stage3_prefetch_bucket_size),
                          knob_value(pb, e, Dim::stage3_param_persistence_threshold),
                          knob_value(pb, e, Dim::stage3_max_live_parameters))
            : "-";
    t += fmt::format("{:>4} {:>5} {:>5} {:>5} {:>5} {:>7} {:>7} {:>7} {:>6} {:>4} {:>5} {:>22} {:>8} {:>6.1f}% {:>10.1f} {:>5.1f}% {:>9.1f}{}\n",
                     n, get(e.knobs, Dim::stage), e.batch.micro_batch, e.batch.gas,
                     knob_value(pb, e, Dim::activation_checkpointing), knob_value(pb, e, Dim::offload_optimizer),
                     knob_value(pb, e, Dim::reduce_bucket_size), knob_value(pb, e, Dim::overlap_comm),
                     knob_value(pb, e, Dim::contiguous_gradients), knob_value(pb, e, Dim::reduce_scatter),
                     knob_value(pb, e, Dim::zero_hpz_partition_size), s3, gib(e.device_used), 100.0 * e.margin(),
                     e.samples_per_s, 100.0 * e.mfu, e.iteration_ms, e.fits ? "" : "  does not fit");
  }
  return t;
}

// Why `w` beats `o`, from their predictions.
std::string why(const planner::Problem& pb, const Evaluation& w, const Evaluation& o, const std::string& name) {
  std::string s = fmt::format("- vs {} (stage {}, micro-batch {}): {}.\n", name, get(o.knobs, Dim::stage),
                              o.batch.micro_batch, differences(pb, w, o));
  if (!o.fits) {
    s += fmt::format("    it does not fit: {} GiB used of a {} GiB limit{}.\n", gib(o.device_used), gib(o.device_limit),
                     o.host_per_node > o.host_limit ? fmt::format(" (host: {} of {} GiB per node)", gib(o.host_per_node),
                                                                  gib(o.host_limit))
                                                    : "");
    return s;
  }
  const double gain = o.samples_per_s > 0 ? 100.0 * (w.samples_per_s / o.samples_per_s - 1.0) : 0.0;
  s += fmt::format("    {:+.1f}% samples/s ({:.1f} vs {:.1f}); iteration {:.1f} vs {:.1f} ms: forward {:+.1f} ms, "
                   "backward {:+.1f} ms (exposed communication {:.1f} vs {:.1f} ms), step {:+.1f} ms.\n",
                   gain, w.samples_per_s, o.samples_per_s, w.iteration_ms, o.iteration_ms, w.forward_ms - o.forward_ms,
                   w.backward_ms - o.backward_ms, w.backward_allreduce_ms, o.backward_allreduce_ms, w.step_ms - o.step_ms);
  if (w.phase_overlap_ms > 0.05 || o.phase_overlap_ms > 0.05)
    s += fmt::format("    (the phases are timed apart; in the iteration {:.1f} vs {:.1f} ms of them overlap: the ZeRO step's "
                     "loops run while the device finishes the backward)\n",
                     w.phase_overlap_ms, o.phase_overlap_ms);
  s += fmt::format("    memory {} vs {} GiB used ({:+.2f} GiB); communication {:.0f} vs {:.0f} MiB per rank per "
                   "iteration.\n",
                   gib(w.device_used), gib(o.device_used), (w.device_used - o.device_used).gib(), w.comm_bytes / 1048576.0,
                   o.comm_bytes / 1048576.0);
  const double bound_gap = 100.0 * (1.0 - w.compute_bound_ms / w.iteration_ms);
  if (name == "the runner-up" && w.compute_bound_ms > 0)
    s += fmt::format("    the winner spends {:.1f}% of its iteration beyond the compute stream's own work (communication "
                     "it does not hide, host work).\n",
                     bound_gap);
  return s;
}

// The winner's ds_config: BASE.json as it was, with only what the plan decided written
// over it: the batch keys whose value changes, and each searched key that matters at the
// winner's stage and differs from BASE's (in its canonical spelling, an alias spelling
// removed). Everything else, "auto" values included, stays exactly as in BASE.json, except the
// keys DeepSpeed 0.19 refuses, which are left out (their warning says so).
// Without BASE.json: the winner's configuration as zero::to_json writes it.
nlohmann::json winner_ds_config(const planner::Problem& pb, const planner::Space& space, const Evaluation& w,
                                const zero::DsConfig& wcfg) {
  using nlohmann::json;
  const json full = zero::to_json(wcfg);
  if (!pb.base.raw.is_object()) return full;
  json out = pb.base.raw;
  const auto same = [](const json& a, const json& b) { return zp::json::canonical(a) == zp::json::canonical(b); };
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
    if (full.contains(k) && !(out.contains(k) && same(out[k], full[k]))) out[k] = full[k];
  if (!out.contains("zero_optimization") || !out["zero_optimization"].is_object())
    out["zero_optimization"] = full.value("zero_optimization", json::object());
  json& z = out["zero_optimization"];
  const json& fz = full.value("zero_optimization", json::object());
  const auto write = [&](const std::string& key, const json& v) {
    const std::string alt = key.rfind("stage3_", 0) == 0 ? key.substr(7) : std::string();
    if (z.contains(key) && same(z[key], v)) return;
    if (!alt.empty() && z.contains(alt) && same(z[alt], v)) return;
    if (!alt.empty()) z.erase(alt);
    z[key] = v;
  };
  for (int d = 0; d < planner::kNumDims; ++d) {
    const Dim dim = static_cast<Dim>(d);
    if (space.values[static_cast<std::size_t>(d)].size() <= 1 || !planner::relevant(pb, w.knobs, dim)) continue;
    const std::int64_t v = get(w.knobs, dim);
    switch (dim) {
      case Dim::micro_batch:
        break;  // the batch keys above
      case Dim::activation_checkpointing:
        if (v && !out.contains("activation_checkpointing"))
          out["activation_checkpointing"] = full.value("activation_checkpointing", json::object());
        if (!v) out.erase("activation_checkpointing");
        break;
      case Dim::offload_optimizer: {
        const bool on = z.contains("offload_optimizer") && z["offload_optimizer"].is_object() &&
                        z["offload_optimizer"].value("device", "none") == "cpu";
        if (v && !on) z["offload_optimizer"] = fz.value("offload_optimizer", json{{"device", "cpu"}});
        if (!v && z.contains("offload_optimizer") && z["offload_optimizer"].is_object() &&
            z["offload_optimizer"].value("device", "none") != "none")
          z["offload_optimizer"]["device"] = "none";
        break;
      }
      case Dim::overlap_comm:
        if (v >= 0) write(planner::dim_name(dim), v != 0);
        break;
      case Dim::contiguous_gradients:
      case Dim::reduce_scatter:
      case Dim::use_multi_rank_bucket_allreduce:
        write(planner::dim_name(dim), v != 0);
        break;
      default:
        write(planner::dim_name(dim), v);
    }
  }
  zero::erase_refused_by_deepspeed(out);  // and nothing DeepSpeed 0.19 refuses (BASE may have it)
  return out;
}

std::string duration_text(double s) {
  if (s < 60) return fmt::format("{:.0f} s", s);
  if (s < 3600) return fmt::format("{:.0f} min {:02.0f} s", std::floor(s / 60), std::fmod(s, 60));
  return fmt::format("{:.0f} h {:02.0f} min", std::floor(s / 3600), std::floor(std::fmod(s, 3600) / 60));
}

// `plan --exhaustive` on stderr: the grid size at once, an estimate of the whole run once
// the first candidates are timed, then a progress bar (a line per 10% when stderr is not
// a terminal).
class ExhaustiveProgress {
 public:
  explicit ExhaustiveProgress(int threads) : threads_(threads), tty_(::isatty(STDERR_FILENO) != 0) {}

  void operator()(std::int64_t done, std::int64_t total) {
    using clock = std::chrono::steady_clock;
    const auto now = clock::now();
    if (done == 0) {
      start_ = last_ = now;
      std::fprintf(stderr, "exhaustive: %lld candidates to simulate (every point of the grid) on %d thread(s); "
                           "estimate after the first ones\n",
                   static_cast<long long>(total), threads_);
      return;
    }
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (!estimated_ && (elapsed >= 2.0 || done >= 8 * static_cast<std::int64_t>(threads_) || done == total)) {
      estimated_ = true;
      std::fprintf(stderr, "exhaustive: about %s in all (%.1f candidates/s so far); without --exhaustive the search "
                           "prunes the grid\n",
                   duration_text(elapsed / static_cast<double>(done) * static_cast<double>(total)).c_str(),
                   static_cast<double>(done) / std::max(elapsed, 1e-9));
    }
    const double frac = static_cast<double>(done) / static_cast<double>(total);
    const double left = elapsed / static_cast<double>(done) * static_cast<double>(total - done);
    if (tty_) {
      if (done != total && std::chrono::duration<double>(now - last_).count() < 0.25) return;
      last_ = now;
      constexpr int kWidth = 30;
      const int fill = static_cast<int>(frac * kWidth);
      std::fprintf(stderr, "\r[%s%s] %5.1f%%  %lld/%lld  %s left  ", std::string(static_cast<std::size_t>(fill), '#').c_str(),
                   std::string(static_cast<std::size_t>(kWidth - fill), '.').c_str(), 100.0 * frac,
                   static_cast<long long>(done), static_cast<long long>(total), duration_text(left).c_str());
      if (done == total) std::fprintf(stderr, "\n");
    } else {
      const int decile = static_cast<int>(frac * 10);
      if (decile == last_decile_) return;
      last_decile_ = decile;
      std::fprintf(stderr, "exhaustive: %3d%%  %lld/%lld  %s left\n", decile * 10, static_cast<long long>(done),
                   static_cast<long long>(total), duration_text(left).c_str());
    }
  }

 private:
  int threads_;
  bool tty_;
  bool estimated_ = false;
  int last_decile_ = 0;
  std::chrono::steady_clock::time_point start_, last_;
};

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == value;
}

// Why a verification run failed, from its log: the line zeroplan printed, else the first
// line that says something (mpirun frames its messages in rows of dashes).
std::string failure_reason(const std::string& log, bool no_measurements) {
  std::ifstream lf(log);
  std::string line, first, ours;
  while (std::getline(lf, line)) {
    if (line.rfind("zeroplan:", 0) == 0 && ours.empty()) ours = line;
    const bool says = std::any_of(line.begin(), line.end(), [](unsigned char c) { return std::isalpha(c) != 0; });
    if (says && first.empty()) first = line;
  }
  if (!ours.empty()) return ours;
  if (!first.empty()) return first;
  return no_measurements ? "no measurements were written" : "no output";
}

int run_and_wait(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc == -1) return -1;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

planner::Problem plan_problem(const PlanRequest& req, Inputs* inputs_out) {
  if (!std::isfinite(req.headroom) || req.headroom <= 0 || req.headroom > 1)
    throw InputError("--memory-headroom", "", fmt::format("must be in (0, 1], got {}", req.headroom));
  if (!std::isfinite(req.price) || req.price <= 0)
    throw InputError("--price-per-gpu-hour", "", fmt::format("must be a number > 0, got {}", req.price));
  if (req.top < 1) throw InputError("--top", "", fmt::format("must be an integer >= 1, got {}", req.top));
  if (req.threads < 0) throw InputError("--threads", "", fmt::format("must be >= 0 (0: every core), got {}", req.threads));
  if (req.verify_top < 1) throw InputError("--verify-top", "", fmt::format("must be an integer >= 1, got {}", req.verify_top));
  if (!std::isfinite(req.verify_max_minutes) || req.verify_max_minutes <= 0)
    throw InputError("--verify-max-minutes", "", fmt::format("must be a number > 0, got {}", req.verify_max_minutes));
  if (req.verify_device != "auto" && req.verify_device != "cpu" && req.verify_device != "cuda")
    throw InputError("--verify-device", "", fmt::format("must be cpu, cuda or auto, got '{}'", json::printable(req.verify_device)));
  if (req.verify_attention_kernel != "own" && req.verify_attention_kernel != "cudnn")
    throw InputError("--verify-attention-kernel", "",
                     fmt::format("must be own or cudnn, got '{}'", json::printable(req.verify_attention_kernel)));
  if (req.verify_attention_kernel == "cudnn" && req.verify_device == "cpu")
    throw InputError("--verify-attention-kernel", "", "cudnn needs GPUs (--verify-device cuda or auto)");
  if (req.verify_steps < 2)
    throw InputError("--verify-steps", "", fmt::format("must be an integer >= 2 (the first step is not timed), got {}", req.verify_steps));
  planner::Objective obj;
  if (req.objective == "throughput") obj = planner::Objective::throughput;
  else if (req.objective == "memory") obj = planner::Objective::memory;
  else if (req.objective == "cost") obj = planner::Objective::cost;
  else throw InputError("--objective", "", fmt::format("must be one of throughput, memory, cost, got '{}'", req.objective));
  if (req.base.micro_batch)
    throw InputError("--micro-batch", "", "plan searches the micro-batch; fix it with BASE.json and --search without micro_batch");
  SimRequest r = req.base;
  r.stages.clear();
  r.check_batch = false;
  Inputs in = load_inputs(r);
  planner::Problem pb;
  pb.model = in.model;
  pb.base = in.cfg;
  if (in.activation_checkpointing) pb.base.activation_checkpointing_present = true;
  pb.device = in.device;
  pb.cluster = in.cluster;
  pb.collectives = in.collectives;
  pb.profile = in.profile;
  pb.world_size = in.world_size;
  pb.seq_len = in.seq_len;
  pb.attention = in.attention;
  pb.transformers = in.transformers;
  pb.keep_output = in.keep_output;
  pb.objective = obj;
  pb.headroom = req.headroom;
  pb.price_per_gpu_hour = req.price;
  if (req.global_batch) pb.global_batch = *req.global_batch;
  else if (in.cfg.train_batch_size) pb.global_batch = *in.cfg.train_batch_size;
  else if (in.cfg.raw.is_object() && in.cfg.raw.value("train_batch_size", nlohmann::json()) == "auto")
    throw InputError("--global-batch", "",
                     fmt::format("{}'s train_batch_size is \"auto\" (a placeholder the Hugging Face Trainer fills in); "
                                 "give the global batch with --global-batch G",
                                 req.base.ds_config));
  else throw InputError("--global-batch", "", "give the global batch (train_batch_size), or a BASE.json that sets it");
  if (pb.global_batch < 1)
    throw InputError("--global-batch", "", fmt::format("must be an integer >= 1, got {}", pb.global_batch));
  if (inputs_out) *inputs_out = std::move(in);
  return pb;
}

PlanOutput run_plan(const PlanRequest& req, const char* argv0) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const std::string self_exe = ec ? std::string(argv0) : exe.string();
  Inputs in;
  const planner::Problem pb = plan_problem(req, &in);
  // --out is checked before the search: never one of the inputs, and writable (a
  // temporary is created in its folder and removed; the file itself is not touched).
  if (!req.out.empty()) {
    check_output(req.out, "--out", req.base, in);
  }
  const std::vector<Dim> dims = parse_search(req.search);
  const planner::Space space = planner::default_space(pb, dims);
  ExhaustiveProgress progress(req.threads > 0 ? req.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const planner::PlanResult res =
      req.exhaustive ? planner::exhaustive(pb, space, req.threads,
                                           [&progress](std::int64_t done, std::int64_t total) { progress(done, total); })
                     : planner::plan(pb, space, req.threads);
  PlanOutput out;
  out.problem = pb;
  out.result = res;
  out.warnings = in.warnings;
  std::string& t = out.text;
  const auto& st = res.stats;
  t += fmt::format("plan: {} on {} x {} ({}), global batch {}, seq-len {}, {}; objective {}\n", pb.model.name,
                   pb.world_size, pb.device->name, pb.cluster.name, pb.global_batch, pb.seq_len,
                   dtype_name(pb.base.model_dtype()), planner::objective_name(pb.objective));
  t += fmt::format("memory limit: {:.0f}% of {} GiB per GPU = {} GiB; host {} GiB per node for offload\n",
                   100 * pb.headroom, gib(pb.device->memory),
                   gib(Bytes{static_cast<std::int64_t>(pb.headroom * static_cast<double>(pb.device->memory.v))}),
                   gib(Bytes{static_cast<std::int64_t>(pb.headroom * static_cast<double>(pb.cluster.host_memory_per_node().v))}));
  std::string searched;
  for (int d = 0; d < planner::kNumDims; ++d)
    if (space.values[static_cast<std::size_t>(d)].size() > 1)
      searched += fmt::format("{}{}", searched.empty() ? "" : ", ", planner::dim_name(static_cast<Dim>(d)));
  t += fmt::format("searched: {}\n", searched.empty() ? "nothing (every dimension fixed)" : searched);
  t += fmt::format("{} {} candidates in {} shapes evaluated in {:.2f} s on {} thread(s): {:.0f} candidates/s; {} by full "
                   "simulation ({:.0f} simulations/s)",
                   req.exhaustive ? "exhaustive:" : "search:", st.grid, st.shapes, st.seconds, st.threads,
                   static_cast<double>(st.grid) / st.seconds, st.simulated, static_cast<double>(st.simulated) / st.seconds);
  if (!req.exhaustive)
    t += fmt::format("; {} ruled out by their memory lower bound; shapes dropped: {} (no point under the memory bound), "
                     "{} (memory-frugal point does not fit), {} ({})",
                     st.pruned_memory_bound, st.shapes_pruned_states, st.shapes_pruned_memory, st.shapes_pruned_bound,
                     pb.objective == planner::Objective::memory ? "frugal point above the best memory"
                                                                : "throughput bound below the best");
  t += "\n\n";

  nlohmann::json j;
  j["model"] = pb.model.name;
  j["cluster"] = {{"name", pb.cluster.name}, {"nodes", pb.cluster.nodes}, {"gpus_per_node", pb.cluster.gpus_per_node},
                  {"gpu", pb.device->name}};
  j["world_size"] = pb.world_size;
  j["global_batch"] = pb.global_batch;
  j["seq_len"] = pb.seq_len;
  j["objective"] = planner::objective_name(pb.objective);
  j["memory_headroom"] = pb.headroom;
  j["candidates_evaluated"] = st.grid;  // every point: by its memory bound, and the promising ones simulated
  j["candidates_simulated"] = st.simulated;
  j["search_seconds"] = st.seconds;
  j["search"] = {{"mode", req.exhaustive ? "exhaustive" : "search"},
                 {"threads", st.threads},
                 {"shapes", st.shapes},
                 {"candidates_over_memory_bound", st.pruned_memory_bound},
                 {"shapes_pruned_model_states", st.shapes_pruned_states},
                 {"shapes_pruned_memory", st.shapes_pruned_memory},
                 {"shapes_pruned_throughput_bound", st.shapes_pruned_bound}};
  j["ranked"] = nlohmann::json::array();
  for (int i = 0; i < static_cast<int>(res.ranked.size()) && i < req.top; ++i)
    j["ranked"].push_back(evaluation_json(pb, res.ranked[static_cast<std::size_t>(i)]));

  if (!res.any_fits()) {
    t += "nothing fits: no configuration of the grid stays within the memory limit.\n";
    if (!res.ranked.empty()) {
      t += "closest candidates (by memory):\n";
      t += table(pb, res.ranked, std::min(req.top, 5));
    }
    const auto sugg = planner::suggest_when_nothing_fits(pb, space, req.threads);
    t += "\nwhat would fit (each change alone, smallest first; the most frugal candidate under it):\n";
    nlohmann::json sj = nlohmann::json::array();
    const planner::Suggestion* first = nullptr;
    for (const auto& sg : sugg) {
      if (sg.fits && !first) first = &sg;
      if (sg.best)
        t += fmt::format("  {:<44} {:>9} GiB used of {} GiB{}{}\n", sg.change, gib(sg.best->device_used),
                         gib(sg.best->device_limit), sg.fits ? fmt::format(", {:.1f} samples/s", sg.best->samples_per_s) : "",
                         sg.fits ? "" : "  (still does not fit)");
      sj.push_back({{"change", sg.change}, {"fits", sg.fits},
                    {"candidate", sg.best ? evaluation_json(pb, *sg.best) : nlohmann::json()}});
    }
    if (first) t += fmt::format("smallest change that fits: {}.\n", first->change);
    else t += "none of these changes alone fits; combine them, or use more GPUs than tried here.\n";
    j["best"] = nullptr;
    j["nothing_fits"] = true;
    j["suggestions"] = sj;
    if (!req.out.empty()) {
      // No winner, no ds_config: the file is not written, and an older one is not passed off as this plan's.
      std::error_code exists_ec;
      const std::string line =
          fmt::format("--out {}: not written: nothing fits{}", req.out,
                      fs::exists(req.out, exists_ec) ? "; the file there is from before and is not a result of this plan" : "");
      t += fmt::format("\n{} (exit status {})\n", line, kExitNothingFits);
      out.warnings.push_back(line);
      j["ds_config_written"] = false;
    }
    out.exit_code = kExitNothingFits;
    out.json = std::move(j);
    return out;
  }

  const Evaluation& w = res.ranked.front();
  std::vector<Evaluation> fitting;
  for (const auto& e : res.ranked)
    if (e.fits) fitting.push_back(e);
  t += table(pb, fitting, req.top);
  t += "the best candidate of each shape that fits; sizes in elements; mem_GiB: predicted device-used bytes (reserved "
       "+ context) of the heaviest rank; margin: to the memory limit\n";
  if (!in.uncertainty_source.empty() && pb.objective != planner::Objective::memory) {
    // A profile's (or a measured preset's) predictions carry an interval: candidates whose
    // iteration-time intervals overlap the winner's are ties, not a ranking (the global batch
    // is fixed, so iteration time orders throughput and cost alike).
    const double s = in.profile_rel_sd;
    std::vector<int> ties;
    // Ranks as JSON's `ranked` lists them (what does not fit is no tie).
    for (std::size_t i = 1; i < res.ranked.size() && static_cast<int>(i) < req.top; ++i)
      if (const Evaluation& e = res.ranked[i]; e.fits && e.iteration_ms * (1 - s) <= w.iteration_ms * (1 + s))
        ties.push_back(static_cast<int>(i) + 1);
    t += fmt::format("with {}: iteration times carry ±{:.1f}% (one standard deviation; {}); the winner's is "
                     "{:.1f}-{:.1f} ms\n",
                     in.uncertainty_source, 100 * s, in.profile_basis, w.iteration_ms * (1 - s), w.iteration_ms * (1 + s));
    if (ties.empty()) {
      t += "no other candidate's interval overlaps the winner's: the ranking holds within that error\n";
    } else {
      std::string list;
      for (int r : ties) list += fmt::format("{}{}", list.empty() ? "" : ", ", r);
      t += fmt::format("ties: rank{} {} overlap{} the winner's interval: within that error they are as good "
                       "as the winner, which is first only by the point estimate\n",
                       ties.size() == 1 ? "" : "s", list, ties.size() == 1 ? "s" : "");
    }
    if (!in.profile_file.empty())
      j["profile"] = {{"file", in.profile_file}, {"iteration_rel_sd", s}, {"basis", in.profile_basis}};
    j["uncertainty"] = {{"source", in.uncertainty_source}, {"iteration_rel_sd", s}, {"basis", in.profile_basis}};
    j["ties_with_winner"] = ties;
  }
  const zero::DsConfig wcfg = planner::config_of(pb, w.knobs);
  const nlohmann::json ds = winner_ds_config(pb, space, w, wcfg);
  nlohmann::json best = evaluation_json(pb, w);
  best["ds_config"] = ds;
  j["best"] = best;

  t += fmt::format("\nwinner: stage {}, micro-batch {} x GAS {}: {:.1f} samples/s, {:.1f}% MFU, {} GiB of {} GiB\n",
                   get(w.knobs, Dim::stage), w.batch.micro_batch, w.batch.gas, w.samples_per_s, 100 * w.mfu,
                   gib(w.device_used), gib(w.device_limit));
  if (pb.objective == planner::Objective::cost)
    t += fmt::format("  {:.4g} GPU-hours per million tokens, {:.4g} at {:g} per GPU-hour (on a fixed cluster the cheapest "
                     "is the fastest)\n",
                     w.gpu_hours_per_mtok, w.cost_per_mtok, pb.price_per_gpu_hour);
  if (get(w.knobs, Dim::activation_checkpointing))
    t += "  it checkpoints activations per layer: enable it in the model (HF: model.gradient_checkpointing_enable());\n"
         "  the ds_config carries an activation_checkpointing section for DeepSpeed's own checkpointing API\n";
  t += "why:\n";
  std::vector<std::pair<std::string, Evaluation>> rivals;
  if (res.ranked.size() > 1 && res.ranked[1].fits) rivals.emplace_back("the runner-up", res.ranked[1]);
  for (int step : {-1, 1}) {
    const std::int64_t s = get(w.knobs, Dim::stage) + step;
    const auto& stages = space.values[static_cast<std::size_t>(Dim::stage)];
    if (std::find(stages.begin(), stages.end(), s) == stages.end()) continue;
    if (!rivals.empty() && get(rivals.front().second.knobs, Dim::stage) == s) continue;
    // The best candidate of that stage the search simulated, or the winner moved there.
    std::optional<Evaluation> r;
    for (const auto& e : res.ranked)
      if (get(e.knobs, Dim::stage) == s && e.fits) { r = e; break; }
    std::string name = fmt::format("the best at stage {} found", s);
    if (!r) {
      planner::Space one = space;
      for (int d = 0; d < planner::kNumDims; ++d) one.values[static_cast<std::size_t>(d)] = {w.knobs[static_cast<std::size_t>(d)]};
      one.values[static_cast<std::size_t>(Dim::stage)] = {s};
      one.values[static_cast<std::size_t>(Dim::micro_batch)] = space.values[static_cast<std::size_t>(Dim::micro_batch)];
      const auto sub = planner::plan(pb, one, req.threads);
      if (!sub.ranked.empty()) r = sub.ranked.front();
      name = fmt::format("stage {} with the winner's knobs", s);
    }
    if (r) rivals.emplace_back(name, *r);
  }
  for (const auto& [name, e] : rivals) t += why(pb, w, e, name);
  if (rivals.empty()) t += "- it is the only candidate that fits.\n";

  if (req.explain && res.ranked.size() > 1 && res.ranked[1].fits) {
    ExplainRequest er;
    er.base = req.base;
    er.base.json = false;
    er.base.micro_batch.reset();
    er.suggest = false;
    er.given = std::array<ExplainRequest::Given, 2>{
        ExplainRequest::Given{"runner-up", planner::config_of(pb, res.ranked[1].knobs),
                              get(res.ranked[1].knobs, Dim::activation_checkpointing) != 0},
        ExplainRequest::Given{"winner", wcfg, get(w.knobs, Dim::activation_checkpointing) != 0}};
    const auto ex = explain(er);
    t += "\nexplain (runner-up vs winner, the same simulation as `zeroplan explain`):\n" + ex.text;
    j["explain"] = ex.json;
  }

  if (!req.out.empty()) {
    io::write_atomic(req.out, ds.dump(2) + "\n", "--out");
    j["ds_config_written"] = true;
    t += fmt::format("\nds_config written to {}\n", req.out);
  } else {
    t += fmt::format("\nds_config (--out FILE writes it):\n{}\n", ds.dump(2));
  }

  if (req.verify) {
    // Run the executor on the top candidates for a few steps and lay them beside the plan.
    const fs::path dir = fs::temp_directory_path() / fmt::format("zeroplan-verify-{}", ::getpid());
    fs::create_directories(dir);
    const std::string launcher = req.verify_launcher.empty() ? "mpirun --oversubscribe -np {N}" : req.verify_launcher;
    // OpenMPI's mpirun refuses to start as root unless told twice; say so instead of
    // running every candidate into the same wall.
    const bool root_refused = req.verify_launcher.empty() && ::geteuid() == 0 &&
                              !(env_is("OMPI_ALLOW_RUN_AS_ROOT", "1") && env_is("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"));
    const std::string root_reason =
        "not run: mpirun refuses to run as root unless OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
        "are set (or give --verify-launcher)";
    const bool on_gpu = req.verify_device == "cuda" || (req.verify_device == "auto" && exec::cuda_devices_visible() > 0);
    std::string launch = launcher;
    if (const auto pos = launch.find("{N}"); pos != std::string::npos) launch.replace(pos, 3, std::to_string(pb.world_size));
    t += fmt::format("\nverify: {} steps of the top {} on the executor ({} ranks, {} + MPI; launcher: {})\n",
                     req.verify_steps, req.verify_top, pb.world_size, on_gpu ? "CUDA" : "CPU", launch);
    const bool comparable_time = on_gpu ? pb.device->arch != "cpu" : pb.device->arch == "cpu";
    if (!comparable_time)
      t += fmt::format("  the executor runs on {}, so its throughput is not the {} prediction; memory bytes are "
                       "device-independent and compared exactly\n",
                       on_gpu ? "this machine's GPUs" : "CPU ranks", pb.device->name);
    // The plan prices DeepSpeed's own work (its Python on the host, per-tensor loops, stage
    // 3's separate bias adds); the executor does none of it, so each candidate is predicted
    // again as the executor runs it, and the ranking is checked against that prediction.
    planner::Problem exec_pb = pb;
    exec_pb.deepspeed = false;
    exec_pb.cudnn_attention = on_gpu && req.verify_attention_kernel == "cudnn";
    exec_pb.stages_products = on_gpu;  // the CPU device runs every product in place
    planner::GraphCache exec_graphs(exec_pb);
    t += "  pred_samples/s: the plan's (DeepSpeed's); exec_pred: the same candidate as zeroplan's executor runs it\n";
    t += fmt::format("  {:>4} {:>5} {:>5} {:>16} {:>16} {:>7} {:>14} {:>14} {:>14}\n", "rank", "stage", "micro",
                     "pred_peak_B", "meas_peak_B", "equal", "pred_samples/s", "exec_pred", "meas_samples/s");
    nlohmann::json vj = nlohmann::json::array();
    std::vector<std::pair<double, double>> order;  // (predicted for the executor, measured)
    int n = 0;
    // What a CPU rank would compute: the model FLOPs of a step (a third more with
    // recomputation) at the CPU's fp32 peak, an optimistic estimate.
    const double cpu_flops = sim::find_device("cpu").peak_fp32_flops.v;
    for (const auto& e : res.ranked) {
      if (n >= req.verify_top || !e.fits) break;
      ++n;
      {
        models::GraphOptions go;
        go.micro_batch = e.batch.micro_batch;
        go.seq_len = pb.seq_len;
        go.act_dtype = pb.base.model_dtype();
        go.attention = pb.attention;
        go.transformers = pb.transformers;
        go.gradient_checkpointing = get(e.knobs, Dim::activation_checkpointing) != 0;
        const auto g = models::build_graph(pb.model, go);
        const double step_flops = (g.fwd_flops().v * (get(e.knobs, Dim::activation_checkpointing) ? 2.0 : 1.0) +
                                   g.bwd_flops().v) * static_cast<double>(e.batch.gas);
        const double minutes = step_flops / cpu_flops * req.verify_steps / 60.0;
        if (!on_gpu && minutes > req.verify_max_minutes) {
          const std::string why = fmt::format(
              "skipped: {} steps would take at least {:.0f} min on a CPU rank ({:.1f} TFLOP per rank per step at "
              "{:.0f} GFLOP/s); use a smaller model or sequence, or --verify-max-minutes",
              req.verify_steps, minutes, step_flops / 1e12, cpu_flops / 1e9);
          t += fmt::format("  {:>4} {:>5} {:>5}  {}\n", n, get(e.knobs, Dim::stage), e.batch.micro_batch, why);
          vj.push_back({{"rank", n}, {"stage", get(e.knobs, Dim::stage)}, {"micro_batch", e.batch.micro_batch},
                        {"skipped", why}});
          continue;
        }
      }
      if (root_refused) {
        t += fmt::format("  {:>4} {:>5} {:>5}  {}\n", n, get(e.knobs, Dim::stage), e.batch.micro_batch, root_reason);
        vj.push_back({{"rank", n}, {"stage", get(e.knobs, Dim::stage)}, {"micro_batch", e.batch.micro_batch},
                      {"skipped", root_reason}});
        continue;
      }
      const fs::path cfgp = dir / fmt::format("candidate{}.json", n);
      const fs::path meas = dir / fmt::format("candidate{}.measured.json", n);
      io::write_atomic(cfgp.string(), zero::to_json(planner::config_of(pb, e.knobs)).dump(2) + "\n", "--verify");
      std::string cmd = fmt::format("{} {} train --model {} --ds-config {} --steps {} --seq-len {} --out {}", launch,
                                    shell_quote(self_exe), shell_quote(req.base.model), shell_quote(cfgp.string()),
                                    req.verify_steps, pb.seq_len, shell_quote(meas.string()));
      cmd += fmt::format(" --attention {} --transformers {} --workspaces-of {}", models::attention_name(pb.attention),
                         models::transformers_name(pb.transformers), shell_quote(pb.device->name));
      if (pb.keep_output) cmd += " --keep-output";
      if (on_gpu) cmd += " --device cuda";
      if (exec_pb.cudnn_attention) cmd += " --attention-kernel cudnn";
      if (get(e.knobs, Dim::activation_checkpointing)) cmd += " --activation-checkpointing";
      const fs::path log = dir / fmt::format("candidate{}.log", n);
      cmd += fmt::format(" > {} 2>&1", shell_quote(log.string()));
      const int rc = run_and_wait(cmd);
      const std::string mfile = pb.world_size == 1 ? meas.string()
                                                   : (meas.parent_path() / fmt::format("{}.rank{}.json", meas.stem().string(), e.rank)).string();
      nlohmann::json row = {{"rank", n}, {"stage", get(e.knobs, Dim::stage)}, {"micro_batch", e.batch.micro_batch},
                            {"predicted_peak_allocated_bytes", e.peak_allocated.v},
                            {"predicted_samples_per_s", e.samples_per_s}, {"exit_status", rc}};
      std::ifstream mf(mfile);
      if (rc != 0 || !mf) {
        const std::string last = failure_reason(log.string(), rc == 0);
        t += fmt::format("  {:>4} {:>5} {:>5}  not run here (exit {}): {}\n", n, get(e.knobs, Dim::stage),
                         e.batch.micro_batch, rc, last);
        row["error"] = last;
        vj.push_back(row);
        continue;
      }
      const nlohmann::json m = zp::json::parse_file(mfile, io::kDocumentMaxBytes, "a measurement (train --out)");
      const std::int64_t peak = m["memory"]["peak_allocated"].get<std::int64_t>();
      const double sps = m["samples_per_s"].get<double>();
      exec_graphs.get(e.batch.micro_batch, get(e.knobs, Dim::activation_checkpointing) != 0);
      const double exec_sps = planner::evaluate(exec_pb, exec_graphs, e.knobs).samples_per_s;
      t += fmt::format("  {:>4} {:>5} {:>5} {:>16} {:>16} {:>7} {:>14.1f} {:>14.1f} {:>14.1f}\n", n,
                       get(e.knobs, Dim::stage), e.batch.micro_batch, e.peak_allocated.v, peak,
                       peak == e.peak_allocated.v ? "yes" : "NO", e.samples_per_s, exec_sps, sps);
      row["measured_peak_allocated_bytes"] = peak;
      row["measured_samples_per_s"] = sps;
      row["executor_predicted_samples_per_s"] = exec_sps;
      row["memory_equal"] = peak == e.peak_allocated.v;
      vj.push_back(row);
      order.emplace_back(exec_sps, sps);
    }
    // The ranking holds when every pair the executor's prediction tells apart (by more than
    // 2%) is measured in the same order, whichever of the two the plan put first; closer pairs
    // are ties the prediction does not claim to order.
    bool held = true;
    const auto inverted = [](const std::pair<double, double>& a, const std::pair<double, double>& b) {
      return a.first > 1.02 * b.first && a.second < b.second;
    };
    for (std::size_t i = 0; i < order.size(); ++i)
      for (std::size_t k = i + 1; k < order.size(); ++k)
        if (inverted(order[i], order[k]) || inverted(order[k], order[i])) held = false;
    if (order.size() > 1)
      t += fmt::format("  ranking by measured samples/s against exec_pred {} (pairs predicted within 2% count as ties){}\n",
                       held ? "held" : "did NOT hold",
                       comparable_time ? "" : on_gpu ? " (this machine's GPUs; the prediction is for the planned cluster)" : " (CPU ranks; the prediction is for the GPU cluster)");
    t += fmt::format("  configs, logs and measurements: {}\n", dir.string());
    j["verify"] = {{"candidates", vj}, {"ranking_held", order.size() > 1 ? nlohmann::json(held) : nlohmann::json()},
                   {"directory", dir.string()}};
  }
  out.json = std::move(j);
  return out;
}

}  // namespace zp::cli
