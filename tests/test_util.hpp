#pragma once
// Helpers shared by the doctest suites.
#include <sys/wait.h>

#include <array>
#include <cstdio>
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

// Runs a shell command; its exit status (-1 when it did not exit normally) and output
// (stdout, with stderr merged unless `merge_stderr` is false).
struct ShellRun {
  int status = -1;
  std::string out;
};
inline ShellRun run_shell(const std::string& cmd, bool merge_stderr = true) {
  ShellRun r;
  FILE* f = popen((cmd + (merge_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!f) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), f)) r.out += buf.data();
  const int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace zp::test
