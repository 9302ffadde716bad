// Checkpoints: round trip, `latest`, and every way a checkpoint can be unusable
// (missing, truncated, corrupted, another version, another run's identity or blob
// table, another world size), each answered with one InputError naming the file;
// an interrupted save leaves the previous checkpoint loadable and no temporary files.
#include "exec/checkpoint.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/crc.hpp>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "core/json_util.hpp"
#include "test_util.hpp"

using zp::exec::CheckpointBlob;
using zp::exec::CheckpointMeta;
using zp::exec::CheckpointPart;
using zp::test::input_error;
namespace fs = std::filesystem;
namespace ex = zp::exec;

namespace {

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / fmt::format("zp_ckpt_{}_{}", ::getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen() & 0xffu);
  return v;
}

// The state of one rank: model blobs (16-bit params) and optimizer blobs.
struct State {
  std::vector<unsigned char> params, empty, master, optim;
  State(std::uint32_t seed, std::size_t params_bytes = 1000, std::size_t master_bytes = 4099,
        std::size_t optim_bytes = 8198)
      : params(random_bytes(params_bytes, seed)),
        master(random_bytes(master_bytes, seed + 1)),
        optim(random_bytes(optim_bytes, seed + 2)) {}
  State(const State& shape, int) : params(shape.params.size()), master(shape.master.size()), optim(shape.optim.size()) {}
  std::vector<CheckpointBlob> model() {
    return {{"params", params.data(), static_cast<std::int64_t>(params.size())},
            {"empty", empty.data(), 0}};
  }
  std::vector<CheckpointBlob> optimizer() {
    return {{"master_partition", master.data(), static_cast<std::int64_t>(master.size())},
            {"optimizer_state", optim.data(), static_cast<std::int64_t>(optim.size())}};
  }
  // Same shape, zeroed.
  State zeroed() const { return State(*this, 0); }
  bool operator==(const State& o) const { return params == o.params && master == o.master && optim == o.optim; }
};

CheckpointMeta meta_of(std::int64_t step, int rank = 0, int world = 1) {
  CheckpointMeta m;
  m.model = "gpt2-tiny";
  m.config_digest = ex::config_digest(R"({"zero_optimization": {"stage": 2}})");
  m.stage = 2;
  m.world_size = world;
  m.rank = rank;
  m.step = step;
  m.seed = 0xfeedfacecafebeefull;
  m.extra = {{"losses", {10.5, 9.25, 8.0}}, {"note", "ok"}};
  return m;
}

void save(const TempDir& d, const CheckpointMeta& m, State& s) {
  ex::save_checkpoint(d.str(), m, s.model(), s.optimizer());
}

CheckpointMeta load(const TempDir& d, const CheckpointMeta& expect, State& into, const std::string& tag = "") {
  return ex::load_checkpoint(d.str(), expect, into.model(), into.optimizer(), tag);
}

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Offset of the first blob byte: 8 magic + 4 length + header + 4 CRC.
std::size_t data_start(const std::vector<char>& f) {
  std::uint32_t h = 0;
  for (int i = 3; i >= 0; --i) h = (h << 8) | static_cast<unsigned char>(f[static_cast<std::size_t>(8 + i)]);
  return 16 + h;
}

