#include "models/attention.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/json_util.hpp"

namespace zp::models {

const char* attention_name(Attention a) {
  switch (a) {
    case Attention::eager: return "eager";
    case Attention::sdpa: return "sdpa";
    case Attention::flash_attention_2: return "flash_attention_2";
  }
  return "?";
}

const std::vector<std::string>& attention_names() {
  static const std::vector<std::string> k{"eager", "sdpa", "flash_attention_2"};
  return k;
}

Attention parse_attention(const std::string& file, const std::string& key, const std::string& value) {
  if (value == "eager") return Attention::eager;
  if (value == "sdpa") return Attention::sdpa;
  if (value == "flash_attention_2") return Attention::flash_attention_2;
  std::string why = fmt::format("must be one of eager, sdpa, flash_attention_2 (transformers' names), got '{}'",
                                zp::json::printable(value));
  if (const std::string near = zp::json::closest(value, attention_names()); !near.empty())
    why += fmt::format(" (did you mean '{}'?)", near);
  else if (value == "flash_attention_3" || value == "flex_attention" || value.rfind("paged", 0) == 0)
    why += ": that implementation is not modelled";
  throw InputError(file, key, why);
}

}  // namespace zp::models
