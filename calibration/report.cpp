#include "calibration/report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "sim/collective_model.hpp"
#include "sim/device.hpp"

namespace zp::calibration {

namespace {

constexpr double kGiga = 1e9;

std::string class_of(const Observation& o) {
  switch (o.kind) {
    case ObsKind::collective: return "collective";
    case ObsKind::kernel: return kernel_class_name(o.kernel.cls);
    case ObsKind::phase: return fmt::format("phase {}", quantity_name(o.phase.quantity));
  }
  return "?";
}

std::string tag(const Observation& o, const std::string& k) {
  auto it = o.tags.find(k);
  return it == o.tags.end() ? std::string() : it->second;
}

double rel_err(double pred, double meas) { return meas > 0 ? (pred - meas) / meas : 0; }

std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:.1f}%", v) : "-"; }

std::string value_text(const ParamDef& d, double v) {
  if (d.unit.empty()) return fmt::format("{:.4g}", v);
  return fmt::format("{:.4g} {}", v, d.unit);
}

// Root mean square of log(pred / meas) over the observations selected.
double rms_log(const std::vector<Observation>& obs, const std::vector<double>& pred, const std::vector<std::size_t>& which) {
  if (which.empty()) return 0;
  double s = 0;
  for (std::size_t i : which) {
    const double r = std::log(std::max(pred[i], 1e-12) / obs[i].measured.v);
    s += r * r;
  }
  return std::sqrt(s / static_cast<double>(which.size()));
}

// Runs none of whose observations were fitted (their phases, or, for train --out runs, the
// events timed in them).
std::set<int> held_out_runs(const Dataset& data) {
  std::set<int> fitted, all;
  for (const auto& o : data.obs) {
    const int run = o.kind == ObsKind::phase ? o.phase.run : o.kind == ObsKind::kernel ? o.kernel.run : -1;
    if (run < 0) continue;
    all.insert(run);
    if (o.fit) fitted.insert(run);
  }
  std::set<int> out;
  for (int r : all)
    if (!fitted.count(r)) out.insert(r);
  return out;
}

}  // namespace

double mape(const std::vector<Observation>& obs, const std::vector<double>& pred, const std::vector<std::size_t>& which) {
  if (which.empty()) return std::nan("");
  double s = 0;
  for (std::size_t i : which) s += std::abs(rel_err(pred[i], obs[i].measured.v));
  return 100.0 * s / static_cast<double>(which.size());
}

std::vector<SourceSummary> summarize(const Dataset& data, const FitResult& fit) {
  std::map<std::pair<std::string, std::string>, SourceSummary> by;
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const Observation& o = data.obs[i];
    auto key = std::make_pair(tag(o, "source"), class_of(o));
    SourceSummary& s = by[key];
    s.source = key.first;
    s.what = key.second;
    (o.fit ? s.fit : s.held).push_back(i);
  }
  std::vector<SourceSummary> out;
  for (auto& [k, s] : by) {
    s.fit_before = mape(data.obs, fit.pred_before, s.fit);
    s.fit_after = mape(data.obs, fit.pred_after, s.fit);
    s.held_before = mape(data.obs, fit.pred_before, s.held);
    s.held_after = mape(data.obs, fit.pred_after, s.held);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<PhaseSummary> held_out_phases(const Dataset& data, const FitResult& fit) {
  const std::set<int> held = held_out_runs(data);
  std::map<std::pair<int, int>, std::vector<std::size_t>> by;
  std::map<std::pair<int, int>, std::set<int>> runs;
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const Observation& o = data.obs[i];
    if (o.kind != ObsKind::phase || !held.count(o.phase.run)) continue;
    const auto key = std::make_pair(static_cast<int>(o.phase.quantity), static_cast<int>(o.phase.phase));
    by[key].push_back(i);
    runs[key].insert(o.phase.run);
  }
  std::vector<PhaseSummary> out;
  for (const auto& [k, idx] : by) {
    PhaseSummary s;
    s.quantity = quantity_name(static_cast<Quantity>(k.first));
    s.phase = phase_label(static_cast<PhaseName>(k.second));
    s.runs = static_cast<int>(runs[k].size());
    s.before = mape(data.obs, fit.pred_before, idx);
    s.after = mape(data.obs, fit.pred_after, idx);
    out.push_back(s);
  }
  return out;
}

