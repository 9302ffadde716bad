#include "core/json_util.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace zp::json {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(key, c);
    if (d < best_d) { best_d = d; best = c; }
  }
  // Accept a suggestion within half the key's length (at least 3 edits).
  const std::size_t limit = std::max<std::size_t>(3, key.size() / 2);
  return best_d <= limit ? best : std::string{};
}

json parse_file(const std::string& path, std::int64_t max_bytes, std::string_view what) {
  return parse_text(path, io::read_capped(path, max_bytes, what));
}

namespace {

std::pair<std::size_t, std::size_t> line_column(std::string_view text, std::size_t off) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < off && i < text.size(); ++i) {
    if (text[i] == '\n') { ++line; col = 1; } else { ++col; }
  }
  return {line, col};
}

}  // namespace

void check_depth(const std::string& file, std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        const auto [line, col] = line_column(text, i);
        throw InputError(file, "", fmt::format("nested more than {} levels deep (at line {} column {}); nothing "
                                               "zeroplan reads nests like this",
                                               max_depth, line, col));
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
}

json parse_text(const std::string& file, const std::string& text) {
  check_depth(file, text);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // Convert the byte offset into line:column for the user.
    const auto [line, col] = line_column(text, e.byte == 0 ? 0 : e.byte - 1);
    throw InputError(file, "", fmt::format("malformed JSON at line {} column {}", line, col));
  } catch (const json::exception& e) {
    // e.g. out_of_range for a number too large for a double (1e400).
    std::string what = e.what();
    if (const auto p = what.find("] "); p != std::string::npos) what.erase(0, p + 2);
    throw InputError(file, "", fmt::format("malformed JSON: {}", printable(what)));
  }
}

json canonical(const json& v) {
  if (v.is_object()) {
    json out = json::object();
    for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = canonical(it.value());
    return out;
  }
  if (v.is_array()) {
    json out = json::array();
    for (const auto& x : v) out.push_back(canonical(x));
    return out;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= 9007199254740992.0)
      return json(static_cast<std::int64_t>(d));
  }
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX))
    return json(static_cast<std::int64_t>(v.get<std::uint64_t>()));
  return v;
}

std::string digest(const json& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : canonical(v).dump()) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

namespace {

void collect_differences(const json& a, const json& b, const std::string& path, std::vector<Difference>& out,
                         std::size_t limit) {
  if (out.size() >= limit) return;
  const auto shown = [](const json& v) { return printable(v.dump()); };
  const auto at = [&](const std::string& key) { return path.empty() ? printable(key) : path + "." + printable(key); };
  if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end() && out.size() < limit; ++it) {
      const auto o = b.find(it.key());
      if (o == b.end()) out.push_back({at(it.key()), shown(it.value()), "absent"});
      else collect_differences(it.value(), *o, at(it.key()), out, limit);
    }
    for (auto it = b.begin(); it != b.end() && out.size() < limit; ++it)
      if (!a.contains(it.key())) out.push_back({at(it.key()), "absent", shown(it.value())});
    return;
  }
  if (a != b) out.push_back({path.empty() ? "(the whole document)" : path, shown(a), shown(b)});
}

}  // namespace

std::vector<Difference> differences(const json& a, const json& b, std::size_t limit) {
  std::vector<Difference> out;
  collect_differences(canonical(a), canonical(b), "", out, limit);
  return out;
}

std::string describe_differences(const json& a, const json& b, std::string_view a_name, std::string_view b_name,
                                 std::size_t limit) {
  const auto all = differences(a, b, std::numeric_limits<std::size_t>::max());
  std::string s;
  for (std::size_t i = 0; i < all.size() && i < limit; ++i)
    s += fmt::format("{}{}: {} {} vs {} {}", i ? "; " : "", all[i].path, all[i].a, a_name, all[i].b, b_name);
  if (all.size() > limit) s += fmt::format("; and {} more", all.size() - limit);
  return s;
}

