// View 3: the step timeline. Each stream is a lane over time; a lane is cut into bins of
// equal time and drawn as runs of bins coloured by the work that fills most of each bin,
// so a page's size depends on its width, not on the number of events.
#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

#include "report/html.hpp"
#include "report/views.hpp"
#include "sim/series.hpp"

namespace zp::report::detail {

namespace {

// What a slice is coloured by: compute, copy, optimizer, one per collective kind, then the
// host thread's framework work (zero::EventKind::host).
constexpr int kCompute = 0, kCopy = 1, kOptimizer = 2, kColl = 3;
constexpr int kHost = kColl + zero::kNumCollKinds;
constexpr int kClasses = kHost + 1;

int class_of(const zero::Event& e) {
  switch (e.kind) {
    case zero::EventKind::compute: return kCompute;
    case zero::EventKind::copy: return kCopy;
    case zero::EventKind::optimizer: return kOptimizer;
    case zero::EventKind::collective: return kColl + static_cast<int>(e.coll);
    case zero::EventKind::marker: return -1;
    case zero::EventKind::host: return kHost;
  }
  return -1;
}

const char* class_colour(int k) {
  static constexpr std::array<const char*, kClasses> c = {
      colour::sky_blue,    // compute
      colour::grey,        // copy
      colour::green,       // optimizer
      colour::vermillion,  // all_reduce
      colour::yellow,      // reduce
      colour::orange,      // reduce_scatter
      colour::purple,      // all_gather
      colour::blue,        // broadcast
      colour::black,       // all_to_all
      colour::dark_grey,   // host (framework work)
  };
  return c[static_cast<std::size_t>(k)];
}

std::string class_label(int k) {
  if (k == kCompute) return "compute";
  if (k == kCopy) return "copy";
  if (k == kOptimizer) return "optimizer";
  if (k == kHost) return "host (framework)";
  return zero::coll_kind_name(static_cast<zero::CollKind>(k - kColl));
}

// Times shown in ms, or in s when a step is long.
struct TimeUnit {
  double per_second = 1e3;
  const char* name = "ms";
};
TimeUnit unit_for(double seconds) { return seconds >= 20.0 ? TimeUnit{1.0, "s"} : TimeUnit{1e3, "ms"}; }

std::string time_text(double seconds, const TimeUnit& u) {
  const double v = seconds * u.per_second;
  return fmt::format("{:.{}f} {}", v, std::fabs(v) >= 100 ? 1 : 3, u.name);
}

// A short duration in the unit that reads best: "3.2 µs", "1.25 ms", "2.0 s".
std::string duration_text(double seconds) {
  if (seconds >= 1.0) return fmt::format("{:.2f} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.2f} ms", seconds * 1e3);
  return fmt::format("{:.1f} µs", seconds * 1e6);
}

// One lane cut into bins over [t0, t0 + n·dt).
struct Lane {
  std::string name;
  bool hatched = false;                     // exposed communication
  std::vector<std::array<double, kClasses>> busy;
  std::vector<zero::EventId> first, last;   // events overlapping each bin
  std::vector<std::int32_t> starts;         // events starting in each bin
  Lane(std::string n, std::size_t bins, bool h)
      : name(std::move(n)), hatched(h), busy(bins), first(bins, -1), last(bins, -1), starts(bins, 0) {
    for (auto& b : busy) b.fill(0.0);
  }
  void add(int cls, zero::EventId e, double s, double end, double t0, double dt) {
    const auto n = static_cast<std::int64_t>(busy.size());
    s = std::max(s, t0);
    end = std::min(end, t0 + dt * static_cast<double>(n));
    if (!(end > s)) return;
    const auto i0 = std::clamp<std::int64_t>(static_cast<std::int64_t>((s - t0) / dt), 0, n - 1);
    const auto i1 = std::clamp<std::int64_t>(static_cast<std::int64_t>((end - t0) / dt), 0, n - 1);
    ++starts[static_cast<std::size_t>(i0)];
    for (std::int64_t i = i0; i <= i1; ++i) {
      const double lo = std::max(s, t0 + dt * static_cast<double>(i));
      const double hi = std::min(end, t0 + dt * static_cast<double>(i + 1));
      if (hi <= lo) continue;
      const auto k = static_cast<std::size_t>(i);
      busy[k][static_cast<std::size_t>(cls)] += hi - lo;
      if (first[k] < 0 || e < first[k]) first[k] = e;
      last[k] = std::max(last[k], e);
    }
  }
};

struct Window {
  double t0 = 0, t1 = 0;                    // seconds
};

struct PanelOut {
  std::string svg;
  std::size_t slices = 0;
};

std::vector<double> range_ticks(double lo, double hi, int target) {
  const auto base = nice_ticks(hi - lo, target);
  const double step = base.size() > 1 ? base[1] : std::max(hi - lo, 1e-12);
  std::vector<double> out;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi * (1 + 1e-12); t += step) out.push_back(t);
  return out;
}

PanelOut timeline_panel(const Column& c, const Window& w, std::size_t bins, const TimeUnit& u, const std::string& label,
                        const std::vector<sim::ExposedInterval>& exposed) {
  const zero::Program& p = *c.program;
  const sim::TimeReport& t = *c.time;
  const double dt = (w.t1 - w.t0) / static_cast<double>(bins);
  // Lanes: the streams that have work, compute always, then exposed communication.
  std::array<bool, zero::kNumStreams> used{};
  used[0] = true;
  for (zero::EventId e = p.step_begin; e < static_cast<zero::EventId>(p.events.size()); ++e)
    if (class_of(p.events[static_cast<std::size_t>(e)]) >= 0) used[static_cast<std::size_t>(p.events[static_cast<std::size_t>(e)].stream)] = true;
  std::vector<Lane> lanes;
  std::array<int, zero::kNumStreams> lane_of{};
  for (int s = 0; s < zero::kNumStreams; ++s) {
    lane_of[static_cast<std::size_t>(s)] = -1;
    if (!used[static_cast<std::size_t>(s)]) continue;
    lane_of[static_cast<std::size_t>(s)] = static_cast<int>(lanes.size());
    lanes.emplace_back(fmt::format("{} stream", zero::stream_name(static_cast<zero::Stream>(s))), bins, false);
  }
  for (zero::EventId e = p.step_begin; e < static_cast<zero::EventId>(p.events.size()); ++e) {
    const auto& ev = p.events[static_cast<std::size_t>(e)];
    const int k = class_of(ev);
    if (k < 0) continue;
    const auto& et = t.events[static_cast<std::size_t>(e)];
    lanes[static_cast<std::size_t>(lane_of[static_cast<std::size_t>(ev.stream)])].add(k, e, et.start.v, et.end.v, w.t0, dt);
  }
  lanes.emplace_back("exposed comm", bins, true);
  for (const auto& x : exposed) lanes.back().add(kColl + static_cast<int>(x.kind), x.collective, x.start.v, x.end.v, w.t0, dt);

  const double W = 1100, L = 118, R = 14, T = 22, laneH = 20, gap = 7;
  const double pw = W - L - R;
  const double H = T + static_cast<double>(lanes.size()) * (laneH + gap) + 40;
  auto x = [&](double s) { return L + pw * (s - w.t0) / (w.t1 - w.t0); };
  PanelOut out;
  std::string& h = out.svg;
  h += svg_open(W, H, label + ", time in " + u.name);
  h += text(L, 14, label, "class=\"lbl b\"");
  const double axis_y = T + static_cast<double>(lanes.size()) * (laneH + gap);
  for (double tk : range_ticks(w.t0 * u.per_second, w.t1 * u.per_second, 10)) {
    const double xx = x(tk / u.per_second);
    h += line(xx, T, xx, axis_y, "class=\"grid\"");
    h += text(xx, axis_y + 14, tick_text(tk), "class=\"tick\" text-anchor=\"middle\"");
  }
  h += line(L, axis_y, L + pw, axis_y, "class=\"ax\"");
  h += text(L + pw / 2, axis_y + 32, fmt::format("time ({})", u.name), "class=\"axl\" text-anchor=\"middle\"");
  // Where each micro-step and the optimizer step begin.
  {
    int ms = -2;
    double start = 0;
    std::vector<std::pair<std::string, double>> marks;
    for (zero::EventId e = p.step_begin; e < static_cast<zero::EventId>(p.events.size()); ++e) {
      const auto& ev = p.events[static_cast<std::size_t>(e)];
      if (ev.micro_step == ms) continue;
      ms = ev.micro_step;
      start = t.events[static_cast<std::size_t>(e)].start.v;
      marks.emplace_back(ms >= 0 ? fmt::format("ms{}", ms) : std::string("step"), start);
    }
    std::vector<Mark> shown;
    for (const auto& m : marks)
      if (m.second >= w.t0 && m.second <= w.t1) shown.push_back({m.first, x(m.second)});
    h += marks_svg(shown, T - 4, axis_y, T + 4, L + pw);
  }
  for (std::size_t li = 0; li < lanes.size(); ++li) {
    const Lane& ln = lanes[li];
    const double y = T + static_cast<double>(li) * (laneH + gap) + 6;
    h += text(L - 8, y + laneH / 2 + 4, ln.name, "class=\"lbl\" text-anchor=\"end\"");
    h += rect(L, y, pw, laneH, "#F4F4F4", "");
    // Runs of bins with the same dominant class.
    std::size_t i = 0;
    while (i < bins) {
      auto dominant = [&](std::size_t b) {
        int best = -1;
        double most = 0;
        for (int k = 0; k < kClasses; ++k)
          if (ln.busy[b][static_cast<std::size_t>(k)] > most) {
            most = ln.busy[b][static_cast<std::size_t>(k)];
            best = k;
          }
        return best;
      };
      // How full a bin is, in quarters (a slice is drawn that high: sparse work stays low).
      auto level = [&](std::size_t b) {
        double sum = 0;
        for (double v : ln.busy[b]) sum += v;
        return std::clamp(static_cast<int>(std::ceil(4.0 * sum / dt - 1e-9)), 1, 4);
      };
      const int k = dominant(i);
      if (k < 0) {
        ++i;
        continue;
      }
      const int lv = level(i);
      std::size_t j = i;
      std::array<double, kClasses> sum{};
      zero::EventId first = -1, last = -1;
      std::int64_t starts = 0;
      while (j < bins && dominant(j) == k && level(j) == lv) {
        for (int q = 0; q < kClasses; ++q) sum[static_cast<std::size_t>(q)] += ln.busy[j][static_cast<std::size_t>(q)];
        if (first < 0 || (ln.first[j] >= 0 && ln.first[j] < first)) first = ln.first[j];
        last = std::max(last, ln.last[j]);
        starts += ln.starts[j];
        ++j;
      }
      const double s0 = w.t0 + dt * static_cast<double>(i), s1 = w.t0 + dt * static_cast<double>(j);
      double total = 0;
      std::string parts;
      for (int q = 0; q < kClasses; ++q)
        if (sum[static_cast<std::size_t>(q)] > 0) {
          total += sum[static_cast<std::size_t>(q)];
          parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", class_label(q), time_text(sum[static_cast<std::size_t>(q)], u));
        }
      std::string what = first == last ? p.event_name(first)
                                       : fmt::format("{} … {}", p.event_name(first), p.event_name(last));
      const std::string title =
          fmt::format("{}: {}{} from {} to {}; busy {} of {} ({}); {}", ln.name, ln.hatched ? "exposed " : "", class_label(k),
                      time_text(s0, u), time_text(s1, u), time_text(total, u), time_text(s1 - s0, u), parts, what);
      const double x0 = x(s0), x1 = x(s1);
      const double hh = laneH * lv / 4.0, yy = y + laneH - hh;
      if (ln.hatched) {
        h += rect(x0, yy, x1 - x0, hh, class_colour(k), "");
        h += rect(x0, yy, x1 - x0, hh, "url(#zp-hatch)", title);
      } else {
        h += rect(x0, yy, x1 - x0, hh, class_colour(k), title);
      }
      ++out.slices;
      i = j;
    }
  }
  h += "</svg>\n";
  return out;
}

double step_end(const Column& c) {
  double end = 0;
  for (zero::EventId e = c.program->step_begin; e < static_cast<zero::EventId>(c.program->events.size()); ++e)
    end = std::max(end, c.time->events[static_cast<std::size_t>(e)].end.v);
  return end;
}

// The last micro-step and the optimizer step: [start of the last micro-step, end].
Window tail_window(const Column& c) {
  const auto& p = *c.program;
  int last_ms = -1;
  for (const auto& e : p.events) last_ms = std::max(last_ms, static_cast<int>(e.micro_step));
  double t0 = step_end(c);
  for (zero::EventId e = p.step_begin; e < static_cast<zero::EventId>(p.events.size()); ++e)
    if (p.events[static_cast<std::size_t>(e)].micro_step == last_ms) t0 = std::min(t0, c.time->events[static_cast<std::size_t>(e)].start.v);
  return {t0, step_end(c)};
}

}  // namespace

