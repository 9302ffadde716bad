// DeepSpeed training logs (wall_clock_breakdown) and recorded DeepSpeed runs → phase observations.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "calibration/sources.hpp"
#include "core/error.hpp"
#include "core/json_util.hpp"
#include "models/model_config.hpp"
#include "sim/compute_model.hpp"

namespace zp::calibration {

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", fmt::format("cannot open the {}", what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r"));
  s.erase(s.find_last_not_of(" \t\r") + 1);
  return s;
}

// "  world_size ................... 4" (DeepSpeedConfig.print): the value after the dots.
std::optional<std::string> config_value(const std::string& line, const std::string& key) {
  const std::string pat = " " + key + " ";
  const auto p = line.find(pat);
  if (p == std::string::npos) return std::nullopt;
  std::size_t q = p + pat.size();
  while (q < line.size() && (line[q] == '.' || line[q] == ' ')) ++q;
  if (q == p + pat.size() || q >= line.size()) return std::nullopt;
  return trim(line.substr(q));
}

std::optional<int> as_int(const std::string& s) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') return std::nullopt;
  return static_cast<int>(v);
}

// Relative standard deviation of the values (0 for fewer than two).
double spread(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return m > 0 ? std::sqrt(s / static_cast<double>(v.size() - 1)) / m : 0;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void apply_module_dtype(Dataset& ds, zero::DsConfig& cfg, const models::ModelConfig& mc) {
  if (std::string note = zero::apply_module_dtype(cfg, mc.torch_dtype, mc.source, mc.torch_dtype_key); !note.empty())
    if (std::find(ds.warnings.begin(), ds.warnings.end(), note) == ds.warnings.end()) ds.warnings.push_back(std::move(note));
}

std::string model_stem(const std::string& model) {
  const fs::path p(model);
  if (p.has_extension() && p.extension() == ".json") return p.stem().string();
  return p.filename().string();
}

// The host probe a recorded run's times were taken at (tools/deepspeed_reference.py: µs per eager
// op, [before, after] its timed steps): the median over its time-only rounds of each round's
// mean where its times come from rounds (timing.rounds_s, not empty), else its own; 0 where not
// recorded (a round without one makes the run's 0: its times are not all at a known probe).
static double recorded_probe(const std::string& path, const json::Reader& r, const nlohmann::json& e) {
  auto mean_of = [&](const json::Reader& pr, const nlohmann::json& v) {
    if (!v.is_array() || v.size() != 2)
      throw InputError(path, pr.path, fmt::format("must be [before, after]: two host probes in microseconds, got {}",
                                                  v.dump()));
    double sum = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number() || !(v[i].get<double>() > 0) || v[i].get<double>() > sim::kMaxHostProbeUs)
        throw InputError(path, fmt::format("{}[{}]", pr.path, i),
                         fmt::format("must be a host probe in microseconds in (0, {:g}], got {}", sim::kMaxHostProbeUs,
                                     v[i].dump()));
      sum += v[i].get<double>();
    }
    return sum / 2;
  };
  if (auto t = e.find("timing"); t != e.end()) {
    const json::Reader tr = r.sub("timing");
    if (!t->is_object()) throw InputError(path, tr.path, "must be a JSON object (tools/deepspeed_compare.py --timing)");
    if (auto rs = t->find("rounds_s"); rs != t->end()) {
      const json::Reader rr = tr.sub("rounds_s");
      if (!rs->is_array()) throw InputError(path, rr.path, "must be an array of the time-only rounds");
      if (!rs->empty()) {
        std::vector<double> probes;
        for (std::size_t i = 0; i < rs->size(); ++i) {
          const json::Reader ri{rr.file, fmt::format("{}[{}]", rr.path, i)};
          if (!(*rs)[i].is_object()) throw InputError(path, ri.path, "must be a JSON object (one time-only round)");
          if (!(*rs)[i].contains("host_probe_us")) return 0;
          probes.push_back(mean_of(ri.sub("host_probe_us"), (*rs)[i].at("host_probe_us")));
        }
        return median(std::move(probes));
      }
    }
  }
  if (auto h = e.find("host_probe_us"); h != e.end()) return mean_of(r.sub("host_probe_us"), *h);
  return 0;
}

