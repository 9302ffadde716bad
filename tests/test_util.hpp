#pragma once
// Helpers shared by the doctest suites.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <functional>
#include <initializer_list>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

#include "core/error.hpp"

namespace zp::test {

// A path under the system's temporary folder private to this test process: two runs of the
// suite at once (a developer's and CI's on one machine) do not share their scratch files.
inline std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
}

// doctest::Approx with a relative tolerance only. doctest's default adds its scale (1) to the
// magnitudes it compares, so any two values below about 1e-5 (a kernel's seconds) would pass as
// equal; this scale keeps exact zeros equal and nothing else.
inline doctest::Approx approx(double v) { return doctest::Approx(v).scale(1e-30); }

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

// A peer failing mid-training: runs `rank_cmd` (which prints "step N" lines) under
// `mpirun_prefix` (two ranks) in the background with its output in `log`, waits for step 20,
// sends rank 1 signal `sig` (STOP: it hangs with its sockets open; KILL: it dies), and waits
// for mpirun. Each rank writes its pid to `log`.pidR before it execs `rank_cmd`, so rank 1 is
// found without searching /proc (which took minutes on a loaded 2-core machine). Returns
// mpirun's status (-1 when rank 1 was not found), the seconds from the signal to the end,
// and the ranks' output.
struct PeerFault {
  int status = -1;
  double seconds = -1;
  std::string out;
};
inline PeerFault fault_peer(const std::string& mpirun_prefix, const std::string& rank_cmd, const std::string& sig,
                            const std::filesystem::path& log) {
  const std::filesystem::path sh = log.string() + ".sh";
  const std::string pid1 = log.string() + ".pid1";
  std::filesystem::remove(pid1);
  std::filesystem::remove(log.string() + ".pid0");
  std::ofstream(sh) << mpirun_prefix << " bash -c 'echo $$ > " << log.string() << ".pid$OMPI_COMM_WORLD_RANK; exec "
                    << rank_cmd << "' > " << log.string() << " 2>&1 &\nM=$!\n"
                    << "for i in $(seq 600); do grep -q '^step *20 ' " << log.string() << " 2>/dev/null && break; sleep 0.1; done\n"
                    << "R1=$(cat " << pid1 << " 2>/dev/null)\n"
                    << "[ -n \"$R1\" ] || { kill $M; echo 'rank 1 not found'; exit 0; }\n"
                    << "T0=$(date +%s%N)\nkill -" << sig << " $R1\n"
                    // Bounded: a job still running 60 s after the signal is a hang; say what its
                    // processes were doing, end them, and report it (status 137, > 30 s).
                    << "for i in $(seq 600); do kill -0 $M 2>/dev/null || break; sleep 0.1; done\n"
                    << "if kill -0 $M 2>/dev/null; then echo 'still running 60 s after the signal:';\n"
                    << "  ps -eo pid,stat,wchan:32,args | grep -E 'mpirun|zeroplan' | grep -v grep;\n"
                    << "  kill -CONT $R1; kill -9 $R1 $(cat " << log.string() << ".pid0 2>/dev/null) $M; fi\n"
                    << "wait $M\n"
                    << "echo \"status $? ms $(( ($(date +%s%N) - T0) / 1000000 ))\"\n";
  const ShellRun r = run_shell("timeout 150 bash " + sh.string());
  PeerFault f;
  std::ifstream in(log);
  f.out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  f.out += r.out;
  const auto at = r.out.rfind("status ");
  if (at == std::string::npos) return f;
  long status = -1, ms = -1;
  if (std::sscanf(r.out.c_str() + at, "status %ld ms %ld", &status, &ms) == 2) {
    f.status = static_cast<int>(status);
    f.seconds = static_cast<double>(ms) / 1e3;
  }
  return f;
}

// What every peer-fault test asserts: the job ended (not 0), within 30 s of the signal; for a
// stopped peer, with each of `hang_lines` in the output and not before `timeout_s` (less half a
// second: rank 0 may already have been waiting when the peer stopped).
inline void check_peer_fault(const PeerFault& f, const std::string& sig, std::initializer_list<std::string> hang_lines,
                             double timeout_s) {
  INFO(sig, "\n", f.out);
  MESSAGE("peer ", sig, ": mpirun status ", f.status, " after ", f.seconds, " s");
  REQUIRE(f.status >= 0);  // rank 1 was found and signalled
  CHECK(f.status != 0);
  CHECK(f.seconds < 30.0);
  if (sig == "STOP") {
    for (const auto& line : hang_lines) CHECK(f.out.find(line) != std::string::npos);
    CHECK(f.seconds >= timeout_s - 0.5);
  }
}

}  // namespace zp::test
