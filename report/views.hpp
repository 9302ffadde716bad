#pragma once
// The five views of the report page, each a <section> of its own (report/page.cpp puts
// them together). Internal to the report library.
#include <cstdint>
#include <string>

#include "report/report.hpp"

namespace zp::report::detail {

struct Section {
  std::string id;                      // the section's id (the page's table of contents links it)
  std::string title;
  std::string html;                    // the section's inner HTML
  std::int64_t events = 0;             // step events it drew (views 2 and 3)
  std::size_t slices = 0;              // timeline rectangles
  bool aggregated = false;             // it aggregated or sampled
};

// 1: bytes at the peak by category, reserved and context on top, the device limit.
Section memory_per_stage(const Report& r);
// 2: bytes by category over the step's events, the pair side by side, micro-steps marked.
Section memory_over_step(const Report& r, const PageOptions& opt);
// 3: the streams as lanes over time, collectives by kind, exposed communication.
Section step_timeline(const Report& r, const PageOptions& opt);
// 4: the planner's candidates (memory vs throughput), the limit, the winner and its ds_config.
Section plan_candidates(const Report& r);
// 5: a measurement over its prediction: bytes and times.
Section measured_vs_predicted(const Report& r, const PageOptions& opt);

// Shared by the views.
const char* category_colour(int category);
const char* category_label(int category);
// "<div class=note>…</div>" for a view that cannot be drawn from what the report has.
std::string unavailable(const std::string& why);
// A figure: the SVG element's opening tag with a viewBox of w × h, role and label.
std::string svg_open(double w, double h, const std::string& label);

}  // namespace zp::report::detail