std::string printable(std::string_view text) {
  std::string out;
  for (const char ch : text.substr(0, 200)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) out += ch;
    else out += fmt::format("\\x{:02x}", c);
  }
  if (text.size() > 200) out += "...";
  return out;
}

std::string Reader::key_path(std::string_view key) const {
  if (path.empty()) return printable(key);
  return fmt::format("{}.{}", path, printable(key));
}

void Reader::reject_unknown(const json& obj, const std::vector<std::string>& known) const {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    const std::string near = closest(it.key(), known);
    if (near.empty())
      throw InputError(file, key_path(it.key()), "unknown key");
    throw InputError(file, key_path(it.key()), fmt::format("unknown key (did you mean '{}'?)", near));
  }
}

void Reader::require_object(const json& v, std::string_view key) const {
  if (!v.is_object())
    throw InputError(file, key_path(key), fmt::format("must be a JSON object, got {}", v.type_name()));
}

bool Reader::get_bool(const json& obj, std::string_view key, bool dflt) const {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    throw InputError(file, key_path(key), fmt::format("must be true or false, got {}", printable(it->dump())));
  return it->get<bool>();
}

static std::string range_text(std::int64_t lo, std::int64_t hi) {
  if (hi == std::numeric_limits<std::int64_t>::max()) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer in [{}, {}]", lo, hi);
}

std::optional<std::int64_t> Reader::get_opt_int(const json& obj, std::string_view key,
                                                std::int64_t lo, std::int64_t hi) const {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return std::nullopt;
  std::int64_t v = 0;
  if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
    throw InputError(file, key_path(key), fmt::format("must be {}, got {}", range_text(lo, hi), printable(it->dump())));
  } else if (it->is_number_integer()) {
    v = it->get<std::int64_t>();
  } else if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18)
      throw InputError(file, key_path(key), fmt::format("must be {}, got {}", range_text(lo, hi), printable(it->dump())));
    v = static_cast<std::int64_t>(d);
  } else {
    throw InputError(file, key_path(key), fmt::format("must be {}, got {}", range_text(lo, hi), printable(it->dump())));
  }
  if (v < lo || v > hi)
    throw InputError(file, key_path(key), fmt::format("must be {}, got {}", range_text(lo, hi), printable(it->dump())));
  return v;
}

std::int64_t Reader::get_int(const json& obj, std::string_view key, std::int64_t dflt,
                             std::int64_t lo, std::int64_t hi) const {
  return get_opt_int(obj, key, lo, hi).value_or(dflt);
}

double Reader::get_double(const json& obj, std::string_view key, double dflt, double lo, double hi) const {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_number())
    throw InputError(file, key_path(key), fmt::format("must be a number in [{}, {}], got {}", lo, hi, printable(it->dump())));
  const double d = it->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw InputError(file, key_path(key), fmt::format("must be a number in [{}, {}], got {}", lo, hi, printable(it->dump())));
  return d;
}

std::string Reader::get_string(const json& obj, std::string_view key, const std::string& dflt) const {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_string())
    throw InputError(file, key_path(key), fmt::format("must be a string, got {}", printable(it->dump())));
  return it->get<std::string>();
}

std::string Reader::get_enum(const json& obj, std::string_view key, const std::string& dflt,
                             const std::vector<std::string>& allowed, bool exact_case) const {
  auto it = obj.find(std::string(key));
  std::string joined;
  for (const auto& a : allowed) joined += (joined.empty() ? "" : ", ") + a;
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_string())
    throw InputError(file, key_path(key), fmt::format("must be one of {}, got {}", joined, printable(it->dump())));
  const std::string s = it->get<std::string>();
  for (const auto& a : allowed) {
    if (a.size() == s.size() &&
        std::equal(a.begin(), a.end(), s.begin(), [exact_case](char x, char y) {
          return exact_case ? x == y
                            : std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
        }))
      return a;
  }
  throw InputError(file, key_path(key), fmt::format("must be one of {}, got \"{}\"", joined, printable(s)));
}

Reader Reader::sub(std::string_view key) const { return Reader{file, key_path(key)}; }

}  // namespace zp::json
