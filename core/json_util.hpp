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

// Nesting deeper than this is refused before parsing: no configuration, cluster,
// checkpoint header or measurement document comes near it (they nest 3-6 levels), and an
// input nested 100,000 levels deep must not exhaust the stack of whoever walks it.
constexpr int kMaxDepth = 128;

// Parse a whole file / a text read from `file`; malformed JSON → InputError naming the
// file, line and column (a number out of range, e.g. 1e400, is malformed JSON too), as
// does nesting deeper than kMaxDepth. parse_file refuses a file of more than `max_bytes`
// (zp::io::read_capped; `what` names what the file should be).
json parse_file(const std::string& path, std::int64_t max_bytes = std::int64_t{8} << 20,
                std::string_view what = "a JSON configuration");
json parse_text(const std::string& file, const std::string& text);

// Throws InputError (naming `file`, line and column) when `text` nests arrays and objects
// deeper than `max_depth`; strings are skipped, the rest of the syntax is not checked.
void check_depth(const std::string& file, std::string_view text, int max_depth = kMaxDepth);

// The same document with every integral number as an integer (5e8 and 500000000 read
// alike); objects are already ordered by key, so canonical(a).dump() == canonical(b).dump()
// when a and b differ only in spacing, key order or number spelling.
json canonical(const json& v);
// A 64-bit FNV-1a digest of canonical(v).dump(), as 16 hex digits.
std::string digest(const json& v);

// Where two documents differ: the dotted path of a key that one side lacks or whose
// value differs, and both values as printable JSON ("absent" for a missing key).
struct Difference {
  std::string path, a, b;
};
std::vector<Difference> differences(const json& a, const json& b, std::size_t limit = 8);
// "k1: A vs B; k2: absent vs C" with the sides named (`a_name`, `b_name`), at most `limit`
// keys, then "and N more".
std::string describe_differences(const json& a, const json& b, std::string_view a_name, std::string_view b_name,
                                 std::size_t limit = 4);

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
  // A string from an allowed set (case-insensitive match, returns the canonical spelling;
  // exact_case: only the spelling given, as a pydantic enum field matches).
  std::string get_enum(const json& obj, std::string_view key, const std::string& dflt,
                       const std::vector<std::string>& allowed, bool exact_case = false) const;
  Reader sub(std::string_view key) const;
};

}  // namespace zp::json
