// Views 1 (memory per stage at the peak) and 2 (memory over the step).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "report/html.hpp"
#include "report/views.hpp"
#include "sim/series.hpp"

namespace zp::report::detail {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Text drawn on a fill: white on the dark colours, black on the light ones.
const char* ink_on(const std::string& fill) {
  for (const char* dark : {colour::blue, colour::green, colour::vermillion, colour::purple, "#555555"})
    if (fill == dark) return "#FFFFFF";
  return "#000000";
}

std::int64_t bytes_of(const nlohmann::json& v) { return v.is_number() ? v.get<std::int64_t>() : 0; }

// The segments of one bar, bottom to top: the categories at the peak, the reserved bytes
// the caching allocator holds beyond them, the device context.
struct Segment {
  std::string key, label, fill, pattern;
  std::int64_t bytes = 0;
};
std::vector<Segment> segments(const nlohmann::json& mem) {
  std::vector<Segment> out;
  for (int c = 0; c < zero::kNumCategories; ++c) {
    const char* name = zero::category_name(static_cast<zero::Category>(c));
    out.push_back({name, category_label(c), category_colour(c), "", bytes_of(mem["by_category"][name])});
  }
  const std::int64_t peak = bytes_of(mem["peak_allocated_bytes"]);
  const std::int64_t reserved = bytes_of(mem["reserved_bytes"]);
  out.push_back({"cached", "reserved, not allocated (allocator cache)", "#DDDDDD", "zp-hatch", std::max<std::int64_t>(0, reserved - peak)});
  out.push_back({"context", "device context (CUDA, libraries)", "#555555", "", bytes_of(mem["context_bytes"])});
  return out;
}

std::string y_axis(double left, double top, double width, double height, const std::vector<double>& ticks, double ymax,
                   const std::string& unit_label) {
  std::string s;
  for (double t : ticks) {
    const double y = top + height * (1 - t / ymax);
    s += line(left, y, left + width, y, "class=\"grid\"");
    s += text(left - 6, y + 4, tick_text(t), "class=\"tick\" text-anchor=\"end\"");
  }
  s += line(left, top, left, top + height, "class=\"ax\"");
  s += line(left, top + height, left + width, top + height, "class=\"ax\"");
  s += fmt::format("<text class=\"axl\" transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
                   px(left - 42), px(top + height / 2), esc(unit_label));
  return s;
}

}  // namespace

const char* category_colour(int c) {
  static constexpr std::array<const char*, zero::kNumCategories> fills = {
      colour::blue, colour::orange, colour::sky_blue, colour::green, colour::purple, colour::yellow, colour::vermillion};
  return fills[static_cast<std::size_t>(c)];
}

const char* category_label(int c) { return zero::category_name(static_cast<zero::Category>(c)); }

std::string unavailable(const std::string& why) { return "<p class=\"note missing\">" + esc(why) + "</p>\n"; }

std::string svg_open(double w, double h, const std::string& label) {
  return fmt::format("<svg viewBox=\"0 0 {} {}\" width=\"{}\" role=\"img\" aria-label=\"{}\" "
                     "xmlns=\"http://www.w3.org/2000/svg\">",
                     px(w), px(h), px(w), esc(label));
}

