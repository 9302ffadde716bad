// View 5: a measurement (`train --out`) over its prediction: bytes by category and by
// collective kind, time per phase, and every event's time.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "report/html.hpp"
#include "report/views.hpp"

namespace zp::report::detail {

namespace {

constexpr const char* kPredicted = colour::blue;
constexpr const char* kMeasured = colour::orange;

struct Pair {
  std::string key, label;
  double predicted = 0, measured = 0;
};

// Horizontal bars, predicted above measured for each row; linear from 0, or logarithmic.
std::string paired_bars(const std::vector<Pair>& rows, const std::string& axis, bool log_scale,
                        const std::function<std::string(double)>& shown) {
  const double W = 860, L = 190, R = 150, T = 10, rowH = 30, B = 40;
  const double pw = W - L - R, H = T + rowH * static_cast<double>(rows.size()) + B;
  double hi = 0, lo = std::numeric_limits<double>::infinity();
  for (const auto& r : rows)
    for (double v : {r.predicted, r.measured}) {
      hi = std::max(hi, v);
      if (v > 0) lo = std::min(lo, v);
    }
  if (!(hi > 0)) hi = 1;
  std::function<double(double)> x;
  std::string axis_text = axis;
  std::string s = svg_open(W, H, axis);
  if (log_scale) {
    const double d0 = std::floor(std::log10(std::isfinite(lo) ? lo : hi)), d1 = std::ceil(std::log10(hi));
    const double span = std::max(1.0, d1 - d0);
    x = [=](double v) { return v > 0 ? L + pw * (std::log10(v) - d0) / span : L; };
    for (double d = d0; d <= d1; d += 1) {
      const double xx = L + pw * (d - d0) / span;
      s += line(xx, T, xx, H - B, "class=\"grid\"");
      s += text(xx, H - B + 14, tick_text(std::pow(10.0, d)), "class=\"tick\" text-anchor=\"middle\"");
    }
  } else {
    // Bytes: ticks round in the binary unit the largest value reads in.
    struct Unit {
      double div;
      const char* name;
    };
    Unit u{1, "B"};
    for (const Unit c : {Unit{1024.0 * 1024 * 1024, "GiB"}, Unit{1024.0 * 1024, "MiB"}, Unit{1024.0, "KiB"}})
      if (hi >= c.div) {
        u = c;
        break;
      }
    const auto ticks = nice_ticks(hi / u.div, 6);
    const double top = std::max(hi, ticks.back() * u.div);
    x = [=](double v) { return L + pw * v / top; };
    for (double t : ticks) {
      s += line(x(t * u.div), T, x(t * u.div), H - B, "class=\"grid\"");
      s += text(x(t * u.div), H - B + 14, tick_text(t), "class=\"tick\" text-anchor=\"middle\"");
    }
    axis_text = fmt::format("{} ({})", axis, u.name);
  }
  s += line(L, T, L, H - B, "class=\"ax\"");
  s += text(L + pw / 2, H - 8, axis_text, "class=\"axl\" text-anchor=\"middle\"");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double y = T + rowH * static_cast<double>(i);
    s += text(L - 8, y + 18, r.label, "class=\"lbl\" text-anchor=\"end\"");
    const double xp = x(r.predicted), xm = x(r.measured);
    s += rect(L, y + 4, std::max(0.0, xp - L), 10, kPredicted, fmt::format("{}: predicted {}", r.label, shown(r.predicted)));
    s += rect(L, y + 15, std::max(0.0, xm - L), 10, kMeasured, "");
    s += rect(L, y + 15, std::max(0.0, xm - L), 10, "url(#zp-hatch)", fmt::format("{}: measured {}", r.label, shown(r.measured)));
    const std::string verdict =
        r.predicted == r.measured ? "exact"
        : r.predicted > 0         ? fmt::format("measured/predicted {:.3g}", r.measured / r.predicted)
                                  : "";
    s += text(L + pw + 6, y + 18, verdict, "class=\"small\"");
  }
  return s + "</svg>\n";
}

std::string pair_table(const std::string& id, const std::string& head, const std::vector<Pair>& rows,
                       const std::function<std::string(double)>& shown, bool integral) {
  std::string h = fmt::format("<table data-table=\"{}\"><thead><tr><th>{}</th><th>predicted</th><th>measured</th>"
                              "<th>measured − predicted</th></tr></thead><tbody>\n",
                              id, esc(head));
  for (const auto& r : rows) {
    h += fmt::format("<tr data-row=\"{}\"><th>{}</th>", esc(r.key), esc(r.label));
    if (integral) {
      h += num_cell(static_cast<std::int64_t>(r.predicted), shown(r.predicted));
      h += num_cell(static_cast<std::int64_t>(r.measured), shown(r.measured));
      h += num_cell(static_cast<std::int64_t>(r.measured) - static_cast<std::int64_t>(r.predicted),
                    r.measured == r.predicted ? "exact" : grouped(static_cast<std::int64_t>(r.measured - r.predicted)) + " B");
    } else {
      h += num_cell(r.predicted, shown(r.predicted));
      h += num_cell(r.measured, shown(r.measured));
      h += num_cell(r.measured - r.predicted, r.predicted > 0 ? fmt::format("×{:.3g}", r.measured / r.predicted) : "");
    }
    h += "</tr>\n";
  }
  return h + "</tbody></table>\n";
}

}  // namespace

