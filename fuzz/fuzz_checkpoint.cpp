// libFuzzer target: the checkpoint loader (exec/checkpoint.cpp) on files it must not trust.
//
// An input is one selector byte and a body. Selector 0 / 1: the body replaces rank 0's
// model_states / optim_states file of a valid two-file checkpoint of step 3; selector 2:
// the body is the text of `latest`. load_checkpoint then runs with fixed expectations.
// Bad input must surface as zp::InputError; any other exception or a sanitizer report is
// a bug; a successful load must restore exactly the blob bytes the files carry.
//
// Byte-level mutations of a checkpoint almost never get past its header CRC, so the
// structure-aware mutator (end of the file) parses the file, changes one node of its
// JSON header (a meta field, a blob entry: name, size, offset, CRC) or some blob bytes,
// then recomputes what a writer would: header length, header CRC, and (usually) the blob
// CRCs, so the meta and blob-table checks behind them are reached.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <boost/crc.hpp>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "exec/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;
namespace ex = zp::exec;
using nlohmann::json;

const std::vector<std::string>& fuzz_keys() {
  static const std::vector<std::string> k{"format", "version", "kind", "tag", "save_id", "meta", "blobs", "model",
                                          "config_digest", "model_digest", "config", "model_config", "run_id",
                                          "stage", "world_size", "rank", "step", "seed", "extra", "name", "bytes",
                                          "offset", "crc32", "losses", "scaler"};
  return k;
}

const std::vector<json>& fuzz_values() {
  static const std::vector<json> v{
      0, 1, -1, 2, 3, 4, 64, 128, 256, 1000, std::numeric_limits<std::int64_t>::max(),
      std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::uint64_t>::max(), 1.5, 1e300, -1e300, true,
      false, nullptr, "", "model_states", "optim_states", "global_step3", "global_step4", "global_step", "../x",
      "zeroplan-checkpoint", "gpt2-tiny", "params", "empty", "master_partition", "optimizer_state", "00000000",
      "ffffffff", "zzzzzzzz", "0123456789abcdef", json::array(), json::object(),
      json::array({json{{"name", "params"}, {"bytes", 64}, {"offset", 0}, {"crc32", "00000000"}}})};
  return v;
}

// ---- the file layout (the fixture and the mutator) (see the top of exec/checkpoint.cpp)

std::uint32_t crc32_of(const void* data, std::size_t n) {
  boost::crc_32_type crc;
  crc.process_bytes(data, n);
  return static_cast<std::uint32_t>(crc.checksum());
}

void put_le32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xffu);
}

std::uint32_t get_le32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

struct Parsed {
  json header;
  std::string blobs;  // the blob section
  std::string footer;
};

bool parse_file(const std::string& f, Parsed& out) {
  if (f.size() < 24) return false;
  const std::size_t h = get_le32(f, 8);
  if (16 + h + 8 > f.size()) return false;
  try {
    out.header = json::parse(f.substr(12, h));
  } catch (const json::exception&) {
    return false;
  }
  out.blobs = f.substr(16 + h, f.size() - 16 - h - 8);
  out.footer = f.substr(f.size() - 8);
  return true;
}

std::string build_file(const std::string& magic, Parsed p, bool fix_blob_crcs) {
  if (fix_blob_crcs && p.header.contains("blobs") && p.header["blobs"].is_array()) {
    std::size_t at = 0;
    for (auto& b : p.header["blobs"]) {
      if (!b.is_object() || !b.contains("bytes") || !b["bytes"].is_number_integer()) break;
      const auto n = b["bytes"].get<std::int64_t>();
      if (n < 0 || static_cast<std::size_t>(n) > p.blobs.size() - at) break;
      char hex[9];
      std::snprintf(hex, sizeof hex, "%08x", crc32_of(p.blobs.data() + at, static_cast<std::size_t>(n)));
      b["crc32"] = hex;
      at += static_cast<std::size_t>(n);
    }
  }
  const std::string text = p.header.dump();
  std::string f = magic + std::string(4, '\0') + text + std::string(4, '\0') + p.blobs + p.footer;
  put_le32(f, 8, static_cast<std::uint32_t>(text.size()));
  put_le32(f, 12 + text.size(), crc32_of(text.data(), text.size()));
  return f;
}


// The fixed run: blob sizes, meta and the seed state the valid checkpoint holds.
struct Fixture {
  fs::path dir;
  std::vector<unsigned char> params = std::vector<unsigned char>(64), master = std::vector<unsigned char>(128),
                             optim = std::vector<unsigned char>(256);
  ex::CheckpointMeta meta;
  std::string model_file, optim_file, latest_text;

