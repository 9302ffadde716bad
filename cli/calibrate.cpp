#include "cli/calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "calibration/params.hpp"
#include "calibration/predictor.hpp"
#include "calibration/report.hpp"
#include "calibration/sources.hpp"
#include "core/error.hpp"
#include "core/json_util.hpp"
#include "models/model_config.hpp"
#include "report/atomic_write.hpp"
#include "sim/device.hpp"

namespace zp::cli {

namespace fs = std::filesystem;
using namespace zp::calibration;

namespace {

std::string now_utc() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The cluster the measurements ran on: the flags, else what the sources say (a recorded-runs
// file names its GPU; a train --out of the CPU backend ran on CPU ranks; the device is this one).
sim::ClusterSpec cluster_for(const CalibrateRequest& req, const std::optional<DeviceInfo>& dev) {
  if (!req.cluster.empty()) {
    if (req.gpus) throw InputError("--gpus", "", "give --cluster or --gpus/--gpu, not both");
    return sim::load_cluster(req.cluster, req.nodes, req.nic_gbps);
  }
  if (req.nodes) throw InputError("--nodes", "", "needs --cluster (a preset, JSON file or NCCL topology XML)");
  if (req.gpus) {
    if (*req.gpus < 1) throw InputError("--gpus", "", fmt::format("must be an integer >= 1, got {}", *req.gpus));
    return sim::single_node(req.gpu.empty() ? "A100-80GB" : req.gpu, *req.gpus);
  }
  if (dev) {
    const std::string name = device_for_gpu_name(dev->gpu_name);
    if (name.empty())
      throw InputError("--device", "",
                       fmt::format("this machine's GPU '{}' is not in the device database (zeroplan devices); give "
                                   "--gpus N --gpu TYPE or --cluster",
                                   dev->gpu_name));
    return sim::single_node(name, std::max(1, dev->gpus));
  }
  if (!req.nccl_tests.empty() || !req.deepspeed_logs.empty())
    throw InputError("--cluster", "",
                     "give the cluster the measurements ran on (--cluster PRESET|FILE.json|TOPO.xml [--nodes K], or --gpus "
                     "N --gpu TYPE): nccl-tests tables and DeepSpeed logs do not say how the GPUs are linked");
  // Recorded runs: their GPU, one node of as many GPUs as the largest run.
  std::string gpu;
  int world = 1;
  for (const auto& f : req.deepspeed_runs) {
    const auto doc = json::parse_file(f);
    if (doc.is_object() && doc.contains("meta") && doc["meta"].contains("versions") && doc["meta"]["versions"].contains("gpu") &&
        doc["meta"]["versions"]["gpu"].is_string()) {
      const std::string g = device_for_gpu_name(doc["meta"]["versions"]["gpu"].get<std::string>());
      if (!g.empty()) gpu = g;
    }
    if (doc.is_object() && doc.contains("runs") && doc["runs"].is_array())
      for (const auto& r : doc["runs"])
        if (r.is_object() && r.contains("world_size") && r["world_size"].is_number_integer())
          world = std::max(world, r["world_size"].get<int>());
  }
  for (const auto& f : req.train_out) {
    const auto doc = json::parse_file(f);
    if (doc.is_object() && doc.contains("config") && doc["config"].is_object()) {
      const auto& c = doc["config"];
      if (c.value("backend", "").rfind("cpu", 0) == 0) gpu = "cpu";
      // A CUDA run names its GPU as the driver does.
      if (c.contains("gpu") && c["gpu"].is_string()) {
        const std::string g = device_for_gpu_name(c["gpu"].get<std::string>());
        if (!g.empty()) gpu = g;
      }
      if (c.contains("world_size") && c["world_size"].is_number_integer()) world = std::max(world, c["world_size"].get<int>());
    }
  }
  // Saved observations: the GPU and GPU count their environment records (--device cuda's).
  for (const auto& f : req.observations) {
    const auto doc = json::parse_file(f, std::int64_t{256} << 20);
    if (!doc.is_object() || !doc.contains("environment") || !doc["environment"].is_object()) continue;
    const auto& e = doc["environment"];
    if (e.contains("gpu_name") && e["gpu_name"].is_string()) {
      const std::string g = device_for_gpu_name(e["gpu_name"].get<std::string>());
      if (!g.empty()) gpu = g;
    }
    if (e.contains("gpu_count") && e["gpu_count"].is_number_integer()) world = std::max(world, e["gpu_count"].get<int>());
  }
  if (gpu.empty())
    throw InputError("--cluster", "",
                     "the sources do not say which GPU they ran on: give --cluster PRESET|FILE or --gpus N --gpu TYPE");
  return sim::single_node(gpu, world);
}

RunArgs run_args(const CalibrateRequest& req) {
  RunArgs a;
  a.model = req.model;
  a.ds_config = req.ds_config;
  a.seq_len = req.seq_len;
  a.micro_batch = req.micro_batch;
  a.attention = req.attention;
  a.activation_checkpointing = req.activation_checkpointing;
  a.skip_steps = req.skip_steps;
  return a;
}

// Whether the simulator's wall-clock phase predictions depend on the host costs at all (an
// event engine that runs them on a host clock), judged on the data's own runs.
bool wall_depends_on_host(const Predictor& pred, const Dataset& data, const ModelParams& m) {
  std::vector<char> want(data.obs.size(), 0);
  bool any = false;
  for (std::size_t i = 0; i < data.obs.size(); ++i)
    if (data.obs[i].kind == ObsKind::phase && data.obs[i].phase.quantity == Quantity::wall) want[i] = any = true;
  if (!any) return false;
  std::vector<double> a(data.obs.size()), b(data.obs.size());
  pred.predict(m, want, a);
  ModelParams more = m;
  for (const auto& d : param_registry())
    if (d.group == ParamGroup::host) d.set(more, d.get(m) * 4 + 100);
  pred.predict(more, want, b);
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] && std::abs(b[i] - a[i]) > 1e-3 * std::max(a[i], 1e-9)) return true;
  return false;
}

}  // namespace

