#include "report/html.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace zp::report {

std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string grouped(std::int64_t v) {
  const std::uint64_t a = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  const std::string digits = std::to_string(a);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string bytes_text(std::int64_t b) {
  const double v = static_cast<double>(b);
  const double a = std::fabs(v);
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", v / 1024.0);
  return fmt::format("{} B", b);
}

std::string px(double v) {
  std::string s = fmt::format("{:.1f}", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  if (s == "-0") s = "0";
  return s;
}

std::vector<double> nice_ticks(double hi, int target) {
  std::vector<double> out;
  if (!(hi > 0) || !std::isfinite(hi)) return {0.0};
  const double raw = hi / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (int k = 0; k * step <= hi * (1 + 1e-9); ++k) out.push_back(k * step);
  return out;
}

std::string tick_text(double v) {
  if (v == 0) return "0";
  std::string s = fmt::format("{:.6f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string legend_html(const std::vector<LegendItem>& items) {
  std::string s = "<div class=\"legend\">";
  for (const auto& it : items) {
    s += fmt::format("<span class=\"key\"><svg width=\"14\" height=\"14\" aria-hidden=\"true\"><rect width=\"14\" "
                     "height=\"14\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.5\"/>{}</svg>{}</span>",
                     it.fill,
                     it.pattern.empty() ? "" : fmt::format("<rect width=\"14\" height=\"14\" fill=\"url(#{})\"/>", it.pattern),
                     esc(it.label));
  }
  return s + "</div>\n";
}

std::string rect(double x, double y, double w, double h, std::string_view fill, std::string_view title,
                 std::string_view extra) {
  return fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"{}{}>{}</rect>", px(x), px(y),
                     px(w), px(h), fill, extra.empty() ? "" : " ", extra,
                     title.empty() ? std::string() : fmt::format("<title>{}</title>", esc(title)));
}

std::string text(double x, double y, std::string_view s, std::string_view extra) {
  return fmt::format("<text x=\"{}\" y=\"{}\"{}{}>{}</text>", px(x), px(y), extra.empty() ? "" : " ", extra, esc(s));
}

std::string line(double x1, double y1, double x2, double y2, std::string_view extra) {
  return fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" {}/>", px(x1), px(y1), px(x2), px(y2), extra);
}

std::string marks_svg(const std::vector<Mark>& marks, double y0, double y1, double label_y, double right) {
  constexpr double kGap = 34;
  std::vector<char> labelled(marks.size(), 0);
  double last = -1e9;
  const double end_x = marks.empty() ? 0 : marks.back().x;
  for (std::size_t i = 0; i < marks.size(); ++i) {
    const bool final_mark = i + 1 == marks.size();
    if (final_mark || (marks[i].x - last >= kGap && end_x - marks[i].x >= kGap)) {
      labelled[i] = 1;
      last = marks[i].x;
    }
  }
  const bool all = std::find(labelled.begin(), labelled.end(), 0) == labelled.end();
  std::string s;
  for (std::size_t i = 0; i < marks.size(); ++i) {
    if (!all && !labelled[i]) continue;
    s += line(marks[i].x, y0, marks[i].x, y1, "class=\"mark\"");
    if (!labelled[i]) continue;
    const bool near_right = marks[i].x + 6.0 * static_cast<double>(marks[i].label.size()) + 4 > right;
    s += text(near_right ? marks[i].x - 2 : marks[i].x + 2, label_y, marks[i].label,
              near_right ? "class=\"small\" text-anchor=\"end\"" : "class=\"small\"");
  }
  return s;
}

std::string num_cell(std::int64_t exact, std::string_view shown) {
  return fmt::format("<td class=\"n\" data-v=\"{}\" title=\"{}\">{}</td>", exact, grouped(exact), esc(shown));
}

std::string num_cell(double exact, std::string_view shown) {
  return fmt::format("<td class=\"n\" data-v=\"{}\">{}</td>", exact, esc(shown));
}

}  // namespace zp::report