Section measured_vs_predicted(const Report& r, const PageOptions& opt) {
  Section s{"measured-vs-predicted", "5. Measured against predicted", "", 0, 0, false};
  std::string& h = s.html;
  const MeasuredView& mv = *r.measured;
  const auto& c = mv.comparison;
  const auto bytes_shown = [](double v) { return bytes_text(static_cast<std::int64_t>(v)); };
  const auto ms_shown = [](double v) { return fmt::format("{:.4g} ms", v); };
  h += fmt::format("<p>Measurement <code>{}</code> ({} backend, ZeRO stage {}, rank {} of {}, micro-batch {} × {} "
                   "micro-steps) against the prediction for {}. Memory: <b>{}</b>; communication: <b>{}</b>.</p>\n",
                   esc(mv.file), esc(c["time"].value("backend", "")), c.value("stage", 0), c.value("rank", 0),
                   c.value("world_size", 0), c.value("micro_batch", 0), c.value("gas", 0),
                   esc(c["predicted"].value("gpu", "")), c.value("exact_memory", false) ? "exact" : "differs",
                   c.value("exact_comm", false) ? "exact" : "differs");
  h += legend_html({{kPredicted, "predicted", ""}, {kMeasured, "measured", "zp-hatch"}});

  std::vector<Pair> mem;
  const auto& cats = c["memory"]["by_category"];
  for (int k = 0; k < zero::kNumCategories; ++k) {  // the program's order, then any other
    const char* name = zero::category_name(static_cast<zero::Category>(k));
    if (cats.contains(name)) mem.push_back({name, name, cats[name].value("predicted", 0.0), cats[name].value("measured", 0.0)});
  }
  for (auto it = cats.begin(); it != cats.end(); ++it)
    if (std::none_of(mem.begin(), mem.end(), [&](const Pair& q) { return q.key == it.key(); }))
      mem.push_back({it.key(), it.key(), it.value().value("predicted", 0.0), it.value().value("measured", 0.0)});
  for (const char* k : {"peak_allocated", "reserved", "host_peak"})
    if (c["memory"].contains(k))
      mem.push_back({k, k == std::string("peak_allocated") ? "peak allocated" : k == std::string("reserved") ? "reserved" : "host peak",
                     c["memory"][k].value("predicted", 0.0), c["memory"][k].value("measured", 0.0)});
  h += "<h3>Device memory at the peak, by category</h3>\n";
  h += paired_bars(mem, "bytes at the peak", false, bytes_shown);
  h += pair_table("measured-memory", "bytes at the peak", mem, bytes_shown, true);
  const auto& pe = c["memory"]["peak_event"];
  h += fmt::format("<p class=\"note\">Peak event: predicted <code>{}</code>, measured <code>{}</code> ({}).</p>\n",
                   esc(pe.value("predicted", "")), esc(pe.value("measured", "")), pe.value("same", false) ? "the same" : "different");

  std::vector<Pair> comm;
  for (auto it = c["comm"]["by_kind"].begin(); it != c["comm"]["by_kind"].end(); ++it)
    comm.push_back({it.key(), it.key(), it.value().value("predicted", 0.0), it.value().value("measured", 0.0)});
  comm.push_back({"total", "total", c["comm"]["bytes_per_rank"].value("predicted", 0.0),
                  c["comm"]["bytes_per_rank"].value("measured", 0.0)});
  h += "<h3>Bytes sent per rank per step, by collective kind</h3>\n";
  if (std::all_of(comm.begin(), comm.end(), [](const Pair& q) { return q.predicted == 0 && q.measured == 0; }))
    h += "<p class=\"note\">No bytes sent, predicted or measured (one rank).</p>\n";
  else
    h += paired_bars(comm, "bytes sent per rank per step", false, bytes_shown);
  h += pair_table("measured-comm", "bytes sent", comm, bytes_shown, true);

  std::vector<Pair> times;
  for (const char* k : {"forward", "backward", "step", "iteration"})
    if (c["time"]["phases"].contains(k))
      times.push_back({k, k, c["time"]["phases"][k].value("predicted_ms", 0.0), c["time"]["phases"][k].value("measured_ms", 0.0)});
  h += "<h3>Time per optimizer step, by phase</h3>\n";
  h += paired_bars(times, "milliseconds per optimizer step (logarithmic)", true, ms_shown);
  h += pair_table("measured-time", "ms per step", times, ms_shown, false);
  h += "<p class=\"note\">" + esc(c["time"].value("note", "")) + "</p>\n";

  // Every event's time, where the prediction has its program.
  const Column* col = mv.column >= 0 ? &r.columns[static_cast<std::size_t>(mv.column)] : nullptr;
  if (!col || !col->program || !col->time || !mv.measured.contains("events") || !mv.measured["events"].is_array()) {
    h += unavailable("Event by event: needs the prediction's step program (run the report with the inputs rather than "
                     "a --json file).");
    return s;
  }
  std::map<std::string, double> measured_s;
  for (const auto& e : mv.measured["events"])
    if (e.is_object() && e.contains("id") && e["id"].is_string() && e.contains("seconds") && e["seconds"].is_number())
      measured_s[e["id"].get<std::string>()] = e["seconds"].get<double>();
  struct Point {
    double predicted_ms, measured_ms;
    zero::EventId id;
    int kind;
  };
  std::vector<Point> pts;
  const auto& p = *col->program;
  for (zero::EventId e = p.step_begin; e < static_cast<zero::EventId>(p.events.size()); ++e) {
    const auto& ev = p.events[static_cast<std::size_t>(e)];
    if (ev.kind == zero::EventKind::marker) continue;
    const auto it = measured_s.find(p.event_name(e));
    if (it == measured_s.end()) continue;
    const auto& et = col->time->events[static_cast<std::size_t>(e)];
    const double pm = (et.end - et.start).ms(), mm = it->second * 1e3;
    if (pm > 0 && mm > 0) pts.push_back({pm, mm, e, static_cast<int>(ev.kind)});
  }
  const std::size_t every = std::max<std::size_t>(1, (pts.size() + opt.scatter_events - 1) / opt.scatter_events);
  s.aggregated = every > 1;
  s.events = static_cast<std::int64_t>(pts.size());
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& q : pts) {
    lo = std::min({lo, q.predicted_ms, q.measured_ms});
    hi = std::max({hi, q.predicted_ms, q.measured_ms});
  }
  h += "<h3>Every event: measured against predicted time</h3>\n";
  if (pts.empty()) {
    h += unavailable("No event has both a predicted and a measured time.");
    return s;
  }
  static constexpr const char* kind_colour[] = {colour::sky_blue, colour::vermillion, colour::grey, colour::green, colour::black};
  static constexpr const char* kind_name[] = {"compute", "collective", "copy", "optimizer", "marker"};
  h += legend_html({{kind_colour[0], kind_name[0], ""}, {kind_colour[1], kind_name[1], ""}, {kind_colour[2], kind_name[2], ""},
                    {kind_colour[3], kind_name[3], ""}});
  const double d0 = std::floor(std::log10(lo)), d1 = std::ceil(std::log10(hi)), span = std::max(1.0, d1 - d0);
  const double S = 440, L = 70, T = 14, B = 44, pw = S - L - 14;
  auto ax = [&](double v) { return L + pw * (std::log10(v) - d0) / span; };
  auto ay = [&](double v) { return T + pw * (1 - (std::log10(v) - d0) / span); };
  h += svg_open(S, T + pw + B, "measured against predicted time of every event, ms, logarithmic");
  for (double d = d0; d <= d1; d += 1) {
    const double v = std::pow(10.0, d);
    h += line(ax(v), T, ax(v), T + pw, "class=\"grid\"") + line(L, ay(v), L + pw, ay(v), "class=\"grid\"");
    h += text(ax(v), T + pw + 14, tick_text(v), "class=\"tick\" text-anchor=\"middle\"");
    h += text(L - 5, ay(v) + 4, tick_text(v), "class=\"tick\" text-anchor=\"end\"");
  }
  h += line(ax(std::pow(10.0, d0)), ay(std::pow(10.0, d0)), ax(std::pow(10.0, d1)), ay(std::pow(10.0, d1)),
            "class=\"limit\" stroke-dasharray=\"4,3\"");
  h += text(L + pw / 2, T + pw + 34, "predicted (ms)", "class=\"axl\" text-anchor=\"middle\"");
  h += fmt::format("<text class=\"axl\" transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">measured (ms)</text>",
                   px(L - 46), px(T + pw / 2));
  for (std::size_t i = 0; i < pts.size(); i += every) {
    const auto& q = pts[i];
    h += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.2\" fill=\"{}\" fill-opacity=\"0.7\"><title>{}: predicted {:.4g} ms, "
                     "measured {:.4g} ms</title></circle>",
                     px(ax(q.predicted_ms)), px(ay(q.measured_ms)), kind_colour[q.kind], esc(p.event_name(q.id)),
                     q.predicted_ms, q.measured_ms);
  }
  h += "</svg>\n";
  h += fmt::format("<p class=\"note\">{} events with a time on both sides{}; the dashed diagonal is measured = "
                   "predicted. Measured times are the mean over the timed steps of `train`.</p>\n",
                   grouped(static_cast<std::int64_t>(pts.size())),
                   every > 1 ? fmt::format(", <b>sampled</b>: every {}th is drawn", every) : std::string());
  return s;
}

}  // namespace zp::report::detail