Section memory_per_stage(const Report& r) {
  Section s{"memory-per-stage", "1. Device memory per configuration, at the peak", "", 0, 0, false};
  std::string& h = s.html;
  if (r.columns.empty()) {
    h = unavailable("No per-category memory in this input.");
    return s;
  }
  const double W = 860, H = 410, L = 70, R = 170, T = 30, B = 72;
  const double pw = W - L - R, ph = H - T - B;
  double top = static_cast<double>(r.device.memory.v);
  for (const auto& c : r.columns) top = std::max(top, static_cast<double>(bytes_of(c.result["memory"]["device_used_bytes"])));
  const auto ticks = nice_ticks(top * 1.05 / kGiB, 6);
  const double ymax = std::max(top * 1.05, ticks.back() * kGiB);
  auto y = [&](double b) { return T + ph * (1 - b / ymax); };

  std::vector<LegendItem> legend;
  for (const auto& sg : segments(r.columns.front().result["memory"]))
    legend.push_back({sg.fill, sg.label, sg.pattern});
  h += legend_html(legend);
  h += svg_open(W, H, "device memory per configuration, stacked by category, in GiB");
  h += y_axis(L, T, pw, ph, ticks, ymax / kGiB, "device memory (GiB)");
  const double slot = pw / static_cast<double>(r.columns.size());
  const double bw = std::min(96.0, slot * 0.55);
  for (std::size_t i = 0; i < r.columns.size(); ++i) {
    const Column& c = r.columns[i];
    const auto& mem = c.result["memory"];
    const double x = L + slot * (static_cast<double>(i) + 0.5) - bw / 2;
    double cum = 0;
    for (const auto& sg : segments(mem)) {
      if (sg.bytes <= 0) continue;
      const double y0 = y(cum), y1 = y(cum + static_cast<double>(sg.bytes));
      const std::string title = fmt::format("{}: {}: {} ({} B)", c.title, sg.label, bytes_text(sg.bytes), grouped(sg.bytes));
      h += rect(x, y1, bw, y0 - y1, sg.fill, sg.pattern.empty() ? title : "", "stroke=\"#FFFFFF\" stroke-width=\"0.5\"");
      if (!sg.pattern.empty()) h += rect(x, y1, bw, y0 - y1, fmt::format("url(#{})", sg.pattern), title);
      if (y0 - y1 >= 15)
        h += text(x + bw / 2, (y0 + y1) / 2 + 4, fmt::format("{:.2f}", static_cast<double>(sg.bytes) / kGiB),
                  fmt::format("class=\"seg\" text-anchor=\"middle\" fill=\"{}\"", ink_on(sg.fill)));
      cum += static_cast<double>(sg.bytes);
    }
    const std::int64_t used = bytes_of(mem["device_used_bytes"]);
    h += text(x + bw / 2, y(static_cast<double>(used)) - 6, bytes_text(used), "class=\"lbl\" text-anchor=\"middle\"");
    h += text(x + bw / 2, T + ph + 18, c.title, "class=\"lbl b\" text-anchor=\"middle\"");
    const bool fits = mem["fits"].is_boolean() && mem["fits"].get<bool>();
    h += text(x + bw / 2, T + ph + 34, fits ? "fits" : "does NOT fit", std::string("class=\"lbl\" text-anchor=\"middle\"") + (fits ? "" : " fill=\"#D55E00\""));
    h += text(x + bw / 2, T + ph + 49,
              fmt::format("micro {} × GAS {}", c.result.value("micro_batch", 0), c.result.value("gradient_accumulation_steps", 0)),
              "class=\"small\" text-anchor=\"middle\"");
    if (!c.note.empty()) h += text(x + bw / 2, T + ph + 63, c.note, "class=\"small b\" text-anchor=\"middle\"");
  }
  // The limits, labelled in the right margin.
  auto limit = [&](Bytes b, const std::string& label, const char* dash) {
    const double yl = y(static_cast<double>(b.v));
    h += line(L, yl, L + pw, yl, fmt::format("class=\"limit\" stroke-dasharray=\"{}\"", dash));
    h += text(L + pw + 6, yl + 4, label, "class=\"lbl\"");
  };
  if (r.device.memory.v > 0)
    limit(r.device.memory, fmt::format("{}: {}", r.device.name, bytes_text(r.device.memory.v)), "6,3");
  if (r.device.limit.v > 0 && r.device.limit != r.device.memory)
    limit(r.device.limit, fmt::format("plan limit: {}", bytes_text(r.device.limit.v)), "2,2");
  h += "</svg>\n";

  // The numbers, exactly as `--json` has them.
  h += "<table data-table=\"memory-per-stage\"><thead><tr><th>bytes at the peak</th>";
  for (const auto& c : r.columns) h += "<th>" + esc(c.title) + "</th>";
  h += "</tr></thead><tbody>\n";
  auto row = [&](const std::string& key, const std::string& label, auto get) {
    h += fmt::format("<tr data-row=\"{}\"><th>{}</th>", esc(key), esc(label));
    for (const auto& c : r.columns) {
      const std::int64_t v = get(c.result["memory"]);
      h += num_cell(v, bytes_text(v));
    }
    h += "</tr>\n";
  };
  for (int c = 0; c < zero::kNumCategories; ++c) {
    const char* name = zero::category_name(static_cast<zero::Category>(c));
    row(name, name, [&](const nlohmann::json& m) { return bytes_of(m["by_category"][name]); });
  }
  row("peak_allocated_bytes", "peak allocated", [](const nlohmann::json& m) { return bytes_of(m["peak_allocated_bytes"]); });
  row("reserved_bytes", "reserved (caching allocator)", [](const nlohmann::json& m) { return bytes_of(m["reserved_bytes"]); });
  row("context_bytes", "context", [](const nlohmann::json& m) { return bytes_of(m["context_bytes"]); });
  row("device_used_bytes", "device used = reserved + context",
      [](const nlohmann::json& m) { return bytes_of(m["device_used_bytes"]); });
  row("host_bytes", "host (offload)", [](const nlohmann::json& m) { return bytes_of(m["host_bytes"]); });
  h += "<tr data-row=\"peak_event\"><th>peak event</th>";
  for (const auto& c : r.columns) h += "<td class=\"ev\">" + esc(c.result["memory"].value("peak_event", "")) + "</td>";
  h += "</tr>\n</tbody></table>\n";
  h += fmt::format("<p class=\"note\">Bars stack the bytes live at each configuration's peak by category, then what the "
                   "caching allocator reserves beyond them and the device context; their top is the predicted device "
                   "usage. {}Sizes in GiB = 2<sup>30</sup> bytes; exact bytes in the table.</p>\n",
                   r.device.memory.v > 0 ? "The dashed line is the device's memory. " : "");
  return s;
}