// Temporaries of the atomic writer (".NAME.tmp-XXXXXX") anywhere under `dir`.
int temp_files(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("checkpoint: round trip restores every byte and returns the saved meta") {
  TempDir d;
  State s(1, 1000, 4099, (std::size_t{4} << 20) + 3);  // one blob spans several I/O chunks
  save(d, meta_of(7), s);
  CHECK_FALSE(ex::has_checkpoint(d.str()));  // no `latest` yet
  ex::write_latest(d.str(), 7);
  CHECK(ex::has_checkpoint(d.str()));
  CHECK(fs::is_regular_file(ex::checkpoint_path(d.str(), "global_step7", 0, CheckpointPart::optim_states)));
  CHECK(fs::is_regular_file(d.path / "global_step7" / "zero_pp_rank_0_mp_rank_00_model_states.zpck"));
  CHECK(temp_files(d.path) == 0);

  State got = s.zeroed();
  CHECK_FALSE(got == s);
  const CheckpointMeta m = load(d, meta_of(0), got);
  CHECK(got == s);
  CHECK(m.step == 7);
  CHECK(m.seed == 0xfeedfacecafebeefull);
  CHECK(m.extra == meta_of(7).extra);
  CHECK(m.model == "gpt2-tiny");
  CHECK(m.world_size == 1);
}

// Blobs in memory the host must not read directly (a GPU's): here host memory holding each
// byte XOR 0x5A, reachable only through the blob's BlobMemory, which counts its calls.
TEST_CASE("checkpoint: blobs in a device's memory are written and restored through it, a chunk at a time") {
  TempDir d;
  State plain(3, 1000, 4099, (std::size_t{4} << 20) * 2 + 17);  // three I/O chunks in one blob
  constexpr unsigned char kMask = 0x5A;
  std::size_t to_host_calls = 0, from_host_calls = 0, largest = 0;
  ex::BlobMemory device;
  device.to_host = [&](void* host, const void* data, std::size_t n) {
    ++to_host_calls;
    largest = std::max(largest, n);
    for (std::size_t i = 0; i < n; ++i)
      static_cast<unsigned char*>(host)[i] = static_cast<const unsigned char*>(data)[i] ^ kMask;
  };
  device.from_host = [&](void* data, const void* host, std::size_t n) {
    ++from_host_calls;
    largest = std::max(largest, n);
    for (std::size_t i = 0; i < n; ++i)
      static_cast<unsigned char*>(data)[i] = static_cast<const unsigned char*>(host)[i] ^ kMask;
  };
  const auto masked = [&](const State& s) {
    State m = s.zeroed();
    for (auto [from, to] : {std::pair{&s.params, &m.params}, {&s.master, &m.master}, {&s.optim, &m.optim}})
      for (std::size_t i = 0; i < from->size(); ++i) (*to)[i] = (*from)[i] ^ kMask;
    return m;
  };
  // The optimizer's blobs on the device, the params in host memory (as offloaded ones are).
  State on_device = masked(plain);
  auto optim = on_device.optimizer();
  for (auto& b : optim) b.memory = &device;
  ex::save_checkpoint(d.str(), meta_of(4), on_device.model(), optim);
  ex::write_latest(d.str(), 4);
  CHECK(to_host_calls == 1 + 3);  // master (one chunk), the state (three)
  CHECK(largest == std::size_t{4} << 20);

  // What the file holds is the device's values, not its raw bytes: a host-memory load of the
  // optimizer's blobs gets the plain state; the params were host memory all along.
  State got = plain.zeroed();
  load(d, meta_of(0), got);
  CHECK(got.master == plain.master);
  CHECK(got.optim == plain.optim);
  CHECK(got.params == on_device.params);

  // And restored onto the device through it.
  State back = plain.zeroed();
  auto optim_back = back.optimizer();
  for (auto& b : optim_back) b.memory = &device;
  ex::load_checkpoint(d.str(), meta_of(0), back.model(), optim_back);
  CHECK(from_host_calls == 1 + 3);
  CHECK(back.master == on_device.master);
  CHECK(back.optim == on_device.optim);
  CHECK(back.params == on_device.params);
}

TEST_CASE("checkpoint: latest names the newest; an explicit tag loads an older one") {
  TempDir d;
  State a(10), b(20);
  save(d, meta_of(10), a);
  ex::write_latest(d.str(), 10);
  save(d, meta_of(20), b);
  ex::write_latest(d.str(), 20);
  std::ifstream in(d.path / "latest");
  std::string tag;
  std::getline(in, tag);
  CHECK(tag == "global_step20");

  State got = a.zeroed();
  CHECK(load(d, meta_of(0), got).step == 20);
  CHECK(got == b);
  CHECK(load(d, meta_of(0), got, "global_step10").step == 10);
  CHECK(got == a);
  CHECK(contains(input_error([&] { load(d, meta_of(0), got, "global_step30"); }), "missing"));
}

TEST_CASE("checkpoint: a truncated file is refused, naming the file") {
  TempDir d;
  State s(3);
  save(d, meta_of(5), s);
  ex::write_latest(d.str(), 5);
  const fs::path file = ex::checkpoint_path(d.str(), "global_step5", 0, CheckpointPart::optim_states);
  const auto original = read_all(file);
  const std::size_t start = data_start(original);
  const std::vector<std::size_t> cuts = {0, 4, 10, 20, start - 2, start + 100, start + 4099 + 17,
                                         original.size() - 8, original.size() - 1};
  for (const std::size_t cut : cuts) {
    CAPTURE(cut);
    write_all(file, std::vector<char>(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(cut)));
    State got = s.zeroed();
    const std::string e = input_error([&] { load(d, meta_of(0), got); });
    CHECK(contains(e, "truncated"));
    CHECK(contains(e, file.string()));
    CHECK(contains(e, fmt::format("found {}", cut)));
  }
  // Cut inside a blob: the message gives the full expected size.
  write_all(file, std::vector<char>(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(start + 100)));
  State got = s.zeroed();
  CHECK(contains(input_error([&] { load(d, meta_of(0), got); }),
                 fmt::format("truncated (expected {} bytes, found {})", original.size(), start + 100)));
  write_all(file, original);
  CHECK(load(d, meta_of(0), got).step == 5);
}

TEST_CASE("checkpoint: a flipped byte is detected as corruption") {
  TempDir d;
  State s(4);
  save(d, meta_of(5), s);
  ex::write_latest(d.str(), 5);
  const fs::path file = ex::checkpoint_path(d.str(), "global_step5", 0, CheckpointPart::optim_states);
  const auto original = read_all(file);
  const std::size_t start = data_start(original);
  const auto flip = [&](std::size_t at) {
    auto bytes = original;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
    write_all(file, bytes);
    State got = s.zeroed();
    return input_error([&] { load(d, meta_of(0), got); });
  };
  std::string e = flip(start + 17);  // first blob
  CHECK(contains(e, "corrupted (CRC mismatch in blob master_partition)"));
  CHECK(contains(e, file.string()));
  e = flip(start + 4099 + 5000);  // second blob
  CHECK(contains(e, "CRC mismatch in blob optimizer_state"));
  e = flip(30);  // header text
  CHECK(contains(e, "corrupted (CRC mismatch in the header)"));
  CHECK(contains(e, file.string()));
  e = flip(start - 2);  // header CRC
  CHECK(contains(e, "CRC mismatch in the header"));
  e = flip(9);  // header length
  CHECK(contains(e, file.string()));
  CHECK_FALSE(e.empty());
  e = flip(original.size() - 3);  // footer
  CHECK(contains(e, "corrupted (bad end marker)"));
  e = flip(1);  // magic
  CHECK(contains(e, "not a zeroplan checkpoint"));

  auto bytes = original;  // another format version
  bytes[7] = '2';
  write_all(file, bytes);
  State got = s.zeroed();
  CHECK(contains(input_error([&] { load(d, meta_of(0), got); }), "wrong version"));

  bytes = original;  // trailing garbage
  bytes.push_back('x');
  write_all(file, bytes);
  CHECK(contains(input_error([&] { load(d, meta_of(0), got); }), "trailing data"));

  write_all(file, original);
  CHECK(load(d, meta_of(0), got).step == 5);
  CHECK(got == s);
}

TEST_CASE("checkpoint: another world size is refused with both numbers") {
  TempDir d;
  State r0(5), r1(6);
  save(d, meta_of(8, 0, 2), r0);
  save(d, meta_of(8, 1, 2), r1);
  ex::write_latest(d.str(), 8);

  State got = r0.zeroed();
  CHECK(load(d, meta_of(0, 1, 2), got).rank == 1);
  CHECK(got == r1);

  for (int rank : {0, 1, 3}) {
    CAPTURE(rank);
    const std::string e = input_error([&] { load(d, meta_of(0, rank, 4), got); });
    CHECK(contains(e, "written by 2 ranks and this run has 4"));
    CHECK(contains(e, "resharding"));
    CHECK(contains(e, fmt::format("zero_pp_rank_{}_mp_rank_00", rank)));
  }
  const std::string e = input_error([&] { load(d, meta_of(0, 0, 1), got); });
  CHECK(contains(e, "written by 2 ranks and this run has 1"));
}

TEST_CASE("checkpoint: another model, stage, config or blob table is refused") {
  TempDir d;
  State s(7);
  save(d, meta_of(3), s);
  ex::write_latest(d.str(), 3);
  State got = s.zeroed();

  CheckpointMeta m = meta_of(0);
  m.model = "llama-tiny";
  std::string e = input_error([&] { load(d, m, got); });
  CHECK(contains(e, "meta.model"));
  CHECK(contains(e, "gpt2-tiny"));
  CHECK(contains(e, "llama-tiny"));

  m = meta_of(0);
  m.stage = 3;
  e = input_error([&] { load(d, m, got); });
  CHECK(contains(e, "meta.stage"));
  CHECK(contains(e, "stage 2, this run uses stage 3"));

  m = meta_of(0);
  m.config_digest = "";
  e = input_error([&] { load(d, m, got); });
  CHECK(contains(e, "meta.config_digest"));
  CHECK(contains(e, "defaults"));

  // A blob of another size.
  State wrong(7, 1000, 4100, 8198);
  e = input_error([&] { load(d, meta_of(0), wrong); });
  CHECK(contains(e, "blob master_partition size mismatch"));
  CHECK(contains(e, "4099 bytes, this run expects 4100"));
  CHECK(contains(e, "optim_states"));

  // Another blob name or count.
  std::vector<CheckpointBlob> renamed = got.model();
  renamed[0].name = "weights";
  e = input_error([&] { ex::load_checkpoint(d.str(), meta_of(0), renamed, got.optimizer()); });
  CHECK(contains(e, "'params'"));
  CHECK(contains(e, "'weights'"));
  std::vector<CheckpointBlob> fewer = got.model();
  fewer.pop_back();
  e = input_error([&] { ex::load_checkpoint(d.str(), meta_of(0), fewer, got.optimizer()); });
  CHECK(contains(e, "holds 2 blobs (params, empty), this run restores 1 (params)"));

  // Nothing was restored by the refused loads.
  CHECK(got == s.zeroed());
  CHECK(load(d, meta_of(0), got).step == 3);
  CHECK(got == s);
}

TEST_CASE("checkpoint: files of two different saves are not mixed") {
  TempDir a, b;
  State s1(8), s2(9);
  save(a, meta_of(4), s1);
  save(b, meta_of(4), s2);
  ex::write_latest(a.str(), 4);
  const auto optim = [](const TempDir& d) {
    return fs::path(ex::checkpoint_path(d.str(), "global_step4", 0, CheckpointPart::optim_states));
  };
  fs::copy_file(optim(b), optim(a), fs::copy_options::overwrite_existing);
  State got = s1.zeroed();
  const std::string msg = input_error([&] { load(a, meta_of(0), got); });
  CAPTURE(msg);
  CHECK(contains(msg, "same save"));
}

TEST_CASE("checkpoint: an interrupted save leaves the previous checkpoint and no temporary files") {
  TempDir d;
  State old(11), fresh(12);
  save(d, meta_of(10), old);
  ex::write_latest(d.str(), 10);
  const auto previous_loads = [&] {
    State got = old.zeroed();
    CHECK(load(d, meta_of(0), got).step == 10);
    CHECK(got == old);
  };

  SUBCASE("the second file cannot be written (a folder stands at its path)") {
    fs::create_directories(d.path / "global_step20" / "zero_pp_rank_0_mp_rank_00_optim_states.zpck");
    const std::string e = input_error([&] { save(d, meta_of(20), fresh); });
    CHECK(contains(e, "is a directory"));
    CHECK(contains(e, "optim_states.zpck"));
    // The model file was written to its temporary name only, and removed.
    CHECK_FALSE(fs::exists(ex::checkpoint_path(d.str(), "global_step20", 0, CheckpointPart::model_states)));
  }
  SUBCASE("a blob without data, found while writing, over the same step") {
    auto blobs = fresh.optimizer();
    blobs[1].data = nullptr;
    CHECK_THROWS_AS(ex::save_checkpoint(d.str(), meta_of(10), fresh.model(), blobs), std::invalid_argument);
  }
  SUBCASE("a write fails midway (file size limit)") {
    State big(13, 1000, std::size_t{1} << 20, 1000);
    rlimit before{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
    auto* const old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lowered = before;
    lowered.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lowered) == 0);
    std::string e;
    try {
      save(d, meta_of(10), big);
    } catch (const zp::InputError& err) {
      e = err.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, old_handler);
    CHECK(contains(e, "cannot write"));
    CHECK(contains(e, "optim_states.zpck"));
  }
  CHECK(temp_files(d.path) == 0);
  previous_loads();
}