// Tags for `--fit-where` and a RunConfig from what a run is.
RunConfig make_run(const std::string& name, const std::string& source, const std::string& model,
                   const zero::DsConfig& cfg, std::int64_t seq_len, models::Attention att, int world, bool ckpt) {
  RunConfig r;
  r.name = name;
  r.source = source;
  r.model = model;
  r.cfg = cfg;
  r.seq_len = seq_len;
  r.attention = att;
  r.world_size = world;
  r.activation_checkpointing = ckpt;
  const zero::Batch b = zero::resolve_batch(cfg, world);
  r.tags = {{"run", name},
            {"model", model_stem(model)},
            {"stage", std::to_string(cfg.zero.stage)},
            {"dtype", std::string(dtype_name(cfg.model_dtype()))},
            {"attention", models::attention_name(att)},
            {"micro_batch", std::to_string(b.micro_batch)},
            {"gas", std::to_string(b.gas)},
            {"world_size", std::to_string(world)},
            {"overlap_comm", cfg.zero.overlap() ? "true" : "false"},
            {"seq_len", std::to_string(seq_len)}};
  return r;
}

void add_phase(Dataset& ds, int run, PhaseName ph, Quantity q, double seconds, double rel_spread, int repeats,
               bool fit, const std::string& source, const std::string& src_tag) {
  Observation o;
  o.kind = ObsKind::phase;
  o.source = source;
  o.phase = {run, ph, q};
  o.measured = Seconds{seconds};
  o.spread = rel_spread;
  o.repeats = repeats;
  o.fit = fit;
  const RunConfig& r = ds.runs[static_cast<std::size_t>(run)];
  o.label = fmt::format("{}: {} ({})", r.name, phase_label(ph), quantity_name(q));
  o.tags = r.tags;
  o.tags["source"] = src_tag;
  o.tags["kind"] = "phase";
  o.tags["phase"] = phase_label(ph);
  o.tags["quantity"] = quantity_name(q);
  ds.obs.push_back(std::move(o));
}

namespace {

void check_time(const std::string& file, const std::string& key, double v) {
  if (!std::isfinite(v) || v <= 0)
    throw InputError(file, key, fmt::format("must be a positive time in seconds, got {}", std::isfinite(v) ? fmt::format("{}", v) : "NaN or infinite"));
}

// The phases DeepSpeed's timers measure, by their key in a recorded run.
const std::pair<const char*, PhaseName> kTimedPhases[] = {
    {"forward", PhaseName::forward}, {"backward", PhaseName::backward}, {"step", PhaseName::step}};

// f(phase, value, reader of the object, key) for each timed phase present in the object
// e[key] (absent: nothing; not an object: an InputError naming it).
template <class F>
void for_each_timed_phase(const nlohmann::json& e, const json::Reader& r, const char* key, F&& f) {
  const auto g = e.find(key);
  if (g == e.end()) return;
  const json::Reader gr = r.sub(key);
  r.require_object(*g, key);
  for (const auto& [name, p] : kTimedPhases)
    if (g->contains(name)) f(p, g->at(name), gr, std::string(name));
}

}  // namespace