Section step_timeline(const Report& r, const PageOptions& opt) {
  Section s{"step-timeline", "3. The step timeline: streams, collectives, exposed communication", "", 0, 0, false};
  std::string& h = s.html;
  std::vector<const Column*> cols;
  for (int idx : {r.a, r.b})
    if (idx >= 0 && static_cast<std::size_t>(idx) < r.columns.size() && r.columns[static_cast<std::size_t>(idx)].program &&
        r.columns[static_cast<std::size_t>(idx)].time)
      cols.push_back(&r.columns[static_cast<std::size_t>(idx)]);
  if (cols.empty()) {
    h = unavailable(fmt::format("The timeline needs the step program: {} has phase totals only (in the table of view "
                                "1's source). Run `zeroplan report` with the model, ds_config and cluster instead of --input.",
                                r.source_file.empty() ? std::string("this input") : r.source_file));
    return s;
  }
  std::array<bool, kClasses> present{};
  for (const Column* c : cols)
    for (zero::EventId e = c->program->step_begin; e < static_cast<zero::EventId>(c->program->events.size()); ++e) {
      const int k = class_of(c->program->events[static_cast<std::size_t>(e)]);
      if (k >= 0) present[static_cast<std::size_t>(k)] = true;
    }
  std::vector<LegendItem> legend;
  for (int k = 0; k < kClasses; ++k)
    if (present[static_cast<std::size_t>(k)]) legend.push_back({class_colour(k), class_label(k), ""});
  legend.push_back({"#FFFFFF", "exposed communication (the compute stream waits)", "zp-hatch"});
  h += legend_html(legend);
  double full = 0, tail = 0;
  std::vector<std::vector<sim::ExposedInterval>> exposed;
  for (const Column* c : cols) {
    full = std::max(full, step_end(*c));
    const Window tw = tail_window(*c);
    tail = std::max(tail, tw.t1 - tw.t0);
    exposed.push_back(sim::exposed_intervals(*c->program, *c->time));
    s.events += static_cast<std::int64_t>(c->program->events.size()) - c->program->step_begin;
  }
  const TimeUnit uf = unit_for(full), ut = unit_for(tail);
  for (std::size_t i = 0; i < cols.size(); ++i) {
    const auto pn = timeline_panel(*cols[i], {0.0, full > 0 ? full : 1e-9}, opt.timeline_bins, uf,
                                   fmt::format("{}: the whole step ({} micro-steps)", cols[i]->title,
                                               cols[i]->result.value("gradient_accumulation_steps", 0)),
                                   exposed[i]);
    h += pn.svg;
    s.slices += pn.slices;
  }
  for (std::size_t i = 0; i < cols.size(); ++i) {
    const Window tw = tail_window(*cols[i]);
    const auto pn = timeline_panel(*cols[i], {tw.t0, tw.t0 + (tail > 0 ? tail : 1e-9)}, opt.timeline_bins, ut,
                                   fmt::format("{}: the last micro-step and the optimizer step, enlarged", cols[i]->title),
                                   exposed[i]);
    h += pn.svg;
    s.slices += pn.slices;
  }
  s.aggregated = true;
  h += fmt::format(
      "<p class=\"note\">Each lane is a stream; panels of one kind share their time scale. <b>Aggregated</b>: a lane is cut "
      "into {} bins of equal time (the whole step: {} each), and each run of bins is coloured by the work that fills "
      "most of it and drawn as high as the bins are busy (in quarters); hover over a slice for what it holds. {} events are drawn as {} slices. The exposed-communication "
      "lane is when the compute stream waits for a collective (the simulator's exposed time, by kind).</p>\n",
      opt.timeline_bins, duration_text(full / static_cast<double>(opt.timeline_bins)),
      grouped(s.events), grouped(static_cast<std::int64_t>(s.slices)));

  // Phase times and collectives, as `--json` has them.
  h += "<table data-table=\"step-time\"><thead><tr><th>per optimizer step</th>";
  for (const Column* c : cols) h += "<th>" + esc(c->title) + "</th>";
  h += "</tr></thead><tbody>\n";
  const std::pair<const char*, const char*> rows[] = {
      {"forward_ms", "forward (ms)"},       {"backward_ms", "backward (ms)"},
      {"backward_allreduce_ms", "of which exposed communication (ms)"}, {"step_ms", "optimizer step (ms)"},
      {"synchronised_iteration_ms", "phases' sum, the timeline drawn (ms)"},
      {"iteration_ms", "iteration, without a synchronisation between the phases (ms)"},
      {"samples_per_s", "samples/s"}, {"mfu", "MFU"}};
  for (const auto& [key, label] : rows) {
    // Results written before the phases and the iteration were told apart have no phases' sum.
    if (std::none_of(cols.begin(), cols.end(), [&](const Column* c) { return c->result["time"].contains(key); })) continue;
    h += fmt::format("<tr data-row=\"{}\"><th>{}</th>", key, label);
    for (const Column* c : cols) {
      const double v = c->result["time"].value(key, 0.0);
      h += num_cell(v, std::string(key) == "mfu" ? fmt::format("{:.1f}%", 100 * v) : fmt::format("{:.1f}", v));
    }
    h += "</tr>\n";
  }
  h += "</tbody></table>\n";
  h += "<table data-table=\"collectives\"><thead><tr><th>collectives per step</th><th>kind</th><th>calls</th>"
       "<th>bytes sent per rank</th><th>time (ms)</th><th>exposed (ms)</th><th>exposed, drawn (ms)</th></tr></thead><tbody>\n";
  for (std::size_t i = 0; i < cols.size(); ++i) {
    const auto& kinds = cols[i]->result["comm"]["by_kind"];
    for (auto it = kinds.begin(); it != kinds.end(); ++it) {
      double drawn = 0;
      for (const auto& x : exposed[i])
        if (it.key() == zero::coll_kind_name(x.kind)) drawn += (x.end - x.start).ms();
      h += fmt::format("<tr data-row=\"{}:{}\"><th>{}</th><td>{}</td>", i, esc(it.key()), esc(cols[i]->title), esc(it.key()));
      h += num_cell(it.value().value("count", std::int64_t{0}), fmt::format("{}", it.value().value("count", std::int64_t{0})));
      h += num_cell(it.value().value("bytes", std::int64_t{0}), bytes_text(it.value().value("bytes", std::int64_t{0})));
      h += num_cell(it.value().value("time_ms", 0.0), fmt::format("{:.2f}", it.value().value("time_ms", 0.0)));
      h += num_cell(it.value().value("exposed_ms", 0.0), fmt::format("{:.2f}", it.value().value("exposed_ms", 0.0)));
      h += num_cell(drawn, fmt::format("{:.2f}", drawn));
      h += "</tr>\n";
    }
  }
  h += "</tbody></table>\n";
  return s;
}

}  // namespace zp::report::detail