void select_fitted(Dataset& data, const std::string& where) {
  // Default: an iteration is the sum of the phases fitted, so it is reported, not fitted; so
  // are a train run's phases (the sums of its events, which are fitted one by one).
  // (Fused attention kernels are fitted: compute.attention_efficiency is theirs.) The kernel
  // time per class (gpu_gemm, gpu_attention, gpu_other) sums to the GPU-busy time of a phase
  // run on one stream: fitted only where --fit-where names its quantity, else reported.
  auto is_class = [](const Observation& o) {
    return o.kind == ObsKind::phase && (o.phase.quantity == Quantity::gpu_gemm ||
                                        o.phase.quantity == Quantity::gpu_attention ||
                                        o.phase.quantity == Quantity::gpu_other);
  };
  for (auto& o : data.obs)
    if ((o.kind == ObsKind::phase && (o.phase.phase == PhaseName::iteration || o.phase.quantity == Quantity::events)) ||
        is_class(o))
      o.fit = false;
  if (where.empty()) return;
  // Alternatives separated by ';', each a conjunction of KEY=V1|V2 terms separated by ','.
  using Clause = std::map<std::string, std::set<std::string>>;
  std::vector<Clause> clauses;
  std::size_t start = 0;
  while (start <= where.size()) {
    const std::size_t semi = where.find(';', start);
    const std::string alt = where.substr(start, semi == std::string::npos ? std::string::npos : semi - start);
    start = semi == std::string::npos ? where.size() + 1 : semi + 1;
    Clause want;
    std::size_t pos = 0;
    while (pos <= alt.size()) {
      const std::size_t comma = alt.find(',', pos);
      const std::string term = alt.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      pos = comma == std::string::npos ? alt.size() + 1 : comma + 1;
      if (term.empty()) continue;
      const auto eq = term.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == term.size())
        throw InputError("--fit-where", "", fmt::format("'{}' is not KEY=VALUE[|VALUE...]", json::printable(term)));
      const std::string key = term.substr(0, eq);
      std::string vals = term.substr(eq + 1);
      std::size_t p = 0;
      while (p <= vals.size()) {
        const std::size_t bar = vals.find('|', p);
        const std::string v = vals.substr(p, bar == std::string::npos ? std::string::npos : bar - p);
        if (!v.empty()) want[key].insert(v);
        p = bar == std::string::npos ? vals.size() + 1 : bar + 1;
      }
    }
    if (want.empty())
      throw InputError("--fit-where", "", fmt::format("'{}' has an empty alternative (between ';')", json::printable(where)));
    clauses.push_back(std::move(want));
  }
  std::set<std::string> keys;
  for (const auto& o : data.obs)
    for (const auto& [k, v] : o.tags) keys.insert(k);
  for (const auto& want : clauses)
    for (const auto& [k, v] : want)
      if (!keys.count(k)) {
        std::vector<std::string> known(keys.begin(), keys.end());
        const std::string near = json::closest(k, known);
        std::string list;
        for (const auto& x : known) list += (list.empty() ? "" : ", ") + x;
        throw InputError("--fit-where", "",
                         fmt::format("no observation has the key '{}'{}; keys: {}", json::printable(k),
                                     near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near), list));
      }
  bool classes_named = false;
  for (const auto& want : clauses)
    if (auto q = want.find("quantity"); q != want.end())
      for (const char* c : {"gpu_gemm", "gpu_attention", "gpu_other"}) classes_named |= q->second.count(c) > 0;
  int selected = 0;
  for (auto& o : data.obs) {
    if (classes_named && is_class(o) && o.phase.phase != PhaseName::iteration) o.fit = true;
    bool match = false;
    for (const auto& want : clauses) {
      bool all = true;
      for (const auto& [k, vs] : want) {
        auto it = o.tags.find(k);
        if (it == o.tags.end() || !vs.count(it->second)) all = false;
      }
      match = match || all;
    }
    o.fit = o.fit && match;
    selected += o.fit ? 1 : 0;
  }
  if (selected == 0)
    throw InputError("--fit-where", "", fmt::format("'{}' selects no observation to fit", json::printable(where)));
}