DeepSpeedLog parse_deepspeed_log(const std::string& path, const std::string& text) {
  DeepSpeedLog log;
  std::istringstream in(text);
  std::string raw;
  int lineno = 0;
  const bool ends_mid_line = !text.empty() && text.back() != '\n';
  std::size_t total_lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + (ends_mid_line ? 1 : 0);
  int micro_lines = 0;
  std::optional<int> rank_used;
  while (std::getline(in, raw)) {
    ++lineno;
    const std::string line = trim(raw);
    if (auto p = line.find("DeepSpeed info: version="); p != std::string::npos) {
      std::string v = line.substr(p + 24);
      log.version = v.substr(0, v.find(','));
      continue;
    }
    if (auto p = line.find("DeepSpeed Final Optimizer = "); p != std::string::npos) {
      log.optimizer = trim(line.substr(p + 28));
      continue;
    }
    if (line.find("[config.py") != std::string::npos || line.find("config.py:") != std::string::npos) {
      if (auto v = config_value(line, "world_size")) log.world_size = as_int(*v);
      if (auto v = config_value(line, "train_micro_batch_size_per_gpu")) log.micro_batch = as_int(*v);
      if (auto v = config_value(line, "gradient_accumulation_steps")) log.gas = as_int(*v);
      if (auto v = config_value(line, "zero_optimization_stage")) log.stage = as_int(*v);
      if (auto v = config_value(line, "wall_clock_breakdown")) log.wall_clock_breakdown = *v == "True";
      continue;
    }
    const auto t = line.find("time (ms) |");
    if (t == std::string::npos) continue;
    int rank = 0;
    if (const auto r = line.rfind("[Rank ", t); r != std::string::npos) rank = std::atoi(line.c_str() + r + 6);
    // "| name: value" segments.
    std::map<std::string, double> vals;
    std::string rest = line.substr(t + 11);
    bool bad = false;
    std::string bad_text;
    std::size_t pos = 0;
    while (pos < rest.size()) {
      const std::size_t bar = rest.find('|', pos);
      const std::string seg = trim(rest.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos));
      pos = bar == std::string::npos ? rest.size() : bar + 1;
      if (seg.empty()) continue;
      const auto colon = seg.find(':');
      if (colon == std::string::npos) {
        bad = true;
        bad_text = seg;
        continue;
      }
      const std::string name = trim(seg.substr(0, colon));
      const std::string val = trim(seg.substr(colon + 1));
      char* end = nullptr;
      const double v = std::strtod(val.c_str(), &end);
      if (val.empty() || end != val.c_str() + val.size()) {
        bad = true;
        bad_text = seg;
        continue;
      }
      if (!std::isfinite(v) || v < 0)
        throw InputError(path, fmt::format("line {}", lineno),
                         fmt::format("timer {} is {}: DeepSpeed's timers are non-negative milliseconds", name, val));
      vals[name] = v;
    }
    const bool last = static_cast<std::size_t>(lineno) == total_lines;
    const bool global = vals.count("fwd") || vals.count("bwd") || vals.count("step");
    const bool micro = vals.count("fwd_microstep") || vals.count("bwd_microstep") || vals.count("step_microstep");
    if (micro) ++micro_lines;
    if (!global) continue;
    // A line cut short (the run was killed while printing) lacks its last timers.
    const bool complete = vals.count("fwd") && vals.count("bwd") && vals.count("step") && !bad;
    if (!complete) {
      if (last && ends_mid_line) {
        log.warnings.push_back(fmt::format("{}: line {}: the last timer line is cut short; left out", path, lineno));
        continue;
      }
      throw InputError(path, fmt::format("line {}", lineno),
                       bad ? fmt::format("unreadable timer '{}' (expected 'name: milliseconds')", json::printable(bad_text))
                           : "a timer line without fwd, bwd and step (expected '| fwd: ms | bwd: ms | ... | step: ms')");
    }
    if (rank_used && *rank_used != rank) {
      if (rank > *rank_used) continue;  // keep the lowest rank's lines
      log.steps.clear();
    }
    rank_used = rank;
    DeepSpeedLog::Step s;
    s.line = lineno;
    s.fwd_ms = vals["fwd"];
    s.bwd_ms = vals["bwd"];
    s.step_ms = vals["step"];
    if (vals.count("bwd_inner")) s.bwd_inner_ms = vals["bwd_inner"];
    if (vals.count("bwd_allreduce")) s.bwd_allreduce_ms = vals["bwd_allreduce"];
    log.steps.push_back(s);
  }
  log.rank = rank_used.value_or(0);
  if (log.steps.empty()) {
    if (micro_lines > 0)
      throw InputError(path, "",
                       "only per-micro-step timer lines (fwd_microstep, ...); the per-step lines ('time (ms) | fwd: ... | "
                       "step: ...') come at each gradient-accumulation boundary: the log was cut before the first");
    throw InputError(path, "",
                     "no DeepSpeed timer lines ('[Rank 0] time (ms) | fwd: ... | bwd: ... | step: ...'): not a DeepSpeed "
                     "training log, or wall_clock_breakdown was not true in its ds_config");
  }
  return log;
}