namespace {

// The most device bytes live within each micro-step (and the step after them), exactly.
struct RangePeak {
  int micro_step = -1;                 // -1: the optimizer step after the micro-steps
  std::int64_t bytes = -1;
  zero::EventId at = -1;
  zero::EventId begin = -1;            // its first event
};
std::vector<RangePeak> range_peaks(const zero::Program& p) {
  std::vector<RangePeak> out;
  std::int64_t live = 0;
  for (const auto& e : p.events) {
    for (auto b : p.allocs(e))
      if (p.buffers[static_cast<std::size_t>(b)].placement == zero::Placement::device) live += p.buffers[static_cast<std::size_t>(b)].bytes.v;
    if (e.id >= p.step_begin) {
      if (out.empty() || out.back().micro_step != e.micro_step) out.push_back({e.micro_step, -1, -1, e.id});
      if (live > out.back().bytes) {
        out.back().bytes = live;
        out.back().at = e.id;
      }
    }
    for (auto b : p.frees(e))
      if (p.buffers[static_cast<std::size_t>(b)].placement == zero::Placement::device) live -= p.buffers[static_cast<std::size_t>(b)].bytes.v;
  }
  return out;
}

std::string range_name(const RangePeak& rp) { return rp.micro_step >= 0 ? fmt::format("ms{}", rp.micro_step) : "step"; }

struct Panel {
  const Column* column = nullptr;
  sim::MemorySeries series;
  std::vector<RangePeak> ranges;
};

std::string memory_panel(const Panel& pn, double ymax, const std::vector<double>& ticks) {
  const zero::Program& p = *pn.column->program;
  const sim::MemorySeries& ms = pn.series;
  const double W = 560, H = 330, L = 66, R = 12, T = 30, B = 48;
  const double pw = W - L - R, ph = H - T - B;
  const zero::EventId first = p.step_begin;
  const double E = static_cast<double>(std::max<std::int64_t>(1, ms.step_events));
  auto x = [&](double e) { return L + pw * (e - first) / E; };
  auto y = [&](double b) { return T + ph * (1 - b / ymax); };
  std::string h = "<figure class=\"panel\">";
  h += svg_open(W, H, fmt::format("{}: allocated device memory by category over the step's events, GiB", pn.column->title));
  h += y_axis(L, T, pw, ph, ticks, ymax / kGiB, "allocated (GiB)");
  // Stacked areas: each sample a step of the height its summary event has.
  std::vector<double> below(ms.samples.size(), 0.0);
  for (int c = 0; c < zero::kNumCategories; ++c) {
    bool any = false;
    for (const auto& sm : ms.samples) any = any || sm.bytes[static_cast<std::size_t>(c)].v > 0;
    if (!any) continue;
    std::string top, bottom;
    for (std::size_t i = 0; i < ms.samples.size(); ++i) {
      const auto& sm = ms.samples[i];
      const double v = below[i] + static_cast<double>(sm.bytes[static_cast<std::size_t>(c)].v);
      top += fmt::format("{},{} {},{} ", px(x(sm.first)), px(y(v)), px(x(sm.last + 1)), px(y(v)));
      below[i] = v;
    }
    // The bottom edge is the top of the category below, walked back.
    for (std::size_t i = ms.samples.size(); i-- > 0;) {
      const auto& sm = ms.samples[i];
      const double v = below[i] - static_cast<double>(sm.bytes[static_cast<std::size_t>(c)].v);
      bottom += fmt::format("{},{} {},{} ", px(x(sm.last + 1)), px(y(v)), px(x(sm.first)), px(y(v)));
    }
    h += fmt::format("<polygon points=\"{}{}\" fill=\"{}\"><title>{}</title></polygon>", top, bottom, category_colour(c),
                     esc(category_label(c)));
  }
  // Micro-steps: a line where each begins, and where the optimizer step begins.
  std::vector<Mark> marks;
  for (const auto& rp : pn.ranges) marks.push_back({range_name(rp), x(rp.begin)});
  h += marks_svg(marks, T, T + ph, T - 6, L + pw);
  // The peak, labelled with its event.
  if (!ms.samples.empty()) {
    const auto& pk = ms.samples[ms.peak_sample];
    const double px_ = x(pk.at + 0.5), py = y(static_cast<double>(pk.total.v));
    h += fmt::format("<path d=\"M{},{} l-5,-8 h10 z\" fill=\"#000\"/>", px(px_), px(py));
    const bool right = px_ > L + pw / 2;
    h += text(px_ + (right ? -7 : 7), py - 9,
              fmt::format("peak {} at {}", bytes_text(pk.total.v), p.event_name(pk.at)),
              fmt::format("class=\"lbl b halo\" text-anchor=\"{}\"", right ? "end" : "start"));
  }
  // Hover strips: what the most loaded event of each strip holds.
  const std::size_t strips = std::min<std::size_t>(ms.samples.size(), 90);
  for (std::size_t k = 0; k < strips; ++k) {
    const std::size_t lo = k * ms.samples.size() / strips, hi = (k + 1) * ms.samples.size() / strips;
    std::size_t best = lo;
    for (std::size_t i = lo; i < hi; ++i)
      if (ms.samples[i].total > ms.samples[best].total) best = i;
    const auto& sm = ms.samples[best];
    std::string cats;
    for (int c = 0; c < zero::kNumCategories; ++c)
      if (sm.bytes[static_cast<std::size_t>(c)].v > 0)
        cats += fmt::format("\n  {} {}", category_label(c), bytes_text(sm.bytes[static_cast<std::size_t>(c)].v));
    const double x0 = x(ms.samples[lo].first), x1 = x(ms.samples[hi - 1].last + 1);
    h += rect(x0, T, x1 - x0, ph, "#000",
              fmt::format("{}: events {}–{}; most at {}: {}{}", pn.column->title, ms.samples[lo].first - first,
                          ms.samples[hi - 1].last - first, p.event_name(sm.at), bytes_text(sm.total.v), cats),
              "fill-opacity=\"0\"");
  }
  h += text(L + pw / 2, H - 10,
            fmt::format("{} events of the step, in issue order", grouped(ms.step_events)), "class=\"axl\" text-anchor=\"middle\"");
  h += text(L, 14, pn.column->title, "class=\"lbl b\"");
  h += "</svg></figure>\n";
  return h;
}

}  // namespace