std::string params_table() {
  std::string t = fmt::format("{:<44} {:<5} {:>10} {:>10}  {}\n", "parameter", "unit", "min", "max", "what (determined by)");
  for (const auto& d : param_registry())
    t += fmt::format("{:<44} {:<5} {:>10.3g} {:>10.3g}  {}{} ({})\n", d.name, d.unit, d.lo, d.hi, d.what,
                     d.coarse ? "" : d.name == "host.scale" ? " [by name only]" : " [detail]", d.determined_by);
  t += "groups for --fit: compute, host, collective (the coarse factors), collective-detail (per algorithm and protocol), all\n";
  return t;
}

CalibrateOutput run_calibrate(const CalibrateRequest& req, const Progress& progress) {
  if (req.nccl_tests.empty() && req.deepspeed_logs.empty() && req.deepspeed_runs.empty() && req.train_out.empty() && req.observations.empty() &&
      req.device.empty())
    throw InputError("calibrate", "",
                     "no measurements: give --nccl-tests FILE, --deepspeed-log FILE (with --model and --ds-config), "
                     "--deepspeed-runs FILE, --train-out FILE, --observations FILE or --device cuda");
  if (!req.device.empty() && req.device != "cuda")
    throw InputError("--device", "", fmt::format("must be cuda, got '{}'", json::printable(req.device)));
  if (!std::isfinite(req.budget_minutes) || req.budget_minutes <= 0 || req.budget_minutes > 24 * 60)
    throw InputError("--budget", "", fmt::format("must be a number of minutes in (0, 1440], got {}", req.budget_minutes));
  if (req.skip_steps < 0) throw InputError("--skip-steps", "", "must be >= 0");
  if (req.threads < 0) throw InputError("--threads", "", "must be >= 0 (0: every core)");
  if (!req.out.empty()) report::check_writable(req.out, "--out");
  if (!req.save_observations.empty()) report::check_writable(req.save_observations, "--save-observations");
  const std::vector<const ParamDef*> explicit_params = req.fit.empty() ? std::vector<const ParamDef*>{} : parse_fit_spec(req.fit);
  std::optional<DeviceInfo> dev;
  if (!req.device.empty()) {
    if (req.model.empty()) throw InputError("--model", "", "--device cuda measures the GEMMs and ops of the model to plan: give --model");
    dev = query_devices();
  }

  CalibrateOutput out;
  out.cluster = cluster_for(req, dev);
  const sim::ClusterSpec& cluster = out.cluster;
  const sim::DeviceSpec& device = sim::find_device(cluster.gpu);
  Dataset& data = out.data;
  for (const auto& f : req.nccl_tests) merge(data, read_nccl_tests_arg(f));
  for (const auto& f : req.deepspeed_runs) merge(data, read_deepspeed_runs(f, cluster, req.skip_steps));
  for (const auto& f : req.deepspeed_logs) merge(data, read_deepspeed_log(f, run_args(req), cluster));
  for (const auto& f : req.train_out) merge(data, read_train_out(f, run_args(req), cluster));
  for (const auto& f : req.observations) merge(data, read_observations(f));

  // The starting point: the device's default profile (or a previous calibration's).
  ModelParams start;
  start.device = sim::default_profile(device);
  start.collective = cluster.collective;
  if (!req.start_profile.empty()) {
    const ClusterProfile prev = load_cluster_profile(req.start_profile);
    for (const auto& w : compatibility_warnings(prev, cluster, cluster.world_size(), local_nccl_version())) data.warnings.push_back(w);
    sim::ClusterSpec c = cluster;
    apply_profile(prev, device, start.device, c);
    start.collective = c.collective;
  }

  if (dev) {
    const models::ModelConfig mc = models::load_model(req.model);
    zero::DsConfig cfg = req.ds_config.empty() ? zero::default_ds_config() : zero::load_ds_config(req.ds_config);
    if (req.ds_config.empty()) cfg.train_micro_batch_size_per_gpu = 1;
    (void)zero::apply_module_dtype(cfg, mc.torch_dtype, mc.source, mc.torch_dtype_key);
    if (req.micro_batch) {
      cfg.train_micro_batch_size_per_gpu = *req.micro_batch;
      if (cfg.train_batch_size) cfg.gradient_accumulation_steps.reset();
    }
    models::GraphOptions go;
    go.micro_batch = zero::resolve_batch(cfg, cluster.world_size()).micro_batch;
    go.seq_len = req.seq_len.value_or(mc.max_positions);
    go.act_dtype = cfg.model_dtype();
    go.attention = models::choose_attention(mc, req.attention).attention;
    const models::OpGraph g = models::build_graph(mc, go);
    const BenchPlan plan = plan_device_benchmarks(g, start.device, cluster, dev->gpus, req.budget_minutes * 60);
    for (const auto& n : plan.notes) data.warnings.push_back("--device cuda: " + n);
    DeviceRun run = run_device_benchmarks(plan, progress);
    run.data.env.gpu_name = dev->gpu_name;
    run.data.env.gpu_count = dev->gpus;
    run.data.env.nodes = 1;
    run.data.env.driver = dev->driver;
    run.data.env.cuda = dev->cuda;
    run.data.env.nccl = dev->nccl;
    for (const char* k : {"gpu_name", "driver", "cuda", "nccl"}) run.data.env.origin[k] = "--device cuda";
    data.warnings.push_back(fmt::format("--device cuda: {} cases measured in {:.1f} s of the {:.0f} s budget{}",
                                        run.measured, run.seconds, req.budget_minutes * 60,
                                        run.skipped > 0 ? fmt::format(", {} left out", run.skipped) : ""));
    merge(data, std::move(run.data));
  }
  if (data.obs.empty()) throw InputError("calibrate", "", "the sources hold no observation to fit");
  if (!req.save_observations.empty()) {
    // Saved before the fit, so that a fit that fails leaves the measurements behind.
    int left = 0;
    save_observations(data, req.save_observations, "--save-observations", &left);
    if (left > 0)
      data.warnings.push_back(fmt::format("--save-observations: {} observations of training runs left out (their files "
                                          "are the record: give them again with their source flags)",
                                          left));
  }
  if (!data.env.gpu_name.empty()) {
    const std::string g = device_for_gpu_name(data.env.gpu_name);
    if (!g.empty() && g != cluster.gpu)
      data.warnings.push_back(fmt::format("the measurements name the GPU '{}' ({}), the cluster {} has {}", data.env.gpu_name, g,
                                          cluster.name, cluster.gpu));
  }

  select_fitted(data, req.fit_where);
  const Predictor predictor(data, cluster);

  // Wall-clock phases depend on the host's work; when this simulator does not run host costs,
  // fitting them would push the GPU's coefficients to absorb it. With GPU-busy times of the
  // same runs at hand, the wall-clock phases are then reported, not fitted.
  bool has_gpu_busy = false;
  for (const auto& o : data.obs) has_gpu_busy |= o.kind == ObsKind::phase && o.phase.quantity == Quantity::gpu_busy;
  if (has_gpu_busy && !wall_depends_on_host(predictor, data, start)) {
    int n = 0;
    for (auto& o : data.obs)
      if (o.kind == ObsKind::phase && o.phase.quantity == Quantity::wall && o.fit) {
        o.fit = false;
        ++n;
      }
    if (n > 0)
      data.warnings.push_back(fmt::format("the simulator's wall-clock phases do not depend on the host costs (its event engine "
                                          "does not run them): the {} wall-clock phases are reported, not fitted; the "
                                          "GPU-busy phases are",
                                          n));
  }

  bool kernels = false, colls = false, phases = false, multi = false;
  for (const auto& o : data.obs) {
    if (!o.fit) continue;
    if (o.kind == ObsKind::kernel) (o.kernel.cls == KernelClass::collective ? colls : kernels) = true;
    if (o.kind == ObsKind::collective) colls = true;
    if (o.kind == ObsKind::phase) {
      phases = true;
      multi |= data.runs[static_cast<std::size_t>(o.phase.run)].world_size > 1;
    }
  }
  FitOptions fo;
  fo.candidates = req.fit.empty() ? default_fit_set(kernels, colls, phases, multi) : explicit_params;
  // Runs recorded with a host probe are predicted at their probe (the host costs times it over the
  // profile's host.probe_us). Where host costs are fitted, the fitted ones are at the starting
  // profile's probe, or, where it has none, at the runs' median, which the written profile then
  // carries (simulate --host-probe-us); fitted on runs without a probe, they are at none.
  std::string probe_note;
  if (std::any_of(fo.candidates.begin(), fo.candidates.end(), [](const ParamDef* d) { return d->group == ParamGroup::host; })) {
    std::vector<double> probes;
    for (const auto& r : data.runs)
      if (r.host_probe_us > 0) probes.push_back(r.host_probe_us);
    if (!probes.empty()) {
      const auto [lo, hi] = std::minmax_element(probes.begin(), probes.end());
      const double p_lo = *lo, p_hi = *hi;
      const bool stamped = start.device.host.probe_us <= 0;
      if (stamped) start.device.host.probe_us = median(probes);
      probe_note = fmt::format("{} of {} runs recorded the host probe ({:.2f}-{:.2f} us per eager op): each is predicted "
                               "at its own, the host costs at {} {:.2f} us (the profile's host.probe_us)",
                               probes.size(), data.runs.size(), p_lo, p_hi, stamped ? "their median," : "the profile's",
                               start.device.host.probe_us);
      if (probes.size() < data.runs.size())
        data.warnings.push_back(fmt::format("{} of {} runs recorded no host probe: they are predicted at the profile's",
                                            data.runs.size() - probes.size(), data.runs.size()));
    } else if (start.device.host.probe_us > 0) {
      probe_note = fmt::format("the runs recorded no host probe: the host costs fitted to them are at an unknown one, so "
                               "the profile's host.probe_us ({:.2f} us) is not carried over",
                               start.device.host.probe_us);
      start.device.host.probe_us = 0;
    }
  }
  fo.threads = req.threads;
  const PredictFn predict = [&predictor](const ModelParams& m, const std::vector<char>& want, std::vector<double>& o) {
    predictor.predict(m, want, o);
  };
  // The default fit prices fused attention kernels after the rest, with their own factors on
  // top of the fitted GEMM curve (a joint fit bends the curve to the attention kernel); and,
  // where training runs' events or the micro-benchmarks of the graph's own ops name their op
  // kinds, each kind's bandwidth factor on top of the common efficiency, and the optimizer's
  // factor on its step events; the first pass fits the common efficiency on the other
  // bandwidth-bound kernels (the micro-benchmarks' family kernels and curves, the copies and
  // the norms' reductions).
  std::vector<const ParamDef*> later = {find_param("compute.attention_efficiency"),
                                        find_param("compute.attention_backward_efficiency"),
                                        find_param("compute.attention_dropout_efficiency"),
                                        find_param("compute.attention_dropout_backward_efficiency"),
                                        find_param("compute.attention_half_seq")};
  auto op_factor_kernel = [](const Observation& o) {
    return o.kind == ObsKind::kernel && o.kernel.cls == KernelClass::memory &&
           (o.kernel.op_kind.has_value() || o.kernel.optimizer);
  };
  if (req.fit.empty()) {
    std::set<std::string> kinds;
    for (const auto& o : data.obs)
      if (o.fit && op_factor_kernel(o))
        kinds.insert(o.kernel.optimizer ? "compute.optimizer_efficiency"
                                        : op_factor_name(*o.kernel.op_kind, o.kernel.backward));
    for (const auto& d : param_registry())
      if (kinds.count(d.name)) {
        fo.candidates.push_back(&d);
        later.push_back(&d);
      }
  }
  out.fit = req.fit.empty()
                ? fit_in_two_passes(predict, data.obs, start, fo,
                                    [&](const Observation& o) {
                                      return (o.kind == ObsKind::kernel && o.kernel.cls == KernelClass::attention) ||
                                             op_factor_kernel(o);
                                    },
                                    later)
                : fit(predict, data.obs, start, fo);
  if (!probe_note.empty()) out.fit.notes.insert(out.fit.notes.begin(), probe_note);
  out.profile = make_profile(data, out.fit, cluster, now_utc());
  if (const DriverSummary d = summarize(data.driver);
      d.context_spread > (1 << 20) || d.libraries_spread > (1 << 20) || d.nccl_spread > (1 << 20))
    // The same GPU, driver and NCCL give the same figures run after run.
    data.warnings.push_back(fmt::format("the train --out runs' driver figures differ by up to {:.1f} MiB (context), "
                                        "{:.1f} MiB (libraries) and {:.1f} MiB (NCCL): other GPUs, drivers or NCCL "
                                        "versions among them? the profile keeps their medians",
                                        static_cast<double>(d.context_spread) / 1048576.0,
                                        static_cast<double>(d.libraries_spread) / 1048576.0,
                                        static_cast<double>(d.nccl_spread) / 1048576.0));

  out.warnings = data.warnings;
  out.text = summary_text(data, out.fit, cluster);
  if (req.report) out.text += detail_text(data, out.fit);
  const auto& u = out.profile.uncertainty;
  out.text += fmt::format("\npredictions with this profile carry ±{:.1f}% (one standard deviation; {})\n",
                          100 * u.iteration_rel_sd, u.basis);
  if (const auto& e = out.profile.executor_memory; e.measured)
    out.text += fmt::format("zeroplan's CUDA executor on this GPU ({} train --out run{}; simulate --executor reads them): "
                            "context {:.1f} MiB, libraries {:.1f} MiB beyond the kernels' 96 MiB, one rank's NCCL "
                            "communicator {}, cuDNN's handle and attention engines {}\n",
                            out.profile.executor_runs, out.profile.executor_runs == 1 ? "" : "s", e.context.mib(),
                            e.libraries.mib(),
                            e.nccl_measured ? fmt::format("{:.1f} MiB", e.nccl_one_rank.mib()) : std::string("not measured"),
                            e.cudnn_measured ? fmt::format("{:.1f} MiB", e.cudnn.mib())
                                             : std::string("not measured (no run with --attention-kernel cudnn)"));
  out.json = calibration_json(data, out.fit, cluster);
  out.json["uncertainty"] = {{"iteration_rel_sd", u.iteration_rel_sd}, {"basis", u.basis}, {"by_class", u.by_class}};
  if (!req.out.empty()) {
    write_cluster_profile(out.profile, req.out);
    out.profile.file = req.out;
    out.text += fmt::format("profile written to {}\n", req.out);
    out.json["profile"] = req.out;
  }
  return out;
}

}  // namespace zp::cli