Dataset read_deepspeed_log(const std::string& log_path, const RunArgs& args, const sim::ClusterSpec& cluster) {
  const DeepSpeedLog log = parse_deepspeed_log(log_path, read_text(log_path, "DeepSpeed log"));
  Dataset ds;
  ds.files.push_back(log_path);
  ds.warnings = log.warnings;
  if (args.model.empty())
    throw InputError("--model", "", fmt::format("a DeepSpeed log ({}) needs the model it trained (--model)", log_path));
  if (args.ds_config.empty())
    throw InputError("--ds-config", "", fmt::format("a DeepSpeed log ({}) needs the ds_config it ran with (--ds-config)", log_path));
  const models::ModelConfig mc = models::load_model(args.model);
  zero::DsConfig cfg = zero::load_ds_config(args.ds_config);
  apply_module_dtype(ds, cfg, mc);
  if (args.micro_batch) {
    cfg.train_micro_batch_size_per_gpu = *args.micro_batch;
    if (cfg.train_batch_size) cfg.gradient_accumulation_steps.reset();
  }
  int world = args.world_size > 0 ? args.world_size : log.world_size.value_or(cluster.world_size());
  if (log.world_size && *log.world_size != world)
    throw InputError(log_path, "world_size",
                     fmt::format("the log's DeepSpeed ran on {} ranks, the command line says {}", *log.world_size, world));
  if (world > cluster.world_size())
    throw InputError(log_path, "world_size",
                     fmt::format("{} ranks do not fit cluster {} of {} GPUs (give the --cluster it ran on)", world,
                                 cluster.name, cluster.world_size()));
  const zero::Batch batch = zero::resolve_batch(cfg, world);
  if (log.stage && *log.stage != cfg.zero.stage)
    throw InputError(log_path, "zero_optimization_stage",
                     fmt::format("the log ran ZeRO stage {}, {} says {}", *log.stage, args.ds_config, cfg.zero.stage));
  if (log.micro_batch && *log.micro_batch != batch.micro_batch)
    throw InputError(log_path, "train_micro_batch_size_per_gpu",
                     fmt::format("the log ran micro-batch {}, the ds_config and flags give {}", *log.micro_batch, batch.micro_batch));
  if (log.gas && *log.gas != batch.gas)
    throw InputError(log_path, "gradient_accumulation_steps",
                     fmt::format("the log ran {} gradient-accumulation steps, the ds_config and flags give {}", *log.gas, batch.gas));
  if (!log.version.empty()) {
    ds.env.deepspeed = log.version;
    ds.env.origin["deepspeed"] = log_path;
    if (log.version.rfind("0.19", 0) != 0)
      ds.warnings.push_back(fmt::format("{}: DeepSpeed {}: zeroplan models DeepSpeed 0.19's behaviour; phases of another "
                                        "release may differ for reasons calibration cannot fit",
                                        log_path, log.version));
  }
  const int skip = std::max(0, args.skip_steps);
  if (static_cast<int>(log.steps.size()) <= skip)
    throw InputError(log_path, "",
                     fmt::format("{} step{} logged, all of them warm-up (--skip-steps {}): log more steps", log.steps.size(),
                                 log.steps.size() == 1 ? "" : "s", skip));
  const models::Attention att = models::choose_attention(mc, args.attention).attention;
  const std::int64_t seq = args.seq_len.value_or(mc.max_positions);
  if (seq < 1 || seq > mc.max_positions)
    throw InputError("--seq-len", "", fmt::format("must be in [1, {}] for {}, got {}", mc.max_positions, mc.name, seq));
  const std::string name = args.name.empty() ? fs::path(log_path).stem().string() : args.name;
  ds.runs.push_back(make_run(name, log_path, args.model, cfg, seq, att, world, args.activation_checkpointing));
  ds.runs.back().tags["log"] = log_path;
  std::vector<double> fwd, bwd, inner, red, step, iter;
  for (std::size_t i = static_cast<std::size_t>(skip); i < log.steps.size(); ++i) {
    const auto& s = log.steps[i];
    fwd.push_back(s.fwd_ms * 1e-3);
    bwd.push_back(s.bwd_ms * 1e-3);
    step.push_back(s.step_ms * 1e-3);
    iter.push_back((s.fwd_ms + s.bwd_ms + s.step_ms) * 1e-3);
    if (s.bwd_inner_ms >= 0 && s.bwd_allreduce_ms >= 0) {
      inner.push_back(s.bwd_inner_ms * 1e-3);
      red.push_back(s.bwd_allreduce_ms * 1e-3);
    }
  }
  const int n = static_cast<int>(fwd.size());
  const std::string src = fmt::format("{}: {} steps from line {}", log_path, n, log.steps[static_cast<std::size_t>(skip)].line);
  for (const auto& [v, label] : std::vector<std::pair<const std::vector<double>*, const char*>>{{&fwd, "fwd"}, {&bwd, "bwd"}, {&step, "step"}})
    if (median(*v) <= 0)
      throw InputError(log_path, label, "the timer reads 0 ms in every step: nothing to calibrate against");
  add_phase(ds, 0, PhaseName::forward, Quantity::wall, median(fwd), spread(fwd), n, true, src, "deepspeed-log");
  const bool split = static_cast<int>(inner.size()) == n && median(inner) > 0;
  if (split) {
    add_phase(ds, 0, PhaseName::backward_inner, Quantity::wall, median(inner), spread(inner), n, true, src, "deepspeed-log");
    if (median(red) > 0)
      add_phase(ds, 0, PhaseName::backward_allreduce, Quantity::wall, median(red), spread(red), n, true, src, "deepspeed-log");
  }
  add_phase(ds, 0, PhaseName::backward, Quantity::wall, median(bwd), spread(bwd), n, !split, src, "deepspeed-log");
  add_phase(ds, 0, PhaseName::step, Quantity::wall, median(step), spread(step), n, true, src, "deepspeed-log");
  add_phase(ds, 0, PhaseName::iteration, Quantity::wall, median(iter), spread(iter), n, false, src, "deepspeed-log");
  return ds;
}

