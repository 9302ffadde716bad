#include "core/error.hpp"

#include <fmt/format.h>

namespace zp {

static std::string format_input_error(const std::string& file, const std::string& key,
                                      const std::string& msg) {
  if (key.empty()) return fmt::format("{}: {}", file, msg);
  return fmt::format("{}: {}: {}", file, key, msg);
}

InputError::InputError(const std::string& file, const std::string& key, const std::string& msg)
    : std::runtime_error(format_input_error(file, key, msg)) {}

}  // namespace zp
