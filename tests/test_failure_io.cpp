// Reading and writing files on hostile paths (core/file_io, core/json_util): size caps,
// nesting limits, the atomic writer on regular files, devices, FIFOs, symlinks and
// directories, concurrent writers, and outputs that are inputs.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
namespace io = zp::io;
using zp::test::input_error;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / fmt::format("zp_fio_{}_{}", ::getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// Names in `dir` that are temporaries of the atomic writer.
int temporaries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("read_capped: a file, a directory, a device that never ends, a file over the cap") {
  TempDir d;
  spit(d / "a.json", "{\"x\": 1}");
  CHECK(io::read_capped(d / "a.json", 100, "a test file") == "{\"x\": 1}");
  std::string e = input_error([&] { io::read_capped(d.path.string(), 100, "a test file"); });
  CHECK(contains(e, "is a directory, not a test file"));
  // /dev/zero and /dev/urandom never end: refused once the cap is read, not after memory is gone.
  for (const char* dev : {"/dev/zero", "/dev/urandom"}) {
    e = input_error([&] { io::read_capped(dev, 1 << 20, "a ds_config"); });
    CHECK(e == fmt::format("{}: more than 1 MiB: too large for a ds_config", dev));
  }
  spit(d / "big.json", std::string(101, ' '));
  e = input_error([&] { io::read_capped(d / "big.json", 100, "a test file"); });
  CHECK(contains(e, "more than 100 bytes: too large for a test file"));
  e = input_error([&] { io::read_capped(d / "missing.json", 100, "a test file"); });
  CHECK(contains(e, "cannot open file: no such file"));
  CHECK(contains(e, "missing.json"));
}

TEST_CASE("JSON readers refuse nesting deeper than 128 levels, one line") {
  const auto nest = [](int n) { return std::string(static_cast<std::size_t>(n), '[') + std::string(static_cast<std::size_t>(n), ']'); };
  CHECK(zp::json::parse_text("f.json", nest(128)).is_array());
  std::string e = input_error([&] { zp::json::parse_text("f.json", nest(129)); });
  CHECK(e == "f.json: nested more than 128 levels deep (at line 1 column 129); nothing zeroplan reads nests like this");
  // 100,000 levels of objects: refused before the parser or a walk recurses.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"a\":";
  deep += '1';
  deep.append(100000, '}');
  e = input_error([&] { zp::json::parse_text("deep.json", deep); });
  CHECK(contains(e, "deep.json: nested more than 128 levels deep"));
  CHECK(e.find('\n') == std::string::npos);
  // Brackets inside strings (escaped quotes included) are text, not nesting.
  const std::string text = "{\"k\": \"" + std::string(500, '[') + "\\\"" + std::string(500, '{') + "\"}";
  CHECK(zp::json::parse_text("s.json", text)["k"].get<std::string>().size() == 1001);
  TempDir d;
  spit(d / "deep.json", deep);
  e = input_error([&] { zp::json::parse_file(d / "deep.json"); });
  CHECK(contains(e, "nested more than 128 levels deep"));
}

TEST_CASE("canonical JSON, digests and named differences") {
  using nlohmann::json;
  const json a = json::parse(R"({"b": 5e8, "a": {"x": [1, 2.0]}})");
  const json b = json::parse("{\n  \"a\": {\"x\": [1, 2]},\n  \"b\": 500000000\n}");
  CHECK(zp::json::canonical(a) == zp::json::canonical(b));
  CHECK(zp::json::digest(a) == zp::json::digest(b));
  CHECK(zp::json::digest(a).size() == 16);
  const json c = json::parse(R"({"a": {"x": [1, 3]}, "c": true})");
  CHECK(zp::json::digest(a) != zp::json::digest(c));
  CHECK(zp::json::describe_differences(a, c, "before", "now") ==
        "a.x: [1,2] before vs [1,3] now; b: 500000000 before vs absent now; c: absent before vs true now");
  CHECK(zp::json::differences(a, a).empty());
}

TEST_CASE("atomic writer: a regular file is replaced whole, keeps its mode, and leaves no temporary") {
  TempDir d;
  const std::string f = d / "out.json";
  io::write_atomic(f, "first\n", "--out");
  CHECK(slurp(f) == "first\n");
  struct stat st{};
  REQUIRE(::stat(f.c_str(), &st) == 0);
  const mode_t um = ::umask(022);
  ::umask(um);
  CHECK((st.st_mode & 0777) == (0666 & ~um));
  ::chmod(f.c_str(), 0640);
  io::write_atomic(f, "second\n", "--out");
  CHECK(slurp(f) == "second\n");
  REQUIRE(::stat(f.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);
  {
    io::AtomicWriter w(f, "--out");
    CHECK(w.replaces());
    w.write("never committed");
    CHECK(temporaries(d.path) == 1);
  }
  CHECK(slurp(f) == "second\n");
  CHECK(temporaries(d.path) == 0);
  // write_at rewrites bytes already written (checkpoint headers).
  io::AtomicWriter w(f, "--out");
  w.write("abcdef");
  w.write_at("XY", 2, 2);
  w.commit();
  CHECK(slurp(f) == "abXYef");
  CHECK_THROWS_AS(w.commit(), std::logic_error);
}

TEST_CASE("atomic writer: directories, loops and devices are refused; character devices and FIFOs written through") {
  TempDir d;
  fs::create_directories(d / "dir");
  std::string e = input_error([&] { io::write_atomic(d / "dir", "x", "--out"); });
  CHECK(e == fmt::format("{}: --out: is a directory; give the path of a file to write", d / "dir"));
  CHECK(temporaries(d.path) == 0);
  CHECK(fs::is_empty(d.path / "dir"));
  fs::create_symlink("loop_b", d.path / "loop_a");
  fs::create_symlink("loop_a", d.path / "loop_b");
  e = input_error([&] { io::write_atomic(d / "loop_a", "x", "--out"); });
  CHECK(contains(e, "is a symlink loop"));
  e = input_error([&] { io::write_atomic(d / "no/such/dir/f.json", "x", "--out"); });
  CHECK(contains(e, "cannot create a file in"));
  CHECK(e.find('\n') == std::string::npos);

  // A null device stays a device; a full one reports the full disk and stays a device.
  // (Nodes made here as root: a regression must not replace the machine's /dev/null.)
  if (::geteuid() == 0) {
    const std::string null = d / "null", full = d / "full";
    REQUIRE(::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
    REQUIRE(::mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0);
    io::write_atomic(null, "x", "--out");
    CHECK(fs::is_character_file(null));
    e = input_error([&] { io::write_atomic(full, "x", "--out"); });
    CHECK(e == full + ": --out: cannot write: No space left on device");
    CHECK(fs::is_character_file(full));
  }

  // A FIFO is written through to its reader.
  const std::string fifo = d / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string got;
  std::thread reader([&] { got = slurp(fifo); });
  io::write_atomic(fifo, "through the pipe", "--out");
  reader.join();
  CHECK(got == "through the pipe");
  CHECK(fs::is_fifo(fifo));
  CHECK(temporaries(d.path) == 0);
}

TEST_CASE("atomic writer: symlinks are followed, dangling ones included; the link stays a link") {
  TempDir d;
  spit(d / "real.json", "old");
  fs::create_symlink("real.json", d.path / "link.json");
  io::write_atomic(d / "link.json", "new", "--out");
  CHECK(fs::is_symlink(d.path / "link.json"));
  CHECK(slurp(d.path / "real.json") == "new");
  fs::create_directories(d.path / "sub");
  fs::create_symlink("sub/created.json", d.path / "dangling.json");
  io::write_atomic(d / "dangling.json", "made", "--out");
  CHECK(fs::is_symlink(d.path / "dangling.json"));
  CHECK(slurp(d.path / "sub" / "created.json") == "made");
  CHECK(temporaries(d.path) == 0);
  CHECK(temporaries(d.path / "sub") == 0);
}

TEST_CASE("atomic writer: concurrent writers of one path, a reader always sees one whole file") {
  TempDir d;
  const std::string f = d / "shared.json";
  constexpr int kWriters = 4, kRounds = 60;
  // Each writer's content is long and self-identifying, so a mix of two would show.
  const auto content = [](int w, int r) {
    return fmt::format("{{\"writer\": {}, \"round\": {}, \"pad\": \"{}\"}}\n", w, r,
                       std::string(static_cast<std::size_t>(20000 + 997 * w), static_cast<char>('a' + w)));
  };
  io::write_atomic(f, content(0, -1), "--out");
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, reads{0};
  std::thread reader([&] {
    while (!stop) {
      const std::string s = slurp(f);
      const auto j = nlohmann::json::parse(s, nullptr, false);
      if (j.is_discarded() || s != content(j["writer"].get<int>(), j["round"].get<int>())) ++bad;
      ++reads;
    }
  });
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWriters; ++w)
    writers.emplace_back([&, w] {
      for (int r = 0; r < kRounds; ++r) {
        try {
          io::write_atomic(f, content(w, r), "--out");
        } catch (const std::exception&) {
          ++failures;
        }
      }
    });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  CHECK(failures == 0);
  CHECK(bad == 0);
  CHECK(reads > 0);
  const auto last = nlohmann::json::parse(slurp(f));
  CHECK(last["round"] == kRounds - 1);
  CHECK(temporaries(d.path) == 0);
}

TEST_CASE("an output that is an input is refused, whatever its name") {
  TempDir d;
  spit(d / "cfg.json", "{}");
  const std::vector<std::pair<std::string, std::string>> inputs = {{"--ds-config", d / "cfg.json"}, {"--model", ""}};
  std::string e = input_error([&] { io::refuse_same_file(d / "cfg.json", "--out", inputs); });
  CHECK(e == fmt::format("{}: --out: is the same file as the input --ds-config {}; writing it would replace that input",
                         d / "cfg.json", d / "cfg.json"));
  fs::create_hard_link(d.path / "cfg.json", d.path / "hard.json");
  CHECK(contains(input_error([&] { io::refuse_same_file(d / "hard.json", "--out", inputs); }), "same file"));
  fs::create_symlink("cfg.json", d.path / "soft.json");
  CHECK(contains(input_error([&] { io::refuse_same_file(d / "soft.json", "--trace", inputs); }), "--trace"));
  const std::string roundabout = (d.path / ".." / d.path.filename() / "cfg.json").string();
  CHECK(contains(input_error([&] { io::refuse_same_file(roundabout, "--out", inputs); }), "same file"));
  // Another file, a file not there yet, a device: not refused.
  spit(d / "other.json", "{}");
  CHECK(input_error([&] { io::refuse_same_file(d / "other.json", "--out", inputs); }).empty());
  CHECK(input_error([&] { io::refuse_same_file(d / "new.json", "--out", inputs); }).empty());
  CHECK(input_error([&] { io::refuse_same_file("/dev/null", "--out", {{"--ds-config", "/dev/null"}}); }).empty());
}