TEST_CASE("checkpoint: nothing to resume from") {
  TempDir d;
  const std::string missing = (d.path / "no-such-dir").string();
  CHECK_FALSE(ex::has_checkpoint(missing));
  State got(1);
  std::string e = input_error([&] { ex::load_checkpoint(missing, meta_of(0), got.model(), got.optimizer()); });
  CHECK(contains(e, "no checkpoint"));
  CHECK(contains(e, missing));

  // `latest` names a step whose files are gone.
  ex::write_latest(d.str(), 3);
  e = input_error([&] { load(d, meta_of(0), got); });
  CHECK(contains(e, "missing"));
  CHECK(contains(e, "global_step3"));
  fs::create_directories(d.path / "global_step3");
  e = input_error([&] { load(d, meta_of(0), got); });
  CHECK(contains(e, "missing"));
  CHECK(contains(e, "zero_pp_rank_0_mp_rank_00_model_states.zpck"));
}

TEST_CASE("checkpoint: config digest") {
  CHECK(ex::config_digest("").size() == 16);
  CHECK(ex::config_digest("{}") != ex::config_digest("{ }"));
  CHECK(ex::config_digest("abc") == ex::config_digest("abc"));
}

TEST_CASE("checkpoint: a file copied from another step's folder is refused") {
  TempDir d;
  State s5(21), s9(22);
  save(d, meta_of(5), s5);
  save(d, meta_of(9), s9);
  ex::write_latest(d.str(), 9);
  // Rank 0's step-5 files copied over its step-9 files.
  for (const auto part : {CheckpointPart::model_states, CheckpointPart::optim_states})
    fs::copy_file(ex::checkpoint_path(d.str(), "global_step5", 0, part), ex::checkpoint_path(d.str(), "global_step9", 0, part),
                  fs::copy_options::overwrite_existing);
  State got = s9.zeroed();
  const std::string e = input_error([&] { load(d, meta_of(0), got); });
  CHECK(contains(e, "zero_pp_rank_0_mp_rank_00_model_states.zpck: holds the state of step 5 (saved as global_step5), "
                    "but lies in global_step9"));
  CHECK(got == s9.zeroed());  // nothing restored
  CHECK(ex::step_of_tag("global_step12") == 12);
  CHECK_FALSE(ex::step_of_tag("global_step"));
  CHECK_FALSE(ex::step_of_tag("global_step1x"));
  CHECK_FALSE(ex::step_of_tag("step12"));
  CHECK(ex::latest_tag(d.str()) == "global_step9");
}

