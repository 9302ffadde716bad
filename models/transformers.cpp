#include "models/transformers.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json_util.hpp"

namespace zp::models {

const char* transformers_name(Transformers t) {
  switch (t) {
    case Transformers::v4_46: return "4.46";
    case Transformers::v5: return "5";
  }
  return "?";
}

const std::vector<std::string>& transformers_names() {
  static const std::vector<std::string> k{"5", "4.46"};
  return k;
}

Transformers parse_transformers(const std::string& file, const std::string& key, const std::string& value) {
  // A release series, optionally with its minor and patch numbers: "5", "5.17", "5.17.0".
  auto series = [&](const std::string& prefix) {
    return value == prefix || (value.size() > prefix.size() && value.compare(0, prefix.size(), prefix) == 0 &&
                               value[prefix.size()] == '.');
  };
  if (series("5")) return Transformers::v5;
  if (series("4.46")) return Transformers::v4_46;
  throw InputError(file, key,
                   fmt::format("must be 5 (transformers 5.x, the default) or 4.46 (transformers 4.46), got '{}': "
                               "releases between them changed the modelled behaviours in steps (4.57 reads as 5); "
                               "pick the nearer",
                               zp::json::printable(value)));
}

}  // namespace zp::models
