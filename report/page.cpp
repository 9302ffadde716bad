// The report page: head and style, what it was made from, the views, the source JSON.
#include <fmt/format.h>

#include "report/html.hpp"
#include "report/report.hpp"
#include "report/views.hpp"

namespace zp::report {

namespace {

// One stylesheet for screen and print; the plots scale to the page's width.
constexpr const char* kStyle = R"css(
:root{color-scheme:light}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;color:#111;background:#fff;
  margin:0 auto;max-width:1140px;padding:14px 20px 40px}
h1{font-size:21px;margin:6px 0 4px}h2{font-size:17px;border-bottom:1px solid #bbb;padding-bottom:3px;margin:30px 0 8px}
h3{font-size:14px;margin:16px 0 4px}
svg{max-width:100%;height:auto;display:block;margin:4px 0;break-inside:avoid}
svg text{font-family:inherit}
.tick{font-size:11px;fill:#333}.lbl{font-size:12px;fill:#111}.b{font-weight:600}.small{font-size:10px;fill:#333}
.axl{font-size:12px;fill:#111}.seg{font-size:10px}.halo{paint-order:stroke;stroke:#fff;stroke-width:3px}
.grid{stroke:#E4E4E4;stroke-width:1}.ax{stroke:#333;stroke-width:1}.limit{stroke:#000;stroke-width:1.5;fill:none}
.mark{stroke:#777;stroke-width:.7;stroke-dasharray:2,2}
.legend{display:flex;flex-wrap:wrap;gap:3px 14px;margin:6px 0;font-size:12px}
.key{display:inline-flex;align-items:center;gap:5px}
.pair{display:flex;flex-wrap:wrap;gap:8px}.panel{margin:0;flex:1 1 520px;min-width:0}
table{border-collapse:collapse;font-size:12px;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:2px 8px;vertical-align:top}th{text-align:left;background:#F5F5F5;font-weight:600}
td.n{text-align:right;white-space:nowrap}td.ev{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:11px}
.facts{margin:2px 0;padding-left:18px;font-size:13px}.note{color:#333;font-size:12.5px;max-width:1040px}
.missing{background:#FFF5DC;border-left:4px solid #E69F00;padding:6px 10px}.warn{color:#7A4100;font-size:12.5px}
pre.ds{background:#F5F5F5;border:1px solid #ddd;padding:8px;font-size:12px;overflow:auto;max-height:420px}
code{font-size:12px}nav{font-size:13px}nav ol{margin:2px 0;padding-left:22px}
@media print{body{max-width:none;padding:0;font-size:11px}nav{display:none}h2{break-after:avoid}
  pre.ds{max-height:none}*{-webkit-print-color-adjust:exact;print-color-adjust:exact}tr{break-inside:avoid}}
)css";

// Patterns every plot may use (an SVG that takes no room; not display:none, so they render).
constexpr const char* kDefs =
    "<svg width=\"0\" height=\"0\" style=\"position:absolute\" aria-hidden=\"true\"><defs>"
    "<pattern id=\"zp-hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
    "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#000\" stroke-width=\"1.4\" stroke-opacity=\"0.6\"/></pattern>"
    "</defs></svg>\n";

// The JSON inside a <script type="application/json"> block: no "<" that could end it.
std::string embeddable(const nlohmann::json& j) {
  const std::string s = j.dump();
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

}  // namespace

std::string render_html(const Report& r, const PageOptions& opt, PageStats* stats) {
  std::vector<detail::Section> sections;
  sections.push_back(detail::memory_per_stage(r));
  sections.push_back(detail::memory_over_step(r, opt));
  sections.push_back(detail::step_timeline(r, opt));
  if (r.plan) sections.push_back(detail::plan_candidates(r));
  if (r.measured) sections.push_back(detail::measured_vs_predicted(r, opt));

  std::string h;
  h.reserve(1 << 20);
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += "<meta name=\"generator\" content=\"zeroplan report\">\n";
  h += "<title>" + esc(r.title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  h += kDefs;
  h += "<header>\n<h1>" + esc(r.title) + "</h1>\n<ul class=\"facts\">\n";
  for (const auto& f : r.facts) h += "<li>" + esc(f) + "</li>\n";
  h += "</ul>\n";
  for (const auto& w : r.warnings) h += "<p class=\"warn\">warning: " + esc(w) + "</p>\n";
  if (!r.command.empty()) h += "<p class=\"note\">Made by <code>" + esc(r.command) + "</code></p>\n";
  h += "<nav><ol>\n";
  for (const auto& s : sections) h += fmt::format("<li><a href=\"#{}\">{}</a></li>\n", s.id, esc(s.title.substr(s.title.find(' ') + 1)));
  h += "</ol></nav>\n</header>\n<main>\n";
  std::size_t slices = 0;
  std::int64_t events = 0;
  bool aggregated = false;
  for (const auto& s : sections) {
    h += fmt::format("<section id=\"{}\" data-view=\"{}\">\n<h2>{}</h2>\n", s.id, s.id, esc(s.title));
    h += s.html;
    h += "</section>\n";
    slices += s.slices;
    if (s.id == "step-timeline") events = s.events;
    aggregated = aggregated || s.aggregated;
  }
  h += "</main>\n<footer>\n<p class=\"note\">This page is self-contained: inline SVG and CSS, nothing loaded from the "
       "network and no script that runs. Hover over a bar, area or slice for its numbers; the tables under each plot "
       "have them exactly (bytes in <code>data-v</code>). Colours: the Okabe–Ito palette; hatching marks reserved-but-"
       "unallocated memory, exposed communication and measurements.";
  if (!r.source_file.empty()) h += " Numbers from <code>" + esc(r.source_file) + "</code>.";
  h += "</p>\n</footer>\n";
  if (!r.source.is_null())
    h += fmt::format("<script type=\"application/json\" id=\"zeroplan-data\" data-kind=\"{}\">{}</script>\n",
                     esc(r.source_kind), embeddable(r.source));
  h += "</body>\n</html>\n";
  if (stats) {
    stats->bytes = h.size();
    stats->events = events;
    stats->timeline_slices = slices;
    stats->aggregated = aggregated;
    stats->views.clear();
    for (const auto& s : sections) stats->views.push_back(s.id);
  }
  return h;
}

}  // namespace zp::report
