#pragma once
// Bad input is answered with one line naming the file, the key and what is allowed,
// and exit status 2. Every reader throws InputError; cli/ prints what() and exits 2.
#include <stdexcept>
#include <string>

namespace zp {

class InputError : public std::runtime_error {
 public:
  // file: path or "--flag"; key: dotted JSON path or option; msg: what is wrong and allowed.
  InputError(const std::string& file, const std::string& key, const std::string& msg);
  explicit InputError(const std::string& msg) : std::runtime_error(msg) {}
};

constexpr int kExitBadInput = 2;
// `plan`: the search ran, and no configuration fits the memory limit (no ds_config written).
constexpr int kExitNothingFits = 3;

}  // namespace zp