Dataset read_deepspeed_runs(const std::string& path, const sim::ClusterSpec& cluster, int skip_steps) {
  const json::json doc = json::parse_file(path);
  const json::Reader root{path, ""};
  if (!doc.is_object() || !doc.contains("runs"))
    throw InputError(path, "runs", "a runs file is an object with a \"runs\" array (tests/data/deepspeed/*.json's format)");
  root.reject_unknown(doc, {"meta", "runs", "description"});
  const auto& runs = doc.at("runs");
  if (!runs.is_array() || runs.empty()) throw InputError(path, "runs", "must be a non-empty array of runs");
  const fs::path dir = fs::path(path).parent_path();
  auto resolve = [&](const std::string& p) {
    const fs::path q(p);
    if (q.is_absolute() || fs::exists(q)) return q.string();
    return (dir / q).string();
  };
  Dataset ds;
  ds.files.push_back(path);
  if (auto m = doc.find("meta"); m != doc.end()) {
    root.require_object(*m, "meta");
    if (auto v = m->find("versions"); v != m->end() && v->is_object()) {
      auto str = [&](const char* k) { return v->contains(k) && v->at(k).is_string() ? v->at(k).get<std::string>() : std::string(); };
      ds.env.gpu_name = str("gpu");
      ds.env.cuda = str("cuda");
      ds.env.nccl = str("nccl");
      ds.env.deepspeed = str("deepspeed");
      ds.env.torch = str("torch");
      ds.env.host = str("host_cpu");
      for (const char* k : {"gpu_name", "cuda", "nccl", "deepspeed", "torch", "host"}) ds.env.origin[k] = path;
    }
    if (auto d = m->find("date"); d != m->end() && d->is_string()) ds.env.date = d->get<std::string>();
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const json::Reader r = root.sub(fmt::format("runs[{}]", i));
    const auto& e = runs[i];
    if (!e.is_object()) throw InputError(path, r.path, "must be an object");
    const std::string name = r.get_string(e, "name", fmt::format("run{}", i));
    std::string model = r.get_string(e, "model", "");
    if (model.empty()) throw InputError(path, r.key_path("model"), "missing required key");
    // A config.json beside the runs file, else a catalogue name (the file name's stem).
    if (fs::exists(dir / model)) model = (dir / model).string();
    else if (fs::path(model).extension() == ".json" && !fs::exists(model)) model = fs::path(model).stem().string();
    if (e.contains("log")) {
      r.reject_unknown(e, {"name", "log", "model", "ds_config", "seq_len", "micro_batch", "attention",
                           "activation_checkpointing", "world_size", "skip_steps"});
      RunArgs a;
      a.name = name;
      a.model = model;
      a.ds_config = resolve(r.get_string(e, "ds_config", ""));
      if (!e.contains("ds_config")) throw InputError(path, r.key_path("ds_config"), "a run with a log needs the ds_config it ran with");
      if (e.contains("seq_len")) a.seq_len = r.get_int(e, "seq_len", 0, 1, 1 << 24);
      if (e.contains("micro_batch")) a.micro_batch = r.get_int(e, "micro_batch", 0, 1, 1 << 24);
      a.attention = r.get_string(e, "attention", "");
      if (!a.attention.empty()) (void)models::parse_attention(path, r.key_path("attention"), a.attention);
      a.activation_checkpointing = r.get_bool(e, "activation_checkpointing", false);
      a.world_size = static_cast<int>(r.get_int(e, "world_size", 0, 0, 1 << 20));
      a.skip_steps = static_cast<int>(r.get_int(e, "skip_steps", skip_steps, 0, 1 << 20));
      merge(ds, read_deepspeed_log(resolve(r.get_string(e, "log", "")), a, cluster));
      continue;
    }
    // A recorded run (tools/deepspeed_compare.py --write-reference).
    for (const char* k : {"ds_config", "phases_s", "seq_len"})
      if (!e.contains(k)) throw InputError(path, r.key_path(k), "missing required key (a recorded run, or give \"log\")");
    r.require_object(e.at("ds_config"), "ds_config");
    zero::DsConfig cfg = zero::parse_ds_config(fmt::format("{}:{}.ds_config", path, r.path), e.at("ds_config"));
    const int world = static_cast<int>(r.get_int(e, "world_size", 1, 1, 1 << 20));
    if (world > cluster.world_size())
      throw InputError(path, r.key_path("world_size"),
                       fmt::format("{} ranks do not fit cluster {} of {} GPUs", world, cluster.name, cluster.world_size()));
    const zero::Batch batch = zero::resolve_batch(cfg, world);
    if (e.contains("micro_batch") && r.get_int(e, "micro_batch", 0, 1, 1 << 24) != batch.micro_batch)
      throw InputError(path, r.key_path("micro_batch"), fmt::format("differs from the ds_config's {}", batch.micro_batch));
    if (e.contains("gas") && r.get_int(e, "gas", 0, 1, 1 << 24) != batch.gas)
      throw InputError(path, r.key_path("gas"), fmt::format("differs from the ds_config's {}", batch.gas));
    if (e.contains("stage") && r.get_int(e, "stage", 0, 0, 3) != cfg.zero.stage)
      throw InputError(path, r.key_path("stage"), fmt::format("differs from the ds_config's {}", cfg.zero.stage));
    const models::ModelConfig mc = models::load_model(model);
    // A run without fp16/bf16 trains in the dtype transformers built the model in.
    apply_module_dtype(ds, cfg, mc);
    const std::string att_name = r.get_string(e, "attention", "");
    const models::Attention att =
        att_name.empty() ? models::choose_attention(mc, "").attention : models::parse_attention(path, r.key_path("attention"), att_name);
    const std::int64_t seq = r.get_int(e, "seq_len", 0, 1, mc.max_positions);
    const int run = static_cast<int>(ds.runs.size());
    ds.runs.push_back(make_run(name, fmt::format("{}: {}", path, name), model, cfg, seq, att, world,
                               r.get_bool(e, "activation_checkpointing", false)));
    ds.runs.back().keep_output = r.get_bool(e, "keep_output", false);  // the harness's knob
    if (e.contains("optimizer_class") && e.at("optimizer_class").is_string())
      ds.runs.back().tags["optimizer"] = e.at("optimizer_class").get<std::string>();
    const std::string src = fmt::format("{}: run {}", path, name);
    const auto& ph = e.at("phases_s");
    const json::Reader pr = r.sub("phases_s");
    pr.require_object(ph, "phases_s");
    // Step-to-step spread from the individual steps, when recorded.
    std::map<std::string, std::vector<double>> all;
    if (auto pa = e.find("phases_all_s"); pa != e.end() && pa->is_array())
      for (const auto& stp : *pa)
        if (stp.is_object())
          for (const char* k : {"forward", "backward", "step"})
            if (stp.contains(k) && stp.at(k).is_number()) all[k].push_back(stp.at(k).get<double>());
    const int repeats = all.count("forward") ? static_cast<int>(all["forward"].size()) : 1;
    ds.runs.back().host_probe_us = recorded_probe(path, r, e);
    double total = 0;
    for (const auto& [key, p] : kTimedPhases) {
      if (!ph.contains(key)) throw InputError(path, pr.key_path(key), "missing required key");
      if (!ph.at(key).is_number()) throw InputError(path, pr.key_path(key), "must be a number of seconds");
      const double v = ph.at(key).get<double>();
      check_time(path, pr.key_path(key), v);
      total += v;
      add_phase(ds, run, p, Quantity::wall, v, spread(all[key]), repeats, true, src, "deepspeed-runs");
    }
    const double iteration = e.contains("iteration_s") ? r.get_double(e, "iteration_s", 0, -1e30, 1e30) : total;
    check_time(path, r.key_path("iteration_s"), iteration);
    add_phase(ds, run, PhaseName::iteration, Quantity::wall, iteration, 0, repeats, false, src, "deepspeed-runs");
    for_each_timed_phase(e, r, "gpu_s", [&](PhaseName p, const nlohmann::json& v, const json::Reader& gr, const std::string& key) {
      if (!v.is_number()) throw InputError(path, gr.key_path(key), "must be a number of seconds");
      check_time(path, gr.key_path(key), v.get<double>());
      add_phase(ds, run, p, Quantity::gpu_busy, v.get<double>(), 0, 1, true, src, "deepspeed-runs");
    });
    // Kernel time per class and phase (deepspeed_reference.py's kernel_class): cuBLAS's GEMMs,
    // the fused attention, and the rest together (elementwise, copies, the optimizer's kernels,
    // NCCL's), since how DeepSpeed and zeroplan split the rest differs by kernel, not by cost.
    // Classes with no kernel in the phase are not observations (a time of 0 has no ratio).
    for_each_timed_phase(e, r, "gpu_by_class_s", [&](PhaseName p, const nlohmann::json& classes, const json::Reader& gr,
                                                     const std::string& key) {
      const json::Reader cr = gr.sub(key);
      gr.require_object(classes, key);
      double by[3] = {0, 0, 0};  // gemm, attention, other
      for (const auto& [cls, val] : classes.items()) {
        // 0: no kernel of the class ran (no observation, below).
        if (!val.is_number() || !std::isfinite(val.get<double>()) || val.get<double>() < 0)
          throw InputError(path, cr.key_path(cls), "must be a number of seconds, 0 or more");
        const double v = val.get<double>();
        if (cls == "gemm") by[0] += v;
        else if (cls == "attention") by[1] += v;
        else if (cls == "elementwise" || cls == "copy" || cls == "optimizer" || cls == "collective") by[2] += v;
        else
          throw InputError(path, cr.key_path(cls),
                           "is not a kernel class (allowed: gemm, attention, elementwise, copy, optimizer, collective)");
      }
      const Quantity qs[3] = {Quantity::gpu_gemm, Quantity::gpu_attention, Quantity::gpu_other};
      for (int c = 0; c < 3; ++c)
        if (by[c] > 0) add_phase(ds, run, p, qs[c], by[c], 0, 1, false, src, "deepspeed-runs");  // --fit-where opts in
    });
  }
  return ds;
}

}  // namespace zp::calibration