Section memory_over_step(const Report& r, const PageOptions& opt) {
  Section s{"memory-over-step", "2. Memory over one optimizer step", "", 0, 0, false};
  std::string& h = s.html;
  std::vector<Panel> panels;
  for (int idx : {r.a, r.b}) {
    if (idx < 0 || static_cast<std::size_t>(idx) >= r.columns.size()) continue;
    const Column& c = r.columns[static_cast<std::size_t>(idx)];
    if (!c.program) continue;
    panels.push_back({&c, sim::memory_series(*c.program, opt.memory_samples), range_peaks(*c.program)});
  }
  if (panels.empty()) {
    h = unavailable(fmt::format("Memory over the step needs the step program: {} has the peak figures only. Run "
                                "`zeroplan report` with the model, ds_config and cluster instead of --input.",
                                r.source_file.empty() ? std::string("this input") : r.source_file));
    return s;
  }
  // One scale for both, unless their peaks differ so much that the smaller would be flat.
  std::vector<double> tops;
  for (const auto& pn : panels)
    tops.push_back(pn.series.samples.empty() ? 1.0 : static_cast<double>(pn.series.samples[pn.series.peak_sample].total.v));
  const double hi = *std::max_element(tops.begin(), tops.end()), lo = *std::min_element(tops.begin(), tops.end());
  const bool shared = hi <= 3 * std::max(lo, 1.0);
  auto scale_of = [&](double top) {
    const auto ticks = nice_ticks(std::max(1.0, top * 1.08) / kGiB, 6);
    return std::pair{std::max(top * 1.08, ticks.back() * kGiB), ticks};
  };
  std::vector<LegendItem> legend;
  for (int c = 0; c < zero::kNumCategories; ++c) legend.push_back({category_colour(c), category_label(c), ""});
  h += legend_html(legend);
  h += "<div class=\"pair\">\n";
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const auto& pn = panels[i];
    const auto [ymax, ticks] = scale_of(shared ? hi : tops[i]);
    h += memory_panel(pn, ymax, ticks);
    s.events += pn.series.step_events;
    s.aggregated = s.aggregated || pn.series.aggregated;
  }
  h += "</div>\n";
  std::string how;
  for (const auto& pn : panels)
    how += fmt::format("{}{}: {} events", how.empty() ? "" : "; ", pn.column->title, grouped(pn.series.step_events));
  if (s.aggregated)
    how += fmt::format(". <b>Aggregated</b>: each panel draws at most {} samples, each a run of consecutive events "
                       "shown at the height of its most loaded event, so every peak is kept and the highest sample is "
                       "the exact peak",
                       opt.memory_samples);
  h += fmt::format("<p class=\"note\">Device bytes allocated by category at the start of each event (after its "
                   "allocations, where the peak is measured), against the events in the order the host issues them; "
                   "{}. Dotted lines mark where each micro-step (ms<i>k</i>) and the optimizer "
                   "step begin. {}.</p>\n",
                   shared ? "both panels on one scale"
                          : "<b>each panel on its own scale</b> (their peaks differ by more than 3×)",
                   how);

  // The most loaded event of each micro-step, exactly.
  h += "<table data-table=\"memory-over-step\"><thead><tr><th>range</th>";
  for (const auto& pn : panels) h += fmt::format("<th>{} most allocated</th><th>at event</th>", esc(pn.column->title));
  h += "</tr></thead><tbody>\n";
  std::size_t rows = 0;
  for (const auto& pn : panels) rows = std::max(rows, pn.ranges.size());
  // A row per micro-step; consecutive micro-steps alike in every panel (the same bytes at
  // the same event of their own micro-step) share one.
  auto same_as_next = [&](std::size_t k) {
    for (const auto& pn : panels) {
      if (k + 1 >= pn.ranges.size()) return false;
      const auto& a = pn.ranges[k];
      const auto& b = pn.ranges[k + 1];
      if (a.micro_step < 0 || b.micro_step < 0 || a.bytes != b.bytes) return false;
      const std::string na = pn.column->program->event_name(a.at), nb = pn.column->program->event_name(b.at);
      if (na.substr(na.find('/')) != nb.substr(nb.find('/'))) return false;
    }
    return true;
  };
  for (std::size_t k = 0; k < rows;) {
    std::size_t last = k;
    while (same_as_next(last)) ++last;
    std::string name = k < panels.front().ranges.size() ? range_name(panels.front().ranges[k]) : "";
    if (last > k) name = fmt::format("{}-{}", name, range_name(panels.front().ranges[last]));
    h += fmt::format("<tr data-row=\"{}\"><th>{}</th>", esc(name),
                     last > k ? fmt::format("{} ({} micro-steps alike)", esc(name), last - k + 1) : esc(name));
    for (const auto& pn : panels) {
      if (k >= pn.ranges.size()) {
        h += "<td></td><td></td>";
        continue;
      }
      const auto& rp = pn.ranges[k];
      const bool peak = !pn.series.samples.empty() && rp.at == pn.series.samples[pn.series.peak_sample].at;
      h += num_cell(rp.bytes, bytes_text(rp.bytes) + (peak ? " (peak)" : ""));
      h += "<td class=\"ev\">" + esc(pn.column->program->event_name(rp.at)) + "</td>";
    }
    h += "</tr>\n";
    k = last + 1;
  }
  h += "<tr data-row=\"peak\"><th>peak</th>";
  for (const auto& pn : panels) {
    const auto& pk = pn.series.samples[pn.series.peak_sample];
    h += num_cell(pk.total.v, bytes_text(pk.total.v));
    h += "<td class=\"ev\">" + esc(pn.column->program->event_name(pk.at)) + "</td>";
  }
  h += "</tr>\n</tbody></table>\n";
  return s;
}

}  // namespace zp::report::detail
