#include "cli/report.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "cli/compare.hpp"
#include "core/error.hpp"
#include "core/json_util.hpp"
#include "report/atomic_write.hpp"
#include "sim/device.hpp"

namespace zp::cli {

namespace {

using nlohmann::json;
namespace ju = zp::json;

std::vector<int> parse_stage_list(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    const std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok.size() != 1 || tok[0] < '0' || tok[0] > '3')
      throw InputError("--stages", "", fmt::format("expected a comma-separated list of 0, 1, 2, 3, got '{}'", s));
    if (std::find(out.begin(), out.end(), tok[0] - '0') == out.end()) out.push_back(tok[0] - '0');
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

void check_stage(const char* flag, const std::optional<int>& s) {
  if (s && (*s < 0 || *s > 3)) throw InputError(flag, "", fmt::format("must be one of 0, 1, 2, 3, got {}", *s));
}

// ---- checking a --json file before drawing from it: every key a view reads

enum class Kind { object, array, number, string, boolean };

const json& need(const json& doc, const std::string& file, const std::string& path, const std::string& key, Kind k,
                 const char* hint) {
  const std::string where = path.empty() ? key : path + "." + key;
  if (!doc.is_object() || !doc.contains(key)) throw InputError(file, where, fmt::format("missing ({})", hint));
  const json& v = doc[key];
  const bool ok = (k == Kind::object && v.is_object()) || (k == Kind::array && v.is_array()) ||
                  (k == Kind::number && v.is_number()) || (k == Kind::string && v.is_string()) ||
                  (k == Kind::boolean && v.is_boolean());
  static constexpr const char* names[] = {"an object", "an array", "a number", "a string", "true or false"};
  if (!ok)
    throw InputError(file, where,
                     fmt::format("must be {}, got {} ({})", names[static_cast<int>(k)], ju::printable(v.dump()), hint));
  return v;
}

void check_result(const json& r, const std::string& file, const std::string& path, const char* hint) {
  for (const char* k : {"stage", "micro_batch", "gradient_accumulation_steps"}) need(r, file, path, k, Kind::number, hint);
  const json& m = need(r, file, path, "memory", Kind::object, hint);
  const std::string mp = path + ".memory";
  const json& cats = need(m, file, mp, "by_category", Kind::object, hint);
  for (int c = 0; c < zero::kNumCategories; ++c)
    need(cats, file, mp + ".by_category", zero::category_name(static_cast<zero::Category>(c)), Kind::number, hint);
  for (const char* k : {"peak_allocated_bytes", "reserved_bytes", "context_bytes", "device_used_bytes", "host_bytes"})
    need(m, file, mp, k, Kind::number, hint);
  need(m, file, mp, "peak_event", Kind::string, hint);
  need(m, file, mp, "fits", Kind::boolean, hint);
  const json& t = need(r, file, path, "time", Kind::object, hint);
  for (const char* k : {"forward_ms", "backward_ms", "backward_allreduce_ms", "step_ms", "iteration_ms", "samples_per_s", "mfu"})
    need(t, file, path + ".time", k, Kind::number, hint);
  const json& kinds = need(need(r, file, path, "comm", Kind::object, hint), file, path + ".comm", "by_kind", Kind::object, hint);
  for (auto it = kinds.begin(); it != kinds.end(); ++it) {
    need(kinds, file, path + ".comm.by_kind", it.key(), Kind::object, hint);
    for (const char* k : {"count", "bytes", "time_ms", "exposed_ms"})
      need(it.value(), file, path + ".comm.by_kind." + it.key(), k, Kind::number, hint);
  }
}

void check_candidate(const json& e, const std::string& file, const std::string& path, const char* hint) {
  for (const char* k : {"stage", "micro_batch", "gradient_accumulation_steps"}) need(e, file, path, k, Kind::number, hint);
  need(e, file, path, "fits", Kind::boolean, hint);
  need(e, file, path, "knobs", Kind::object, hint);
  const json& m = need(e, file, path, "memory", Kind::object, hint);
  for (const char* k : {"device_used_bytes", "device_limit_bytes"}) need(m, file, path + ".memory", k, Kind::number, hint);
  const json& t = need(e, file, path, "time", Kind::object, hint);
  for (const char* k : {"samples_per_s", "mfu", "iteration_ms"}) need(t, file, path + ".time", k, Kind::number, hint);
}

// ---- what the page is made of, kept alive while it is drawn

struct Built {
  std::vector<Inputs> inputs;
  std::vector<StageResult> results;    // the columns' predictions, when made here
  report::Report report;
  std::vector<std::string> warnings;
};

std::string inputs_fact(const Inputs& in) {
  return fmt::format("{} on {} × {} ({} memory), seq-len {}, {}, {} attention{}", in.model.name, in.world_size,
                     in.device->name, human_bytes(in.device->memory), in.seq_len, dtype_name(in.cfg.model_dtype()),
                     models::attention_name(in.attention), in.activation_checkpointing ? ", activation checkpointing" : "");
}

report::Device device_of(const sim::DeviceSpec& d) { return {d.name, d.memory, Bytes{0}}; }

// The columns (and their programs) once every result is in place.
void add_columns(Built& b, const std::vector<std::string>& titles) {
  for (std::size_t i = 0; i < b.results.size(); ++i) {
    auto& r = b.results[i];
    nlohmann::json j = result_json(r);
    // The views draw every event: the program with every micro-step stored (not one for
    // its copies: Program::repeat), and every event's time.
    r.time.report = sim::expand_times(r.program, r.time.report);
    r.program = zero::expand(r.program);
    b.report.columns.push_back({titles[i], "", std::move(j), &r.program, &r.time.report});
  }
}

// From the inputs, as simulate (several stages) or explain (--vs-ds-config) takes them.
void from_inputs(const ReportRequest& req, Built& b) {
  if (!req.model_given) throw InputError("--model", "", "needed (or --input with a --json output)");
  SimRequest r = req.sim;
  r.json = false;
  check_stage("--stage", req.stage_a);
  check_stage("--vs-stage", req.stage_b);
  if (!req.vs_ds_config.empty()) {
    if (!req.stages.empty()) throw InputError("--stages", "", "not with --vs-ds-config (it compares config A with config B)");
    // Config A at --stage (or its own), config B at --vs-stage (or its own).
    std::vector<std::string> titles;
    for (int k = 0; k < 2; ++k) {
      SimRequest rk = r;
      if (k == 1) rk.ds_config = req.vs_ds_config;
      rk.stages.clear();
      Inputs in = load_inputs(rk);
      const std::optional<int>& want = k == 0 ? req.stage_a : req.stage_b;
      const int stage = want.value_or(in.cfg.zero.stage);
      rk.stages = {stage};
      (void)zero::resolve_batch(config_for_stage(in, rk, stage), in.world_size);
      b.results.push_back(simulate_one(in, config_for_stage(in, rk, stage)));
      titles.push_back(fmt::format("{}: {} (stage {})", k == 0 ? "A" : "B", rk.ds_config.empty() ? "defaults" : rk.ds_config, stage));
      for (const auto& w : in.warnings)
        if (std::find(b.warnings.begin(), b.warnings.end(), w) == b.warnings.end()) b.warnings.push_back(w);
      b.inputs.push_back(std::move(in));
    }
    add_columns(b, titles);
    b.report.a = 0;
    b.report.b = 1;
    b.report.source_kind = "explain";
    b.report.source = {{"model", b.inputs[0].model.name}, {"world_size", b.inputs[0].world_size},
                       {"a", {{"title", titles[0]}, {"result", b.report.columns[0].result}}},
                       {"b", {{"title", titles[1]}, {"result", b.report.columns[1].result}}}};
    b.report.facts.push_back(inputs_fact(b.inputs[0]));
    b.report.title = fmt::format("zeroplan report: {} — {} vs {}", b.inputs[0].model.name, titles[0], titles[1]);
  } else {
    std::vector<int> stages = req.stages.empty() ? std::vector<int>{0, 1, 2, 3} : parse_stage_list(req.stages);
    for (const auto& s : {req.stage_a, req.stage_b})
      if (s && std::find(stages.begin(), stages.end(), *s) == stages.end()) stages.push_back(*s);
    std::sort(stages.begin(), stages.end());
    r.stages = stages;
    Inputs in = load_inputs(r);
    b.results = simulate(in, r);
    std::vector<std::string> titles;
    for (int s : stages) titles.push_back(fmt::format("stage {}", s));
    add_columns(b, titles);
    auto index = [&](int stage) {
      return static_cast<int>(std::find(stages.begin(), stages.end(), stage) - stages.begin());
    };
    const int a_stage = req.stage_a.value_or(
        std::find(stages.begin(), stages.end(), in.cfg.zero.stage) != stages.end() ? in.cfg.zero.stage : stages.front());
    b.report.a = index(a_stage);
    if (req.stage_b) b.report.b = index(*req.stage_b);
    else if (stages.size() > 1) b.report.b = b.report.a + 1 < static_cast<int>(stages.size()) ? b.report.a + 1 : b.report.a - 1;
    if (b.report.b == b.report.a) b.report.b = -1;
    b.report.source_kind = "simulate";
    b.report.source = simulate_json(in, b.results);
    b.report.facts.push_back(inputs_fact(in));
    std::string ranks;
    for (const auto& res : b.results) ranks += fmt::format("{}stage {}: rank {}", ranks.empty() ? "" : ", ", res.stage, res.rank);
    b.report.facts.push_back(fmt::format("micro-batch {} × {} micro-steps × {} ranks = global batch {}; each stage's "
                                         "heaviest rank unless --rank ({})",
                                         b.results.front().batch.micro_batch, b.results.front().batch.gas, in.world_size,
                                         b.results.front().batch.train_batch_size, ranks));
    b.report.title = fmt::format("zeroplan report: {} on {} × {}", in.model.name, in.world_size, in.device->name);
    b.warnings = in.warnings;
    b.inputs.push_back(std::move(in));
  }
  b.report.device = device_of(*b.inputs[0].device);
  b.report.facts.push_back(fmt::format("views 2 and 3 compare {} with {}", b.report.columns[static_cast<std::size_t>(b.report.a)].title,
                                       b.report.b >= 0 ? b.report.columns[static_cast<std::size_t>(b.report.b)].title : "nothing"));
}

// As `zeroplan plan`: the search, then the best candidate of each stage simulated in full.
void from_plan(const ReportRequest& req, Built& b, const char* argv0) {
  if (!req.model_given) throw InputError("--model", "", "needed with --plan");
  if (!req.stages.empty() || req.stage_a || req.stage_b || !req.vs_ds_config.empty())
    throw InputError("--plan", "", "searches the stage itself: not with --stages, --stage, --vs-stage or --vs-ds-config");
  PlanRequest pr = req.plan_req;
  pr.base = req.sim;
  pr.base.json = false;
  pr.out.clear();
  pr.verify = false;
  if (!req.plan_top_given) pr.top = 1 << 20;  // every shape's best
  const PlanOutput o = run_plan(pr, argv0);
  b.warnings = o.warnings;
  report::PlanView pv;
  pv.plan = o.json;
  for (const auto& e : o.result.all)
    pv.simulated.push_back({static_cast<int>(planner::get(e.knobs, planner::Dim::stage)), e.batch.micro_batch, e.device_used,
                            e.samples_per_s, e.fits});
  b.report.plan = std::move(pv);
  b.report.source_kind = "plan";
  b.report.source = o.json;
  const planner::Problem& pb = o.problem;
  b.report.device = {pb.device->name, pb.device->memory,
                     Bytes{static_cast<std::int64_t>(pb.headroom * static_cast<double>(pb.device->memory.v))}};
  b.report.title = fmt::format("zeroplan report: plan for {} on {} × {}", pb.model.name, pb.world_size, pb.device->name);
  b.report.facts.push_back(fmt::format("{} ({}), global batch {}, seq-len {}, {}; objective {}", pb.cluster.name,
                                       fmt::format("{} node(s) × {} GPUs", pb.cluster.nodes, pb.cluster.gpus_per_node),
                                       pb.global_batch, pb.seq_len, dtype_name(pb.base.model_dtype()),
                                       planner::objective_name(pb.objective)));
  // The columns: the best candidate of each stage searched (fitting ones rank first).
  std::vector<const planner::Evaluation*> picks;
  for (int st = 0; st <= 3; ++st)
    for (const auto& e : o.result.ranked)
      if (planner::get(e.knobs, planner::Dim::stage) == st) {
        picks.push_back(&e);
        break;
      }
  SimRequest r = pr.base;
  r.stages.clear();
  r.check_batch = false;
  Inputs in = load_inputs(r);
  const planner::Evaluation* winner = o.result.any_fits() ? &o.result.ranked.front() : nullptr;
  const planner::Evaluation* runner = o.result.ranked.size() > 1 && o.result.ranked[1].fits ? &o.result.ranked[1] : nullptr;
  const bool runner_extra = runner && std::find(picks.begin(), picks.end(), runner) == picks.end();
  if (runner_extra) picks.push_back(runner);  // of the winner's stage
  std::vector<std::string> titles;
  for (const auto* e : picks) {
    Inputs ie = in;
    ie.activation_checkpointing = planner::get(e->knobs, planner::Dim::activation_checkpointing) != 0;
    b.results.push_back(simulate_one(ie, planner::config_of(pb, e->knobs)));
    titles.push_back(fmt::format("stage {}{}", planner::get(e->knobs, planner::Dim::stage),
                                 runner_extra && e == runner ? " (runner-up)" : ""));
  }
  add_columns(b, titles);
  for (std::size_t i = 0; i < picks.size(); ++i)
    b.report.columns[i].note = picks[i] == winner ? "winner" : picks[i] == runner ? "runner-up" : "best of its stage";
  for (std::size_t i = 0; i < picks.size(); ++i) {
    if (picks[i] == winner) b.report.a = static_cast<int>(i);
    if (picks[i] == runner) b.report.b = static_cast<int>(i);
  }
  if (b.report.a < 0 && !picks.empty()) b.report.a = 0;
  if (b.report.b < 0 && picks.size() > 1) b.report.b = b.report.a == 0 ? 1 : 0;
  b.report.facts.push_back(fmt::format("views 1-3: the best candidate of each stage, simulated in full (the search may "
                                       "extrapolate long GAS from shorter programs; view 4 shows the search's figures); "
                                       "views 2 and 3 compare {}", winner ? "the winner with the runner-up" : "the closest two"));
  b.inputs.push_back(std::move(in));
}

// From a --json output of simulate, explain or plan.
void from_file(const ReportRequest& req, Built& b) {
  if (req.plan || !req.stages.empty() || req.stage_a || req.stage_b || !req.vs_ds_config.empty() || !req.sim.ds_config.empty() ||
      req.sim.gpus || !req.sim.cluster.empty() || req.model_given || req.sim.micro_batch || req.sim.seq_len)
    throw InputError("--input", "", "takes the numbers from the file: not with the inputs' flags (--model, --ds-config, "
                                    "--gpus, --cluster, --micro-batch, --seq-len, --stages, --stage, --vs-stage, "
                                    "--vs-ds-config, --plan)");
  const std::string& file = req.input;
  const json doc = ju::parse_file(file);
  const char* hint = "expected the --json output of zeroplan simulate, explain or plan";
  b.report.source_file = file;
  b.report.source = doc;
  auto device = [&](const std::string& gpu) {
    const sim::DeviceSpec& d = sim::find_device(gpu);
    b.report.device = device_of(d);
  };
  if (doc.is_object() && doc.contains("config") && doc.contains("losses"))
    throw InputError(file, "", "is a `train --out` measurement: give it with --measured, and its prediction with "
                               "--input (simulate --json) or the inputs");
  if (doc.is_object() && doc.contains("results")) {
    const json& results = need(doc, file, "", "results", Kind::array, hint);
    if (results.empty()) throw InputError(file, "results", "is empty (expected one result per stage)");
    for (std::size_t i = 0; i < results.size(); ++i) check_result(results[i], file, fmt::format("results[{}]", i), hint);
    device(need(doc, file, "", "gpu", Kind::string, hint).get<std::string>());
    for (const auto& r : results) b.report.columns.push_back({fmt::format("stage {}", r["stage"].get<int>()), "", r, nullptr, nullptr});
    b.report.a = 0;
    b.report.b = results.size() > 1 ? 1 : -1;
    b.report.source_kind = "simulate";
    b.report.title = fmt::format("zeroplan report: {} on {} × {}", ju::printable(doc.value("model", "?")),
                                 doc.value("world_size", 0), b.report.device.name);
  } else if (doc.is_object() && doc.contains("a") && doc.contains("b")) {
    for (const char* side : {"a", "b"}) {
      const json& s = need(doc, file, "", side, Kind::object, hint);
      check_result(need(s, file, side, "result", Kind::object, hint), file, std::string(side) + ".result", hint);
      b.report.columns.push_back({need(s, file, side, "title", Kind::string, hint).get<std::string>(), "", s["result"], nullptr, nullptr});
    }
    // explain --json does not name the device: the limit line is then not drawn.
    b.report.device = {"", Bytes{0}, Bytes{0}};
    b.report.a = 0;
    b.report.b = 1;
    b.report.source_kind = "explain";
    b.report.title = fmt::format("zeroplan report: {} — {} vs {}", ju::printable(doc.value("model", "?")),
                                 b.report.columns[0].title, b.report.columns[1].title);
  } else if (doc.is_object() && doc.contains("ranked")) {
    const json& ranked = need(doc, file, "", "ranked", Kind::array, hint);
    for (std::size_t i = 0; i < ranked.size(); ++i) check_candidate(ranked[i], file, fmt::format("ranked[{}]", i), hint);
    need(doc, file, "", "memory_headroom", Kind::number, hint);
    device(need(need(doc, file, "", "cluster", Kind::object, hint), file, "cluster", "gpu", Kind::string, hint).get<std::string>());
    if (!doc.contains("best") || !(doc["best"].is_null() || doc["best"].is_object()))
      throw InputError(file, "best", fmt::format("missing or not an object ({})", hint));
    if (doc["best"].is_object()) {
      check_candidate(doc["best"], file, "best", hint);
      need(doc["best"], file, "best", "ds_config", Kind::object, hint);
    }
    b.report.device.limit = Bytes{static_cast<std::int64_t>(doc["memory_headroom"].get<double>() *
                                                            static_cast<double>(b.report.device.memory.v))};
    b.report.plan = report::PlanView{doc, {}};
    b.report.source_kind = "plan";
    b.report.title = fmt::format("zeroplan report: plan for {} on {} × {}", ju::printable(doc.value("model", "?")),
                                 doc.value("world_size", 0), b.report.device.name);
  } else {
    throw InputError(file, "", fmt::format("has none of results, a/b, ranked ({})", hint));
  }
  b.report.facts.push_back(fmt::format("numbers from {}; views that need the step program say so", file));
}

// The measurement against the column of its stage; refused when the runs differ.
void add_measurement(const ReportRequest& req, Built& b) {
  if (b.report.source_kind != "simulate")
    throw InputError("--measured", "", "compares with one simulated configuration: give the simulate inputs (or "
                                       "--input with a simulate --json output), not --plan, --vs-ds-config or an "
                                       "explain/plan file");
  const json measured = ju::parse_file(req.measured);
  const std::string pname = b.report.source_file.empty() ? std::string("the prediction") : b.report.source_file;
  const Comparison cmp = compare_documents(b.report.source, pname, measured, req.measured);
  report::MeasuredView mv;
  mv.file = req.measured;
  mv.measured = measured;
  mv.comparison = cmp.json;
  const int stage = cmp.json.value("stage", -1);
  for (std::size_t i = 0; i < b.report.columns.size(); ++i)
    if (b.report.columns[i].result.value("stage", -2) == stage) {
      mv.column = static_cast<int>(i);
      break;
    }
  b.report.measured = std::move(mv);
}

std::string shell_word(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./,:+@") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

CLI::App* add_report_command(CLI::App& app, ReportRequest& req) {
  auto* c = app.add_subcommand("report", "write one self-contained HTML page with the plots behind simulate, explain or "
                                         "plan (and a measurement over its prediction)");
  SimRequest& r = req.sim;
  c->add_option("--out,-o", req.out, "the HTML file to write")->required();
  c->add_option("--model", r.model, "catalogue name or hub id (zeroplan models), or path to a HF config.json")
      ->each([&req](const std::string&) { req.model_given = true; });
  c->add_option("--ds-config", r.ds_config, "DeepSpeed config JSON (default: DeepSpeed's defaults)");
  c->add_option("--gpus", r.gpus, "data-parallel world size N (default: the cluster's GPUs)");
  c->add_option("--gpu", r.gpu, "GPU type for --gpus N (zeroplan devices)");
  c->add_option("--cluster", r.cluster, "cluster preset (zeroplan clusters), JSON file or NCCL topology XML");
  c->add_option("--nodes", r.nodes, "multiply the cluster's node across an InfiniBand fabric");
  c->add_option("--nic-gbps", r.nic_gbps, "NIC speed in Gb/s for --nodes");
  c->add_option("--interference", r.interference, "compute slowdown while communication overlaps (default: device profile)");
  c->add_option("--profile", r.profile, "a cluster profile (zeroplan calibrate --out): its fitted coefficients");
  c->add_option("--host-probe-us", r.host_probe_us, host_probe_help());
  c->add_option("--micro-batch", r.micro_batch, "override train_micro_batch_size_per_gpu (GAS follows)");
  c->add_option("--seq-len", r.seq_len, "sequence length (default: the model's max positions)");
  c->add_flag("--activation-checkpointing", r.activation_checkpointing, "per-layer activation checkpointing");
  c->add_option("--attention", r.attention, attention_help());
  c->add_option("--transformers", r.transformers, transformers_help());
  c->add_flag("--keep-output", r.keep_output, keep_output_help());
  add_variant_flags(c, r.variants);
  c->add_option("--rank", r.rank, "rank to simulate (default: the one with the most rank-dependent bytes)");
  c->add_option("--stages", req.stages, "stages to simulate, e.g. 0,1,2,3 (the default)");
  c->add_option("--stage", req.stage_a, "stage A of views 2 and 3 (default: the config's)");
  c->add_option("--vs-stage", req.stage_b, "stage B of views 2 and 3 (default: the next one simulated)");
  c->add_option("--vs-ds-config", req.vs_ds_config, "config B, against --ds-config (as explain)");
  c->add_flag("--plan", req.plan, "search as `zeroplan plan` does and draw its candidates");
  c->add_option("--global-batch", req.plan_req.global_batch, "with --plan: train_batch_size (default: BASE.json's)");
  c->add_option("--objective", req.plan_req.objective, "with --plan: throughput (default), memory, or cost");
  c->add_option("--memory-headroom", req.plan_req.headroom, "with --plan: fraction of memory a plan may use (default 0.9)");
  c->add_option("--search", req.plan_req.search, "with --plan: dimensions to search (default: all)");
  c->add_option("--top", req.plan_req.top, "with --plan: candidates drawn (default: the best of every shape)")
      ->each([&req](const std::string&) { req.plan_top_given = true; });
  c->add_option("--threads", req.plan_req.threads, "with --plan: threads (default 0: every core)");
  c->add_flag("--exhaustive", req.plan_req.exhaustive, "with --plan: simulate every point of the grid");
  c->add_option("--input", req.input, "a --json output of simulate, explain or plan to draw instead of simulating");
  c->add_option("--measured", req.measured, "a `train --out` measurement (FILE.rankR.json) to lay over its prediction");
  c->add_option("--timeline-bins", req.page.timeline_bins, "bins per timeline lane (default 2000)");
  c->add_option("--memory-samples", req.page.memory_samples, "samples per memory-over-the-step panel (default 700)");
  return c;
}

std::string build_report(const ReportRequest& req, const char* argv0, ReportOutcome* outcome) {
  if (req.page.timeline_bins < 10 || req.page.timeline_bins > 100000)
    throw InputError("--timeline-bins", "", fmt::format("must be in [10, 100000], got {}", req.page.timeline_bins));
  if (req.page.memory_samples < 10 || req.page.memory_samples > 100000)
    throw InputError("--memory-samples", "", fmt::format("must be in [10, 100000], got {}", req.page.memory_samples));
  auto b = std::make_unique<Built>();
  if (!req.input.empty()) from_file(req, *b);
  else if (req.plan) from_plan(req, *b, argv0);
  else from_inputs(req, *b);
  if (!req.measured.empty()) add_measurement(req, *b);
  b->report.warnings = b->warnings;
  b->report.command = req.command;
  ReportOutcome o;
  o.warnings = b->warnings;
  std::string page = report::render_html(b->report, req.page, &o.stats);
  if (outcome) *outcome = std::move(o);
  return page;
}

ReportOutcome run_report(const ReportRequest& req, const char* argv0) {
  report::check_writable(req.out, "--out");
  ReportOutcome o;
  const std::string page = build_report(req, argv0, &o);
  report::write_file_atomically(req.out, page, "--out");
  std::string views;
  for (const auto& v : o.stats.views) views += (views.empty() ? "" : ", ") + v;
  o.summary = fmt::format("report written to {} ({:.1f} KiB; views: {})", req.out, static_cast<double>(o.stats.bytes) / 1024.0, views);
  if (o.stats.events > 0)
    o.summary += fmt::format("; timeline: {} step events drawn as {} slices", o.stats.events, o.stats.timeline_slices);
  o.summary += "\n";
  return o;
}

std::string report_command_line(int argc, char** argv) {
  std::string s = "zeroplan";
  for (int i = 1; i < argc; ++i) s += " " + shell_word(argv[i]);
  return s;
}

}  // namespace zp::cli