  Fixture() {
    dir = fs::temp_directory_path() / ("zp_fuzz_ckpt_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::mt19937 gen(7);
    for (auto* v : {&params, &master, &optim})
      for (auto& b : *v) b = static_cast<unsigned char>(gen());
    meta.model = "gpt2-tiny";
    meta.config = json{{"zero_optimization", {{"stage", 2}}}};
    meta.config_digest = "0011223344556677";
    meta.model_config = json{{"model_type", "gpt2"}, {"n_head", 4}};
    meta.model_digest = "8899aabbccddeeff";
    meta.run_id = "0123456789abcdef";
    meta.stage = 2;
    meta.world_size = 1;
    meta.rank = 0;
    meta.step = 3;
    meta.seed = 1234;
    meta.extra = {{"losses", {1.5, 1.25, 1.0}}};
    std::vector<unsigned char> empty;
    const ex::CheckpointBlob mb[] = {{"params", params.data(), 64}, {"empty", empty.data(), 0}};
    const ex::CheckpointBlob ob[] = {{"master_partition", master.data(), 128}, {"optimizer_state", optim.data(), 256}};
    ex::save_checkpoint(dir.string(), meta, mb, ob);
    ex::write_latest(dir.string(), 3);
    model_file = ex::checkpoint_path(dir.string(), "global_step3", 0, ex::CheckpointPart::model_states);
    optim_file = ex::checkpoint_path(dir.string(), "global_step3", 0, ex::CheckpointPart::optim_states);
    // A save draws a random save_id; a fixed one keeps the seeds valid from run to run.
    for (const auto& f : {model_file, optim_file}) {
      const std::string text = read(f);
      Parsed p;
      if (!parse_file(text, p)) std::abort();
      p.header["save_id"] = "00112233445566778899aabb";
      write(f, build_file(text.substr(0, 8), p, false));
    }
    model_text = read(model_file);
    optim_text = read(optim_file);
    latest_text = read((dir / "latest").string());
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write(const std::string& p, const std::string& s) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
  }
  // Puts the valid checkpoint back, then the fuzzed piece in its place.
  void stage(int selector, const std::string& body) const {
    write(model_file, selector == 0 ? body : model_text);
    write(optim_file, selector == 1 ? body : optim_text);
    write((dir / "latest").string(), selector == 2 ? body : latest_text);
  }
  std::string model_text, optim_text;
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: %s\n", what);
  std::abort();
}

}  // namespace

// With ZEROPLAN_FUZZ_WRITE_SEEDS=DIR, writes the three seeds of the valid checkpoint
// (selector + model_states file, selector + optim_states file, selector + `latest`) to DIR.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* out = std::getenv("ZEROPLAN_FUZZ_WRITE_SEEDS");
  if (out == nullptr) return 0;
  const Fixture& fx = fixture();
  fs::create_directories(out);
  Fixture::write((fs::path(out) / "valid_model_states").string(), std::string(1, '\0') + fx.model_text);
  Fixture::write((fs::path(out) / "valid_optim_states").string(), std::string(1, '\1') + fx.optim_text);
  Fixture::write((fs::path(out) / "valid_latest").string(), std::string(1, '\2') + fx.latest_text);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const Fixture& fx = fixture();
  const int selector = data[0] % 3;
  fx.stage(selector, std::string(reinterpret_cast<const char*>(data + 1), size - 1));

  std::vector<unsigned char> params(64), empty, master(128), optim(256);
  const ex::CheckpointBlob mb[] = {{"params", params.data(), 64}, {"empty", empty.data(), 0}};
  const ex::CheckpointBlob ob[] = {{"master_partition", master.data(), 128}, {"optimizer_state", optim.data(), 256}};
  ex::CheckpointMeta expect = fx.meta;
  expect.step = 0;
  try {
    const ex::CheckpointMeta got = ex::load_checkpoint(fx.dir.string(), expect, mb, ob);
    // Loaded: what was restored is what the files carry (their CRCs matched); the fixed
    // model and config identity held.
    if (got.model != fx.meta.model || got.config_digest != fx.meta.config_digest || got.world_size != 1 || got.rank != 0)
      bug("a checkpoint of another identity was accepted");
  } catch (const zp::InputError& e) {
    const std::string what = e.what();
    if (what.find('\n') != std::string::npos) bug("a refusal spans two lines");
  }
  return 0;
}

#define ZEROPLAN_FUZZ_OWN_MUTATOR
#include "fuzz/json_mutator.hpp"

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  std::mt19937 rng(seed);
  if (size < 2 || data[0] % 3 == 2 || rng() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  const std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  Parsed p;
  if (!parse_file(file, p)) return LLVMFuzzerMutate(data, size, max_size);
  switch (rng() % 4) {
    case 0:
    case 1: {
      JsonMutator m(static_cast<unsigned>(rng()), fuzz_keys(), fuzz_values());
      m.mutate(p.header);
      break;
    }
    case 2:
      if (!p.blobs.empty()) p.blobs[rng() % p.blobs.size()] ^= static_cast<char>(1u << (rng() % 8));
      break;
    default:
      if (rng() % 2 && !p.blobs.empty()) p.blobs.resize(rng() % p.blobs.size());
      else p.blobs += std::string(1 + rng() % 16, static_cast<char>(rng()));
      break;
  }
  const std::string out = std::string(1, static_cast<char>(data[0])) + build_file(file.substr(0, 8), p, rng() % 4 != 0);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