TEST_CASE("checkpoint: another ds_config or model config is refused naming the keys that differ") {
  TempDir d;
  State s(31);
  CheckpointMeta m = meta_of(4);
  m.config = nlohmann::json::parse(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5000},
                                      "optimizer": {"type": "AdamW", "params": {"lr": 0.002}}})");
  m.config_digest = zp::json::digest(m.config);
  m.model_config = nlohmann::json::parse(R"({"model_type": "gpt2", "n_head": 4, "activation_function": "gelu_new"})");
  m.model_digest = zp::json::digest(m.model_config);
  m.run_id = "0123456789abcdef";
  save(d, m, s);
  ex::write_latest(d.str(), 4);
  State got = s.zeroed();

  // The same configs written another way (spacing, key order, 5e3 for 5000) load.
  CheckpointMeta same = m;
  same.config = nlohmann::json::parse(R"({"optimizer": {"params": {"lr": 0.002}, "type": "AdamW"},
                                         "zero_optimization": {"reduce_bucket_size": 5e3, "stage": 2}})");
  same.config_digest = zp::json::digest(same.config);
  const CheckpointMeta back = load(d, same, got);
  CHECK(got == s);
  CHECK(back.run_id == "0123456789abcdef");
  CHECK(back.model_config == m.model_config);

  CheckpointMeta other = m;
  other.config["optimizer"]["params"]["lr"] = 0.003;
  other.config_digest = zp::json::digest(other.config);
  std::string e = input_error([&] { load(d, other, got); });
  CHECK(contains(e, "meta.config_digest: the checkpoint was written with another ds_config: optimizer.params.lr: "
                    "0.002 in the checkpoint vs 0.003 now"));

  other = m;
  other.model_config["n_head"] = 2;
  other.model_config["activation_function"] = "relu";
  other.model_digest = zp::json::digest(other.model_config);
  e = input_error([&] { load(d, other, got); });
  CHECK(contains(e, "meta.model_digest: the model's config.json changed since the checkpoint was written: "
                    "activation_function: \"gelu_new\" in the checkpoint vs \"relu\" now; n_head: 4 in the "
                    "checkpoint vs 2 now"));
}

