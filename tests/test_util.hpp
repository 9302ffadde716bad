#pragma once
// Helpers shared by the doctest suites.
#include <string>

#include "core/error.hpp"

namespace zp::test {

// The message of the InputError thrown by `f` ("" when none is thrown, so a check on
// the message's content fails).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace zp::test