std::vector<CurveFit> collective_curves(const Dataset& data, const FitResult& fit) {
  std::map<std::tuple<std::string, int, int, std::string>, CurveFit> by;
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const Observation& o = data.obs[i];
    if (o.kind != ObsKind::collective) continue;
    const std::string file = tag(o, "file").empty() ? tag(o, "source") : tag(o, "file");
    auto& c = by[{zero::coll_kind_name(o.coll.kind), o.coll.ranks, o.coll.nodes, file}];
    c.kind = zero::coll_kind_name(o.coll.kind);
    c.file = file;
    c.ranks = o.coll.ranks;
    c.nodes = o.coll.nodes;
    c.obs.push_back(i);
  }
  std::vector<CurveFit> out;
  for (auto& [k, c] : by) {
    std::sort(c.obs.begin(), c.obs.end(),
              [&](std::size_t a, std::size_t b) { return data.obs[a].coll.bytes < data.obs[b].coll.bytes; });
    std::vector<double> s, t;
    for (std::size_t i : c.obs) {
      s.push_back(static_cast<double>(data.obs[i].coll.bytes.v));
      t.push_back(data.obs[i].measured.v);
    }
    c.measured = fit_alpha_beta(s, t);
    const auto kind = data.obs[c.obs.front()].coll.kind;
    c.busbw_gbps = c.measured.beta * sim::CollectiveModel::busbw_factor(kind, c.ranks) / kGiga;
    c.mape_before = mape(data.obs, fit.pred_before, c.obs);
    c.mape_after = mape(data.obs, fit.pred_after, c.obs);
    for (std::size_t i : c.obs) c.worst_after = std::max(c.worst_after, 100 * std::abs(rel_err(fit.pred_after[i], data.obs[i].measured.v)));
    out.push_back(std::move(c));
  }
  return out;
}

