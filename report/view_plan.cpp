// View 4: the planner's candidates, throughput against device memory, the limit, the
// winner and its ds_config.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "report/html.hpp"
#include "report/views.hpp"

namespace zp::report::detail {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const char* stage_colour(int stage) {
  static constexpr const char* c[] = {colour::orange, colour::blue, colour::green, colour::purple};
  return c[std::clamp(stage, 0, 3)];
}
const char* stage_shape(int stage) {
  static constexpr const char* s[] = {"circle", "square", "triangle", "diamond"};
  return s[std::clamp(stage, 0, 3)];
}

// A marker of `stage`'s shape centred on (x, y): filled when it fits, hollow otherwise.
std::string marker(int stage, double x, double y, double r, bool filled, const std::string& title) {
  const std::string fill = filled ? stage_colour(stage) : "#FFFFFF";
  const std::string stroke = fmt::format("stroke=\"{}\" stroke-width=\"1.6\"", stage_colour(stage));
  const std::string t = title.empty() ? "" : "<title>" + esc(title) + "</title>";
  switch (std::clamp(stage, 0, 3)) {
    case 0:
      return fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{}\" {}>{}</circle>", px(x), px(y), px(r), fill, stroke, t);
    case 1:
      return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" {}>{}</rect>", px(x - r), px(y - r),
                         px(2 * r), px(2 * r), fill, stroke, t);
    case 2:
      return fmt::format("<path d=\"M{},{} L{},{} L{},{} Z\" fill=\"{}\" {}>{}</path>", px(x), px(y - 1.2 * r), px(x + 1.1 * r),
                         px(y + 0.8 * r), px(x - 1.1 * r), px(y + 0.8 * r), fill, stroke, t);
    default:
      return fmt::format("<path d=\"M{},{} L{},{} L{},{} L{},{} Z\" fill=\"{}\" {}>{}</path>", px(x), px(y - 1.3 * r),
                         px(x + 1.3 * r), px(y), px(x), px(y + 1.3 * r), px(x - 1.3 * r), px(y), fill, stroke, t);
  }
}

// The knobs a candidate sets; with `ref`, only those that differ from it.
std::string knobs_text(const nlohmann::json& knobs, const nlohmann::json* ref = nullptr) {
  std::string s;
  for (auto it = knobs.begin(); it != knobs.end(); ++it) {
    if (it.key() == "stage" || it.key() == "micro_batch") continue;
    if (ref && ref->contains(it.key()) && (*ref)[it.key()] == it.value()) continue;
    std::string v = it.value().dump();
    if (it.value().is_number_integer() && it.value().get<std::int64_t>() >= 100000)
      v = fmt::format("{:g}", it.value().get<double>());
    s += fmt::format("{}{}={}", s.empty() ? "" : " ", it.key(), v);
  }
  return s;
}

std::string percent_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += static_cast<char>(c);
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

}  // namespace