namespace {

// Replaces a file's JSON header with `edit(header)`, keeping it well formed: the header
// length and CRC are rewritten as a writer would (blob CRCs are left as they were).
void rewrite_header(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  const auto bytes = read_all(file);
  std::uint32_t h = 0;
  for (int i = 3; i >= 0; --i) h = (h << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(8 + i)]);
  nlohmann::json header = nlohmann::json::parse(std::string(bytes.begin() + 12, bytes.begin() + 12 + h));
  edit(header);
  const std::string text = header.dump();
  boost::crc_32_type crc;
  crc.process_bytes(text.data(), text.size());
  const auto le = [](std::uint32_t v) {
    return std::string{static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff), static_cast<char>((v >> 16) & 0xff),
                       static_cast<char>((v >> 24) & 0xff)};
  };
  std::string out(bytes.begin(), bytes.begin() + 8);
  out += le(static_cast<std::uint32_t>(text.size())) + text + le(static_cast<std::uint32_t>(crc.checksum()));
  out.append(bytes.begin() + 16 + h, bytes.end());
  write_all(file, std::vector<char>(out.begin(), out.end()));
}

}  // namespace

TEST_CASE("checkpoint: a header with valid checksums but impossible values is refused, never converted") {
  TempDir d;
  State s(41);
  save(d, meta_of(6), s);
  ex::write_latest(d.str(), 6);
  const auto file = ex::checkpoint_path(d.str(), "global_step6", 0, CheckpointPart::model_states);
  const auto original = read_all(file);
  struct Bad {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const std::vector<Bad> bad = {
      // Found by fuzz_checkpoint: a float outside int's range was converted (undefined behaviour).
      {[](nlohmann::json& h) { h["meta"]["stage"] = 1e300; }, "corrupted header: stage must be an integer in [0, 3], got 1e+300"},
      {[](nlohmann::json& h) { h["meta"]["world_size"] = 4294967297LL; }, "world_size must be an integer in [1, 2147483647]"},
      {[](nlohmann::json& h) { h["meta"]["step"] = -6; }, "step must be an integer in [0, "},
      {[](nlohmann::json& h) { h["meta"]["seed"] = 1.5; }, "seed must be an integer >= 0, got 1.5"},
      {[](nlohmann::json& h) { h["blobs"][0]["bytes"] = 1000.0; }, "bytes must be an integer"},
      {[](nlohmann::json& h) { h["blobs"][0]["crc32"] = "-0000001"; }, "crc32 is not 8 hex digits"},
      {[](nlohmann::json& h) { h["version"] = 1.0e10; }, "version must be an integer"},
      {[](nlohmann::json& h) { h["meta"]["model"] = "two\nlines"; }, "model 'two\\x0alines'"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.expect);
    write_all(file, original);
    rewrite_header(file, b.edit);
    State got = s.zeroed();
    const std::string e = input_error([&] { load(d, meta_of(0), got); });
    CHECK(contains(e, b.expect));
    CHECK(e.find('\n') == std::string::npos);
  }
  write_all(file, original);
  State got = s.zeroed();
  CHECK(load(d, meta_of(0), got).step == 6);
}

TEST_CASE("checkpoint: `latest` naming something other than a folder beside it is refused on one line") {
  TempDir d;
  State s(51);
  save(d, meta_of(2), s);
  // Found by fuzz_checkpoint: a `latest` of binary text with a newline reached the messages raw.
  for (const std::string& text : {std::string("ZPCKPT01\n\x01\x02[[4]]"), std::string("../global_step2"),
                                  std::string("global step2"), std::string("..")}) {
    CAPTURE(text);
    std::ofstream(d.path / "latest", std::ios::binary | std::ios::trunc) << text;
    State got = s.zeroed();
    const std::string e = input_error([&] { load(d, meta_of(0), got); });
    CHECK(contains(e, "is not a checkpoint tag (letters, digits, '.', '_' and '-')"));
    CHECK(e.find('\n') == std::string::npos);
  }
  std::ofstream(d.path / "latest", std::ios::trunc) << "  global_step2\n";
  State got = s.zeroed();
  CHECK(load(d, meta_of(0), got).step == 2);
}