std::string summary_text(const Dataset& data, const FitResult& fit, const sim::ClusterSpec& cluster) {
  std::string t;
  int nfit = 0;
  for (const auto& o : data.obs) nfit += o.fit ? 1 : 0;
  t += fmt::format("calibrate: {} observations from {} file{} ({} fitted, {} held out) on {} ({})\n", data.obs.size(),
                   data.files.size(), data.files.size() == 1 ? "" : "s", nfit, data.obs.size() - static_cast<std::size_t>(nfit),
                   cluster.name, sim::describe_cluster(cluster));
  const Environment& e = data.env;
  std::vector<std::string> env;
  if (!e.gpu_name.empty()) env.push_back(e.gpu_count > 0 ? fmt::format("{} x {}", e.gpu_count, e.gpu_name) : e.gpu_name);
  if (!e.driver.empty()) env.push_back("driver " + e.driver);
  if (!e.cuda.empty()) env.push_back("CUDA " + e.cuda);
  if (!e.nccl.empty()) env.push_back("NCCL " + e.nccl);
  if (!e.deepspeed.empty()) env.push_back("DeepSpeed " + e.deepspeed);
  if (!e.torch.empty()) env.push_back("torch " + e.torch);
  if (!e.date.empty()) env.push_back(e.date);
  if (!env.empty()) {
    std::string line;
    for (const auto& x : env) line += (line.empty() ? "" : ", ") + x;
    t += "measured on: " + line + "\n";
  }
  t += fmt::format("fit: {} parameter{}, {} iterations, {} simulator evaluations, {:.2f} s{}\n", fit.fitted.size(),
                   fit.fitted.size() == 1 ? "" : "s", fit.iterations, fit.evaluations, fit.seconds,
                   fit.converged ? "" : " (not converged)");
  if (!fit.fitted.empty()) {
    t += fmt::format("\n{:<40} {:>14} {:>14} {:>12}\n", "parameter", "before", "after", "± (68%)");
    for (const auto& p : fit.fitted)
      t += fmt::format("{:<40} {:>14} {:>14} {:>12}{}\n", p.def->name, value_text(*p.def, p.initial),
                       value_text(*p.def, p.value), value_text(*p.def, p.sd), p.at_bound ? "  at its bound" : "");
  }
  if (!fit.refused.empty()) {
    t += "\nnot fitted (kept at their values before):\n";
    for (const auto& r : fit.refused) t += fmt::format("- {}: {}\n", r.name, r.reason);
  }
  for (const auto& n : fit.notes) t += "note: " + n + "\n";
  t += fmt::format("\n{:<16} {:<18} {:>6} {:>9} {:>9}   {:>6} {:>9} {:>9}\n", "source", "observations", "fitted", "before",
                   "after", "held", "before", "after");
  for (const auto& s : summarize(data, fit))
    t += fmt::format("{:<16} {:<18} {:>6} {:>9} {:>9}   {:>6} {:>9} {:>9}\n", s.source, s.what, s.fit.size(),
                     pct(s.fit_before), pct(s.fit_after), s.held.size(), pct(s.held_before), pct(s.held_after));
  t += "MAPE: mean |predicted / measured - 1| before and after the fit, of the fitted and the held-out observations\n";
  const auto ph = held_out_phases(data, fit);
  if (!ph.empty()) {
    t += fmt::format("\nheld-out runs (none of their phases fitted), MAPE per phase:\n{:<20} {:<9} {:>5} {:>9} {:>9}\n",
                     "phase", "quantity", "runs", "before", "after");
    for (const auto& s : ph)
      t += fmt::format("{:<20} {:<9} {:>5} {:>9} {:>9}\n", s.phase, s.quantity, s.runs, pct(s.before), pct(s.after));
  }
  return t;
}