Section plan_candidates(const Report& r) {
  Section s{"plan-candidates", "4. The plan: ranked candidates and the winner", "", 0, 0, false};
  std::string& h = s.html;
  const auto& plan = r.plan->plan;
  static const nlohmann::json kNone;
  const auto& ranked = plan.contains("ranked") ? plan["ranked"] : kNone;
  if (!ranked.is_array() || ranked.empty()) {
    h = unavailable("The plan has no candidates.");
    return s;
  }
  const bool nothing_fits = plan.value("nothing_fits", false);
  const std::int64_t limit = ranked[0]["memory"].value("device_limit_bytes", std::int64_t{0});
  // x: up to 1.6 × the limit (or the fitting candidates); candidates beyond are drawn at the
  // edge. y: around the candidates' throughputs (a scatter needs no zero).
  double fit_max = 0, ylo = std::numeric_limits<double>::infinity(), yhi = 0;
  auto see = [&](double used, double sps, bool fits) {
    if (fits) fit_max = std::max(fit_max, used);
    ylo = std::min(ylo, sps);
    yhi = std::max(yhi, sps);
  };
  for (const auto& e : ranked)
    see(e["memory"].value("device_used_bytes", 0.0), e["time"].value("samples_per_s", 0.0), e.value("fits", false));
  for (const auto& pt : r.plan->simulated) see(static_cast<double>(pt.device_used.v), pt.samples_per_s, pt.fits);
  const double xcap = std::max({1.6 * static_cast<double>(limit), 1.1 * fit_max, 1.0});
  const auto xt = nice_ticks(xcap / kGiB, 8);
  const double xm = std::max(xcap, xt.back() * kGiB);
  if (!(yhi > 0)) yhi = 1;
  if (!std::isfinite(ylo)) ylo = 0;
  const auto ystep_ticks = nice_ticks(std::max(yhi - ylo, yhi * 0.05), 6);
  const double ystep = ystep_ticks.size() > 1 ? ystep_ticks[1] : yhi;
  const double y0 = std::max(0.0, std::floor(ylo * 0.98 / ystep) * ystep);
  const double y1 = std::ceil(yhi * 1.02 / ystep) * ystep;
  std::vector<double> yt;
  for (double v = y0; v <= y1 * (1 + 1e-9); v += ystep) yt.push_back(v);
  std::size_t beyond = 0;
  const double W = 860, H = 440, L = 76, R = 24, T = 24, B = 52;
  const double pw = W - L - R, ph = H - T - B;
  auto x = [&](double b) { return L + pw * std::min(b, xm) / xm; };
  auto y = [&](double v) { return T + ph * (1 - (v - y0) / (y1 - y0)); };

  std::vector<LegendItem> legend;
  for (int st = 0; st < 4; ++st)
    legend.push_back({stage_colour(st), fmt::format("stage {} ({}; hollow: does not fit)", st, stage_shape(st)), ""});
  if (!r.plan->simulated.empty()) legend.push_back({"#BBBBBB", "other simulated candidates", ""});
  h += legend_html(legend);
  h += svg_open(W, H, "plan candidates: samples per second against device memory used, GiB");
  for (double t : xt) {
    h += line(x(t * kGiB), T, x(t * kGiB), T + ph, "class=\"grid\"");
    h += text(x(t * kGiB), T + ph + 16, tick_text(t), "class=\"tick\" text-anchor=\"middle\"");
  }
  for (double t : yt) {
    h += line(L, y(t), L + pw, y(t), "class=\"grid\"");
    h += text(L - 6, y(t) + 4, tick_text(t), "class=\"tick\" text-anchor=\"end\"");
  }
  h += line(L, T, L, T + ph, "class=\"ax\"") + line(L, T + ph, L + pw, T + ph, "class=\"ax\"");
  h += text(L + pw / 2, H - 8, "predicted device memory used, reserved + context (GiB)", "class=\"axl\" text-anchor=\"middle\"");
  h += fmt::format("<text class=\"axl\" transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">throughput "
                   "(samples/s, global)</text>",
                   px(L - 50), px(T + ph / 2));
  for (const auto& pt : r.plan->simulated)
    h += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2\" fill=\"#BBBBBB\"/>", px(x(static_cast<double>(pt.device_used.v))),
                     px(y(pt.samples_per_s)));
  if (limit > 0) {
    h += line(x(static_cast<double>(limit)), T, x(static_cast<double>(limit)), T + ph, "class=\"limit\" stroke-dasharray=\"6,3\"");
    h += text(x(static_cast<double>(limit)) + 4, T + 12,
              fmt::format("limit {} ({:.0f}% of {})", bytes_text(limit), 100 * plan.value("memory_headroom", 1.0),
                          bytes_text(r.device.memory.v)),
              "class=\"lbl\"");
  }
  // Worst first, so the best are drawn on top.
  for (std::size_t i = ranked.size(); i-- > 0;) {
    const auto& e = ranked[i];
    const int st = e.value("stage", 0);
    const double used = e["memory"].value("device_used_bytes", 0.0), sps = e["time"].value("samples_per_s", 0.0);
    const bool fits = e.value("fits", false);
    if (used > xm) ++beyond;
    h += marker(st, x(used), y(sps), 5, fits,
                fmt::format("#{}: stage {}, micro-batch {} × GAS {}; {} used; {:.1f} samples/s; {}{}", i + 1, st,
                            e.value("micro_batch", 0), e.value("gradient_accumulation_steps", 0),
                            bytes_text(static_cast<std::int64_t>(used)), sps, fits ? "fits" : "does not fit",
                            e["knobs"].is_object() ? "; " + knobs_text(e["knobs"]) : ""));
  }
  const bool has_best = plan.contains("best") && plan["best"].is_object();
  if (!nothing_fits && has_best) {
    const auto& w = plan["best"];
    const double wx = x(w["memory"].value("device_used_bytes", 0.0)), wy = y(w["time"].value("samples_per_s", 0.0));
    h += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"11\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>", px(wx), px(wy));
    const bool left = wx + 14 + 7.0 * 52 > L + pw;
    h += text(left ? wx - 14 : wx + 14, wy + 4,
              fmt::format("winner: stage {}, micro-batch {}, {:.1f} samples/s", w.value("stage", 0), w.value("micro_batch", 0),
                          w["time"].value("samples_per_s", 0.0)),
              left ? "class=\"lbl b halo\" text-anchor=\"end\"" : "class=\"lbl b halo\"");
  }
  if (beyond > 0)
    h += text(L + pw - 4, T + ph - 8, fmt::format("{} candidates beyond {} drawn at the edge", beyond, bytes_text(static_cast<std::int64_t>(xm))),
              "class=\"small\" text-anchor=\"end\"");
  h += "</svg>\n";

  h += "<table data-table=\"plan-ranked\"><thead><tr><th>#</th><th>stage</th><th>micro</th><th>GAS</th><th>knobs (rows after the first: where they differ from it)</th>"
       "<th>device used</th><th>samples/s</th><th>MFU</th><th>iteration (ms)</th><th>fits</th></tr></thead><tbody>\n";
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    const auto& e = ranked[i];
    h += fmt::format("<tr data-row=\"{}\"><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td class=\"ev\">{}</td>", i, i + 1,
                     e.value("stage", 0), e.value("micro_batch", 0), e.value("gradient_accumulation_steps", 0),
                     esc(!e["knobs"].is_object() ? std::string()
                         : i == 0 || !has_best     ? knobs_text(e["knobs"])
                         : knobs_text(e["knobs"], &plan["best"]["knobs"]).empty()
                             ? std::string("as the winner")
                             : knobs_text(e["knobs"], &plan["best"]["knobs"])));
    const auto used = e["memory"].value("device_used_bytes", std::int64_t{0});
    h += num_cell(used, bytes_text(used));
    h += num_cell(e["time"].value("samples_per_s", 0.0), fmt::format("{:.1f}", e["time"].value("samples_per_s", 0.0)));
    h += num_cell(e["time"].value("mfu", 0.0), fmt::format("{:.1f}%", 100 * e["time"].value("mfu", 0.0)));
    h += num_cell(e["time"].value("iteration_ms", 0.0), fmt::format("{:.1f}", e["time"].value("iteration_ms", 0.0)));
    h += fmt::format("<td>{}</td></tr>\n", e.value("fits", false) ? "yes" : "no");
  }
  h += "</tbody></table>\n";
  h += fmt::format("<p class=\"note\">Each marker is the best candidate of one shape (stage, micro-batch, checkpointing, "
                   "offload, hpZ), as `zeroplan plan` ranks them; {} The throughput axis starts where the candidates do, not at 0. The search evaluated {} candidates, {} of them by "
                   "full simulation.</p>\n",
                   r.plan->simulated.empty() ? "" : "grey dots are the other candidates the search simulated.",
                   grouped(plan.value("candidates_evaluated", std::int64_t{0})),
                   grouped(plan.value("candidates_simulated", std::int64_t{0})));
  if (nothing_fits || !has_best) {
    h += "<p class=\"note\"><b>Nothing fits</b> under the limit. What would fit, each change alone:</p><ul>";
    if (plan.contains("suggestions") && plan["suggestions"].is_array())
      for (const auto& sg : plan["suggestions"])
        h += fmt::format("<li>{}: {}</li>", esc(sg.value("change", "")), sg.value("fits", false) ? "fits" : "still does not fit");
    h += "</ul>\n";
    return s;
  }
  const std::string ds = plan["best"]["ds_config"].dump(2);
  h += fmt::format("<h3>The winner's ds_config</h3>\n<p><a download=\"ds_config.json\" "
                   "href=\"data:application/json;charset=utf-8,{}\">save as ds_config.json</a> (the same file `zeroplan "
                   "plan --out` writes)</p>\n<pre class=\"ds\" data-ds-config>{}</pre>\n",
                   percent_encode(ds + "\n"), esc(ds));
  return s;
}

}  // namespace zp::report::detail
