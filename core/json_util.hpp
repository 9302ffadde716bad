#pragma once
// Strict JSON reading (faunus style): every key is known, every value has its type
// and range checked, and a misspelled key is reported with the closest known key.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace zp::json {

using nlohmann::json;

// Levenshtein distance, case-insensitive.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `key` (empty when none is within a reasonable distance).
std::string closest(std::string_view key, const std::vector<std::string>& candidates);

// Parse a whole file / a text read from `file`; malformed JSON → InputError naming the
// file, line and column (a number out of range, e.g. 1e400, is malformed JSON too).
json parse_file(const std::string& path);
json parse_text(const std::string& file, const std::string& text);

// A key or value as it may be shown in a one-line message: control characters and
// non-ASCII bytes escaped, long text cut.
std::string printable(std::string_view text);

// Read context: which file, and the dotted path of the object being read.
struct Reader {
  std::string file;
  std::string path;  // "" for the root, "zero_optimization" for a section, ...

  std::string key_path(std::string_view key) const;

  // Throws InputError for the first key of `obj` not in `known`, with the closest.
  void reject_unknown(const json& obj, const std::vector<std::string>& known) const;
  // Requires `v` to be an object.
  void require_object(const json& v, std::string_view key) const;

  // Typed readers: throw InputError naming file/key/expected type or range.
  bool get_bool(const json& obj, std::string_view key, bool dflt) const;
  // Accepts integers and integral floats (5e8); rejects fractions, negatives below lo.
  std::int64_t get_int(const json& obj, std::string_view key, std::int64_t dflt,
                       std::int64_t lo, std::int64_t hi) const;
  std::optional<std::int64_t> get_opt_int(const json& obj, std::string_view key, std::int64_t lo,
                                          std::int64_t hi) const;
  double get_double(const json& obj, std::string_view key, double dflt, double lo, double hi) const;
  std::string get_string(const json& obj, std::string_view key, const std::string& dflt) const;
  // A string from an allowed set (case-insensitive match, returns the canonical spelling).
  std::string get_enum(const json& obj, std::string_view key, const std::string& dflt,
                       const std::vector<std::string>& allowed) const;
  Reader sub(std::string_view key) const;
};

}  // namespace zp::json