std::string detail_text(const Dataset& data, const FitResult& fit) {
  std::string t;
  const auto& pb = fit.pred_before;
  const auto& pa = fit.pred_after;
  for (const auto& c : collective_curves(data, fit)) {
    t += fmt::format("\n{} over {} ranks{} ({}): measured alpha-beta {:.1f} us + S / {:.2f} GB/s (busbw {:.2f} GB/s), "
                     "MAPE {} -> {}, worst {} after\n",
                     c.kind, c.ranks, c.nodes > 1 ? fmt::format(" on {} nodes", c.nodes) : "", c.file,
                     c.measured.alpha_s * 1e6, c.measured.beta / kGiga, c.busbw_gbps, pct(c.mape_before), pct(c.mape_after),
                     pct(c.worst_after));
    t += fmt::format("{:>14} {:>12} {:>12} {:>12} {:>9} {:>9}{}\n", "size (B)", "measured_us", "before_us", "after_us",
                     "before", "after", "");
    for (std::size_t i : c.obs) {
      const auto& o = data.obs[i];
      t += fmt::format("{:>14} {:>12.2f} {:>12.2f} {:>12.2f} {:>8.1f}% {:>8.1f}%{}\n", o.coll.bytes.v, o.measured.v * 1e6,
                       pb[i] * 1e6, pa[i] * 1e6, 100 * rel_err(pb[i], o.measured.v), 100 * rel_err(pa[i], o.measured.v),
                       o.fit ? "" : "  held out");
    }
  }
  // Kernels, by source.
  bool header = false;
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const auto& o = data.obs[i];
    if (o.kind != ObsKind::kernel) continue;
    if (!header) {
      t += fmt::format("\nkernels\n{:<58} {:>12} {:>12} {:>12} {:>9} {:>9}\n", "kernel", "measured_us", "before_us",
                       "after_us", "before", "after");
      header = true;
    }
    t += fmt::format("{:<58} {:>12.2f} {:>12.2f} {:>12.2f} {:>8.1f}% {:>8.1f}%{}\n", o.label.substr(0, 58),
                     o.measured.v * 1e6, pb[i] * 1e6, pa[i] * 1e6, 100 * rel_err(pb[i], o.measured.v),
                     100 * rel_err(pa[i], o.measured.v), o.fit ? "" : "  held out");
  }
  // Phases, run by run.
  std::map<int, std::vector<std::size_t>> by_run;
  for (std::size_t i = 0; i < data.obs.size(); ++i)
    if (data.obs[i].kind == ObsKind::phase) by_run[data.obs[i].phase.run].push_back(i);
  if (!by_run.empty())
    t += fmt::format("\nphases\n{:<30} {:<18} {:<8} {:>11} {:>11} {:>11} {:>9} {:>9}  {}\n", "run", "phase", "quantity",
                     "measured_ms", "before_ms", "after_ms", "before", "after", "");
  const std::set<int> held = held_out_runs(data);
  for (const auto& [r, idx] : by_run) {
    const RunConfig& rc = data.runs[static_cast<std::size_t>(r)];
    for (std::size_t i : idx) {
      const auto& o = data.obs[i];
      // A run's phase: fitted, held out (no observation of its run fitted), or reported (the
      // sum of events fitted one by one, or an iteration).
      std::string note = o.fit ? "fitted" : held.count(r) ? "held out" : "reported";
      if (o.spread > 0) note += fmt::format(", ±{:.0f}% step to step", 100 * o.spread);
      t += fmt::format("{:<30} {:<18} {:<8} {:>11.2f} {:>11.2f} {:>11.2f} {:>8.1f}% {:>8.1f}%  {}\n", rc.name.substr(0, 30),
                       phase_label(o.phase.phase), quantity_name(o.phase.quantity), o.measured.ms(), pb[i] * 1e3,
                       pa[i] * 1e3, 100 * rel_err(pb[i], o.measured.v), 100 * rel_err(pa[i], o.measured.v), note);
    }
  }
  return t;
}

nlohmann::json calibration_json(const Dataset& data, const FitResult& fit, const sim::ClusterSpec& cluster) {
  nlohmann::json j;
  j["cluster"] = {{"name", cluster.name}, {"description", sim::describe_cluster(cluster)}};
  j["files"] = data.files;
  j["warnings"] = data.warnings;
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : fit.fitted)
    params.push_back({{"name", p.def->name}, {"unit", p.def->unit}, {"before", p.initial}, {"after", p.value},
                      {"sd", p.sd}, {"at_bound", p.at_bound}});
  j["parameters"] = params;
  nlohmann::json refused = nlohmann::json::array();
  for (const auto& r : fit.refused) refused.push_back({{"name", r.name}, {"reason", r.reason}});
  j["refused"] = refused;
  j["notes"] = fit.notes;
  j["fit"] = {{"iterations", fit.iterations}, {"evaluations", fit.evaluations}, {"seconds", fit.seconds},
              {"converged", fit.converged}, {"observations_fitted", fit.n_fit}, {"dof", fit.dof}};
  nlohmann::json sources = nlohmann::json::array();
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const auto& s : summarize(data, fit))
    sources.push_back({{"source", s.source}, {"observations", s.what}, {"fitted", s.fit.size()}, {"held_out", s.held.size()},
                       {"mape_fitted_before", num(s.fit_before)}, {"mape_fitted_after", num(s.fit_after)},
                       {"mape_held_out_before", num(s.held_before)}, {"mape_held_out_after", num(s.held_after)}});
  j["sources"] = sources;
  nlohmann::json ph = nlohmann::json::array();
  for (const auto& s : held_out_phases(data, fit))
    ph.push_back({{"phase", s.phase}, {"quantity", s.quantity}, {"runs", s.runs}, {"mape_before", num(s.before)},
                  {"mape_after", num(s.after)}});
  j["held_out_phases"] = ph;
  nlohmann::json curves = nlohmann::json::array();
  for (const auto& c : collective_curves(data, fit))
    curves.push_back({{"kind", c.kind}, {"ranks", c.ranks}, {"nodes", c.nodes}, {"file", c.file},
                      {"alpha_us", c.measured.alpha_s * 1e6}, {"alpha_sd_us", c.measured.alpha_sd * 1e6},
                      {"algbw_gbps", c.measured.beta / kGiga}, {"busbw_gbps", c.busbw_gbps},
                      {"mape_before", num(c.mape_before)}, {"mape_after", num(c.mape_after)}, {"worst_after", num(c.worst_after)}});
  j["curves"] = curves;
  nlohmann::json obs = nlohmann::json::array();
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const auto& o = data.obs[i];
    obs.push_back({{"label", o.label}, {"source", o.source}, {"kind", class_of(o)}, {"fit", o.fit},
                   {"measured_s", o.measured.v}, {"before_s", fit.pred_before[i]}, {"after_s", fit.pred_after[i]},
                   {"tags", o.tags}});
  }
  j["observations"] = obs;
  return j;
}

