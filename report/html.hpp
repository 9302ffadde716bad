#pragma once
// Small pieces the views share: escaping, number formats, axis ticks, the palette and
// SVG fragments. Everything is written as text; nothing here knows about ZeRO.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zp::report {

// Text and attribute values: & < > " ' escaped.
std::string esc(std::string_view s);

// 1234567 → "1,234,567".
std::string grouped(std::int64_t v);
// Bytes as people read them: "12.39 GiB", "953.7 MiB", "6 B" (binary units).
std::string bytes_text(std::int64_t b);
// A coordinate with one decimal ("12.3"), the precision every plot uses.
std::string px(double v);

// About `target` round tick values covering [0, hi] (1, 2, 2.5, 5 × 10^k steps).
std::vector<double> nice_ticks(double hi, int target);
// A tick label: no trailing zeros ("0.5", "12", "2500").
std::string tick_text(double v);

// Okabe–Ito, the colour-blind-safe palette every plot draws from.
namespace colour {
inline constexpr const char* black = "#000000";
inline constexpr const char* orange = "#E69F00";
inline constexpr const char* sky_blue = "#56B4E9";
inline constexpr const char* green = "#009E73";
inline constexpr const char* yellow = "#F0E442";
inline constexpr const char* blue = "#0072B2";
inline constexpr const char* vermillion = "#D55E00";
inline constexpr const char* purple = "#CC79A7";
inline constexpr const char* grey = "#999999";
inline constexpr const char* dark_grey = "#555555";
}  // namespace colour

// A legend entry: a swatch (fill, optionally a pattern id drawn over it) and its text.
struct LegendItem {
  std::string fill;
  std::string label;
  std::string pattern;                 // "" or the id of a <pattern> in the page's defs
};
// An HTML legend (a flex row of swatches) for under or over a plot.
std::string legend_html(const std::vector<LegendItem>& items);

// <rect> with a hover title; `extra` is added to the element's attributes.
std::string rect(double x, double y, double w, double h, std::string_view fill, std::string_view title,
                 std::string_view extra = "");
std::string text(double x, double y, std::string_view s, std::string_view extra = "");
std::string line(double x1, double y1, double x2, double y2, std::string_view extra);

// Vertical marks at x (px) from y0 to y1, labelled at label_y: labels at least 34 px
// apart, the last mark's label always (it is the optimizer step); when some labels do not
// fit, only the labelled marks are drawn. Labels near `right` are right-aligned.
struct Mark {
  std::string label;
  double x = 0;
};
std::string marks_svg(const std::vector<Mark>& marks, double y0, double y1, double label_y, double right);

// A cell of a numeric table: the exact value in data-v (for tools and tests), `shown`
// for people, right-aligned.
std::string num_cell(std::int64_t exact, std::string_view shown);
std::string num_cell(double exact, std::string_view shown);

}  // namespace zp::report