ClusterProfile make_profile(const Dataset& data, const FitResult& fit, const sim::ClusterSpec& cluster, const std::string& created) {
  ClusterProfile p;
  p.created = created;
  ClusterInfo& c = p.cluster;
  c.name = cluster.name;
  c.gpu = cluster.gpu;
  c.gpu_name = data.env.gpu_name;
  c.count = data.env.gpu_count > 0 ? data.env.gpu_count : cluster.world_size();
  c.nodes = cluster.nodes;
  c.gpus_per_node = cluster.gpus_per_node;
  c.intra = sim::intra_node_name(cluster.intra);
  c.nics_per_node = cluster.nics_per_node;
  c.nic_gbps = cluster.nic_gbps;
  c.topology = sim::describe_cluster(cluster);
  c.driver = data.env.driver;
  c.cuda = data.env.cuda;
  c.nccl = data.env.nccl;
  c.deepspeed = data.env.deepspeed;
  c.torch = data.env.torch;
  c.host = data.env.host;
  c.measured = data.env.date;
  p.device = fit.after.device;
  p.device.source = fmt::format("zeroplan calibrate, {} ({})", created, cluster.name);
  // The executor's memory outside the program: the runs' driver figures (medians).
  if (!data.driver.empty()) {
    const DriverSummary d = summarize(data.driver);
    auto& e = p.executor_memory;
    e.measured = true;
    e.context = Bytes{d.context};
    e.libraries = Bytes{d.libraries};
    e.nccl_measured = d.nccl >= 0;
    if (e.nccl_measured) e.nccl_one_rank = Bytes{d.nccl};
    e.cudnn_measured = d.cudnn >= 0;
    if (e.cudnn_measured) e.cudnn = Bytes{d.cudnn};
    p.executor_runs = d.runs;
    e.source = fmt::format("cudaMemGetInfo in {} train --device cuda run{} ({}), medians; calibrate {}", d.runs,
                           d.runs == 1 ? "" : "s", data.driver.front().gpu_name, created);
  }
  p.collective = fit.after.collective;
  for (const auto& f : fit.fitted)
    p.parameters.push_back({f.def->name, f.def->unit, f.at_bound ? "at_bound" : "fitted", f.initial, f.value, f.sd});
  p.refused = fit.refused;
  // Uncertainty by class: held-out residuals when there are three or more, else in-sample
  // ones widened by the degrees of freedom the fit used.
  std::map<std::string, std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> cls;
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const auto& o = data.obs[i];
    if (o.kind == ObsKind::phase && o.phase.phase == PhaseName::iteration) continue;
    std::string k = o.kind == ObsKind::phase ? fmt::format("phase {}", quantity_name(o.phase.quantity))
                                             : o.kind == ObsKind::collective || o.kernel.cls == KernelClass::collective ? "collective"
                                                                                                                      : "kernel";
    (o.fit ? cls[k].first : cls[k].second).push_back(i);
  }
  const double widen = fit.dof > 0 ? std::sqrt(static_cast<double>(fit.n_fit) / fit.dof) : 1.0;
  for (const auto& [k, v] : cls) {
    if (v.second.size() >= 3) p.uncertainty.by_class[k] = rms_log(data.obs, fit.pred_after, v.second);
    else if (!v.first.empty()) p.uncertainty.by_class[k] = rms_log(data.obs, fit.pred_after, v.first) * widen;
  }
  // The iteration: measured iterations of held-out runs, else of fitted runs (DeepSpeed's wall
  // clock, or the sum of the executor's events).
  const std::set<int> held = held_out_runs(data);
  std::vector<std::size_t> it_held, it_fit;
  for (std::size_t i = 0; i < data.obs.size(); ++i) {
    const auto& o = data.obs[i];
    if (o.kind == ObsKind::phase && o.phase.phase == PhaseName::iteration && o.phase.quantity != Quantity::gpu_busy)
      (held.count(o.phase.run) ? it_held : it_fit).push_back(i);
  }
  auto& u = p.uncertainty;
  if (it_held.size() >= 3) {
    u.iteration_rel_sd = rms_log(data.obs, fit.pred_after, it_held);
    u.basis = fmt::format("root mean square of log(predicted / measured) iteration time over {} held-out runs", it_held.size());
  } else if (!it_fit.empty()) {
    // Fewer than three held-out runs: what the fitted runs say, in-sample (widened by the
    // degrees of freedom the fit used), never below the model's own floor of 2%.
    std::vector<std::size_t> wall;
    for (std::size_t i = 0; i < data.obs.size(); ++i) {
      const auto& o = data.obs[i];
      if (o.kind == ObsKind::phase && o.phase.quantity == Quantity::wall && o.fit) wall.push_back(i);
    }
    const double runs = rms_log(data.obs, fit.pred_after, it_fit) * widen;
    const double phases = rms_log(data.obs, fit.pred_after, wall) * widen;
    u.iteration_rel_sd = std::max({0.02, runs, phases});
    u.basis = fmt::format("in-sample: {} fitted run{} and no held-out ones (their iterations {:.1f}%, their phases {:.1f}%, "
                          "widened by the fit's degrees of freedom; at least 2%); runs held out with --fit-where would test it",
                          it_fit.size(), it_fit.size() == 1 ? "" : "s", 100 * runs, 100 * phases);
  } else {
    const double k = u.by_class.count("kernel") ? u.by_class["kernel"] : 0;
    const double col = u.by_class.count("collective") ? u.by_class["collective"] : 0;
    u.iteration_rel_sd = std::max(0.02, std::sqrt(k * k + col * col));
    u.basis = "no training run was measured: the kernel and collective residuals combined (an iteration adds errors "
              "these do not show, such as host work and overlap)";
  }
  p.sources = calibration_json(data, fit, cluster)["sources"];
  p.curves = calibration_json(data, fit, cluster)["curves"];
  nlohmann::json res = nlohmann::json::array();
  for (std::size_t i = 0; i < data.obs.size() && i < 5000; ++i) {
    const auto& o = data.obs[i];
    res.push_back({{"label", o.label}, {"fit", o.fit}, {"measured_s", o.measured.v}, {"before_s", fit.pred_before[i]},
                   {"after_s", fit.pred_after[i]}});
  }
  p.residuals = res;
  return p;
}

}  // namespace zp::calibration
