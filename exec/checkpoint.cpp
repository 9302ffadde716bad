// File format of one checkpoint file (.zpck), all integers little-endian:
//
//   offset        size   content
//   0             8      magic "ZPCKPT01" (the last two characters are the format version)
//   8             4      u32 H: length of the header in bytes
//   12            H      header, JSON (UTF-8):
//                          {"format": "zeroplan-checkpoint", "version": 1,
//                           "kind": "model_states" | "optim_states", "tag": "global_step<N>",
//                           "save_id": "<hex>" (the same in the two files of one save),
//                           "meta": {"model", "config_digest", "stage", "world_size", "rank",
//                                    "step", "seed", "extra"},
//                           "blobs": [{"name", "bytes", "offset", "crc32"}, ...]}
//                        offset: from the first byte of the blob section; crc32: 8 lowercase
//                        hex digits, the CRC-32 (IEEE 802.3) of the blob's bytes
//   12+H          4      u32 CRC-32 of the H header bytes
//   16+H          ΣB     the blobs, back to back, in header order
//   16+H+ΣB       8      footer magic "ZPCKEND1"
//
// The file size is therefore exactly 24 + H + ΣB; anything shorter is truncated.
// A file is written in one pass: the header goes out with placeholder CRCs of fixed
// width, each blob is checksummed as it is written, then the header and its CRC are
// rewritten in place (same length) before the file is fsync'ed and renamed.
#include "exec/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include <boost/crc.hpp>
#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json_util.hpp"

namespace zp::exec {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kMagic = "ZPCKPT01";
constexpr std::string_view kMagicFamily = "ZPCKPT";  // kMagic without its version digits
constexpr std::string_view kFooter = "ZPCKEND1";
constexpr int kVersion = 1;
constexpr std::int64_t kPrefixBytes = 12;            // magic + header length
constexpr std::int64_t kFixedBytes = 24;             // magic + length + header CRC + footer
constexpr std::size_t kChunk = std::size_t{4} << 20; // I/O and checksum granularity
constexpr std::string_view kCrcPlaceholder = "00000000";
constexpr std::int64_t kMaxHeaderBytes = std::int64_t{256} << 20;  // the meta's losses grow with the steps

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

const char* part_name(CheckpointPart p) {
  return p == CheckpointPart::model_states ? "model_states" : "optim_states";
}

std::uint32_t crc32_of(const void* data, std::size_t n) {
  boost::crc_32_type crc;
  crc.process_bytes(data, n);
  return static_cast<std::uint32_t>(crc.checksum());
}

std::array<char, 4> le32(std::uint32_t v) {
  return {static_cast<char>(v & 0xffu), static_cast<char>((v >> 8) & 0xffu),
          static_cast<char>((v >> 16) & 0xffu), static_cast<char>((v >> 24) & 0xffu)};
}

std::uint32_t read_le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

std::string hex32(std::uint32_t v) { return fmt::format("{:08x}", v); }

// An owned POSIX file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes, reporting the error close() returned (0 when none).
  int close_checked() {
    const int r = fd_ >= 0 ? ::close(fd_) : 0;
    const int e = errno;
    fd_ = -1;
    return r == 0 ? 0 : e;
  }

 private:
  int fd_ = -1;
};

// fsync of a directory, so that a rename or creation inside it is durable. Filesystems
// that do not support it (EINVAL) are accepted.
void fsync_dir(const fs::path& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid()) throw InputError(dir.string(), "", fmt::format("cannot open the directory to sync it: {}", errno_text(errno)));
  if (::fsync(d.get()) != 0 && errno != EINVAL)
    throw InputError(dir.string(), "", fmt::format("cannot sync the directory: {}", errno_text(errno)));
}

json meta_to_json(const CheckpointMeta& m) {
  return json{{"model", m.model},        {"config_digest", m.config_digest},
              {"model_digest", m.model_digest}, {"config", m.config},
              {"model_config", m.model_config}, {"run_id", m.run_id},
              {"stage", m.stage},        {"world_size", m.world_size},
              {"rank", m.rank},          {"step", m.step},
              {"seed", m.seed},          {"extra", m.extra}};
}

// A header that parses as JSON but does not hold what a writer writes.
struct CorruptHeader : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An integer field, exactly: a fraction, a string or a value outside [lo, hi] is corruption
// (never converted, truncated or wrapped).
std::int64_t int_field(const json& j, const char* key, std::int64_t lo, std::int64_t hi) {
  const json& v = j.at(key);
  std::optional<std::int64_t> x;
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      x = static_cast<std::int64_t>(v.get<std::uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  }
  if (!x || *x < lo || *x > hi)
    throw CorruptHeader(fmt::format("{} must be an integer in [{}, {}], got {}", key, lo, hi,
                                    zp::json::printable(v.dump())));
  return *x;
}

CheckpointMeta meta_from_json(const json& j) {
  constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
  CheckpointMeta m;
  m.model = j.at("model").get<std::string>();
  m.config_digest = j.at("config_digest").get<std::string>();
  m.stage = static_cast<int>(int_field(j, "stage", 0, 3));
  m.world_size = static_cast<int>(int_field(j, "world_size", 1, kMaxInt));
  m.rank = static_cast<int>(int_field(j, "rank", 0, kMaxInt));
  m.step = int_field(j, "step", 0, std::numeric_limits<std::int64_t>::max());
  const json& seed = j.at("seed");
  if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<std::int64_t>() >= 0))
    throw CorruptHeader(fmt::format("seed must be an integer >= 0, got {}", zp::json::printable(seed.dump())));
  m.seed = seed.get<std::uint64_t>();
  m.extra = j.at("extra");
  // Recorded since run identities were introduced; older files lack them.
  m.model_digest = j.value("model_digest", std::string());
  m.config = j.value("config", json());
  m.model_config = j.value("model_config", json());
  m.run_id = j.value("run_id", std::string());
  return m;
}

void validate_blobs(std::span<const CheckpointBlob> blobs, const char* what) {
  std::set<std::string_view> names;
  for (const auto& b : blobs) {
    if (b.name.empty()) throw std::invalid_argument(fmt::format("checkpoint: a {} blob has an empty name", what));
    if (!names.insert(b.name).second)
      throw std::invalid_argument(fmt::format("checkpoint: {} blob '{}' appears twice", what, b.name));
    if (b.bytes < 0)
      throw std::invalid_argument(fmt::format("checkpoint: {} blob '{}' has a negative size {}", what, b.name, b.bytes));
  }
}

void validate_meta(const CheckpointMeta& m) {
  if (m.world_size < 1) throw std::invalid_argument(fmt::format("checkpoint: world size {} < 1", m.world_size));
  if (m.rank < 0 || m.rank >= m.world_size)
    throw std::invalid_argument(fmt::format("checkpoint: rank {} outside world size {}", m.rank, m.world_size));
  if (m.step < 0) throw std::invalid_argument(fmt::format("checkpoint: negative step {}", m.step));
}

// Writes one file under its temporary name; the caller commits it.
std::unique_ptr<io::AtomicWriter> write_part(const fs::path& path, const std::string& tag, CheckpointPart part,
                                       const std::string& save_id, const CheckpointMeta& meta,
                                       std::span<const CheckpointBlob> blobs) {
  json header{{"format", "zeroplan-checkpoint"}, {"version", kVersion}, {"kind", part_name(part)},
              {"tag", tag}, {"save_id", save_id}, {"meta", meta_to_json(meta)}, {"blobs", json::array()}};
  std::int64_t offset = 0;
  for (const auto& b : blobs) {
    header["blobs"].push_back(json{{"name", b.name}, {"bytes", b.bytes}, {"offset", offset}, {"crc32", kCrcPlaceholder}});
    offset += b.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("checkpoint: the meta cannot be written as JSON: {}", e.what()));
  }
  if (text.size() > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument(fmt::format("checkpoint: header of {} bytes exceeds 4 GiB", text.size()));
  const auto hlen = static_cast<std::uint32_t>(text.size());

  auto file = std::make_unique<io::AtomicWriter>(path.string(), "checkpoint");
  io::AtomicWriter& f = *file;
  if (!f.replaces())
    throw InputError(path.string(), "", "is not a regular file: a checkpoint file is replaced whole, not written through");
  f.write(kMagic);
  f.write(le32(hlen).data(), 4);
  f.write(text);
  f.write(le32(0).data(), 4);  // header CRC, rewritten below
  std::vector<char> staging;
  for (std::size_t i = 0; i < blobs.size(); ++i) {
    const auto& b = blobs[i];
    const BlobMemory* memory = b.memory;
    if (memory) staging.resize(kChunk);
    if (b.bytes > 0 && b.data == nullptr)
      throw std::invalid_argument(fmt::format("checkpoint: {} blob '{}' has {} bytes but no data", part_name(part), b.name, b.bytes));
    boost::crc_32_type crc;
    const char* p = static_cast<const char*>(b.data);
    for (auto left = static_cast<std::size_t>(b.bytes); left > 0;) {
      const std::size_t n = std::min(left, kChunk);
      const char* h = p;
      if (memory) {
        memory->to_host(staging.data(), p, n);
        h = staging.data();
      }
      crc.process_bytes(h, n);
      f.write(h, n);
      p += n;
      left -= n;
    }
    header["blobs"][i]["crc32"] = hex32(static_cast<std::uint32_t>(crc.checksum()));
  }
  f.write(kFooter);

  const std::string final_text = header.dump();
  if (final_text.size() != text.size())  // fixed-width CRCs keep the length
    throw std::logic_error("checkpoint: header length changed when its CRCs were filled in");
  f.write_at(final_text.data(), final_text.size(), kPrefixBytes);
  f.write_at(le32(crc32_of(final_text.data(), final_text.size())).data(), 4, kPrefixBytes + hlen);
  return file;
}

// Pairs the two files of one save: a crash between their renames (re-saving a step
// that already exists) leaves files of two saves, which loading refuses.
std::string new_save_id() {
  std::random_device rd;
  const std::uint64_t hi = rd(), lo = rd();
  const auto now = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}{:08x}", ((hi << 32) | lo) ^ now, static_cast<std::uint32_t>(::getpid()));
}

// ---- reading

struct BlobEntry {
  std::string name;
  std::int64_t bytes = 0;
  std::uint32_t crc = 0;
};

// One checkpoint file whose structure (sizes, header CRC, footer) has been checked.
struct PartFile {
  fs::path path;
  Fd fd;
  std::string tag;  // the tag the file was saved under
  std::string save_id;
  CheckpointMeta meta;
  std::vector<BlobEntry> blobs;
  std::int64_t data_start = 0;
};

[[noreturn]] void bad(const fs::path& p, const std::string& msg) { throw InputError(p.string(), "", msg); }

void read_exact(const PartFile& f, void* dst, std::size_t n, std::int64_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(f.fd.get(), p, std::min(n, kChunk), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      bad(f.path, fmt::format("cannot read: {}", errno_text(errno)));
    }
    if (r == 0) bad(f.path, fmt::format("truncated while reading at byte {}", offset));
    p += r;
    offset += r;
    n -= static_cast<std::size_t>(r);
  }
}

std::string truncated(std::int64_t expected, std::int64_t found, bool at_least) {
  return fmt::format("truncated (expected {}{} bytes, found {})", at_least ? "at least " : "", expected, found);
}

// Opens and checks the structure of a file: magic, version, sizes, header CRC, header
// contents, footer. Blob CRCs are checked when the blobs are read.
PartFile open_part(const fs::path& path, CheckpointPart part) {
  PartFile f;
  f.path = path;
  f.fd = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f.fd.valid()) {
    const int e = errno;
    if (e == ENOENT) bad(path, "missing (no such checkpoint file)");
    bad(path, fmt::format("cannot open: {}", errno_text(e)));
  }
  struct stat st{};
  if (::fstat(f.fd.get(), &st) != 0) bad(path, fmt::format("cannot stat: {}", errno_text(errno)));
  if (!S_ISREG(st.st_mode)) bad(path, "not a regular file");
  const std::int64_t size = st.st_size;

  // Magic: a prefix that does not match is not a checkpoint, whatever its length.
  std::array<unsigned char, kPrefixBytes> prefix{};
  const auto have = static_cast<std::size_t>(std::min<std::int64_t>(size, kPrefixBytes));
  read_exact(f, prefix.data(), have, 0);
  const std::string_view magic(reinterpret_cast<const char*>(prefix.data()), std::min(have, kMagic.size()));
  const std::string_view family = magic.substr(0, std::min(magic.size(), kMagicFamily.size()));
  if (family != kMagicFamily.substr(0, family.size()))
    bad(path, "not a zeroplan checkpoint (bad magic)");
  if (size < kPrefixBytes) bad(path, truncated(kFixedBytes, size, true));
  if (magic != kMagic)
    bad(path, fmt::format("wrong version: format {}, this build reads {}", magic, kMagic));

  const std::int64_t hlen = read_le32(prefix.data() + 8);
  if (kFixedBytes + hlen > size) bad(path, truncated(kFixedBytes + hlen, size, true));
  if (hlen > kMaxHeaderBytes)
    bad(path, fmt::format("corrupted (a header of {} bytes; headers are at most {} MiB)", hlen, kMaxHeaderBytes >> 20));
  std::string text(static_cast<std::size_t>(hlen), '\0');
  read_exact(f, text.data(), text.size(), kPrefixBytes);
  std::array<unsigned char, 4> crc_bytes{};
  read_exact(f, crc_bytes.data(), 4, kPrefixBytes + hlen);
  if (read_le32(crc_bytes.data()) != crc32_of(text.data(), text.size()))
    bad(path, "corrupted (CRC mismatch in the header)");

  json header;
  zp::json::check_depth(path.string(), text);
  try {
    header = json::parse(text);
    if (header.at("format").get<std::string>() != "zeroplan-checkpoint") bad(path, "not a zeroplan checkpoint (header format)");
    if (const auto v = int_field(header, "version", std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max());
        v != kVersion)
      bad(path, fmt::format("wrong version: header version {}, this build reads {}", v, kVersion));
    if (const auto kind = header.at("kind").get<std::string>(); kind != part_name(part))
      bad(path, fmt::format("holds {}, expected {}", zp::json::printable(kind), part_name(part)));
    f.tag = header.at("tag").get<std::string>();
    f.save_id = header.at("save_id").get<std::string>();
    f.meta = meta_from_json(header.at("meta"));
    for (const auto& b : header.at("blobs")) {
      BlobEntry e;
      e.name = b.at("name").get<std::string>();
      e.bytes = int_field(b, "bytes", 0, std::numeric_limits<std::int64_t>::max());
      const auto crc = b.at("crc32").get<std::string>();
      const bool hex = crc.size() == 8 && std::all_of(crc.begin(), crc.end(), [](char c) {
                         return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
                       });
      if (!hex)
        bad(path, fmt::format("corrupted (bad entry for blob {} in the header: crc32 is not 8 hex digits)",
                              zp::json::printable(e.name)));
      e.crc = static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16));
      f.blobs.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    bad(path, fmt::format("corrupted header: {}", zp::json::printable(e.what())));
  } catch (const CorruptHeader& e) {
    bad(path, fmt::format("corrupted header: {}", e.what()));
  }

  f.data_start = kPrefixBytes + hlen + 4;
  std::int64_t expected = kFixedBytes + hlen;
  for (const auto& b : f.blobs) {  // saturating: a corrupted size cannot overflow
    constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
    expected = b.bytes > kMax - expected ? kMax : expected + b.bytes;
  }
  if (expected > size) bad(path, truncated(expected, size, false));
  if (expected < size) bad(path, fmt::format("corrupted (expected {} bytes, found {}: trailing data)", expected, size));
  std::array<char, 8> footer{};
  read_exact(f, footer.data(), footer.size(), size - 8);
  if (std::string_view(footer.data(), footer.size()) != kFooter) bad(path, "corrupted (bad end marker)");
  return f;
}

// This run's identity against the file's.
void check_meta(const PartFile& f, const CheckpointMeta& expect) {
  const auto& m = f.meta;
  if (m.world_size != expect.world_size)
    throw InputError(f.path.string(), "meta.world_size",
                     fmt::format("the checkpoint was written by {} ranks and this run has {}; resharding a checkpoint "
                                 "to another world size is not supported",
                                 m.world_size, expect.world_size));
  if (m.rank != expect.rank)
    throw InputError(f.path.string(), "meta.rank", fmt::format("written by rank {}, read by rank {}", m.rank, expect.rank));
  if (m.model != expect.model)
    throw InputError(f.path.string(), "meta.model",
                     fmt::format("the checkpoint is of model '{}', this run trains '{}'", zp::json::printable(m.model),
                                 expect.model));
  if (m.stage != expect.stage)
    throw InputError(f.path.string(), "meta.stage",
                     fmt::format("the checkpoint was written at ZeRO stage {}, this run uses stage {}", m.stage, expect.stage));
  if (m.config_digest != expect.config_digest) {
    if (m.config.is_object() || expect.config.is_object()) {
      const json was = m.config.is_object() ? m.config : json::object();
      const json now = expect.config.is_object() ? expect.config : json::object();
      throw InputError(f.path.string(), "meta.config_digest",
                       fmt::format("the checkpoint was written with another ds_config{}: {}",
                                   m.config.is_object() && expect.config.is_object() ? ""
                                   : m.config.is_object()                            ? " (this run uses the defaults)"
                                                                                     : " (the checkpoint used the defaults)",
                                   zp::json::describe_differences(was, now, "in the checkpoint", "now")));
    }
    const auto show = [](const std::string& d) { return d.empty() ? std::string("defaults") : zp::json::printable(d); };
    throw InputError(f.path.string(), "meta.config_digest",
                     fmt::format("the checkpoint was written with ds_config {}, this run uses {}", show(m.config_digest),
                                 show(expect.config_digest)));
  }
  if (!m.model_digest.empty() && !expect.model_digest.empty() && m.model_digest != expect.model_digest) {
    const std::string what = m.model_config.is_object() && expect.model_config.is_object()
                                 ? zp::json::describe_differences(m.model_config, expect.model_config,
                                                                  "in the checkpoint", "now")
                                 : fmt::format("digest {} in the checkpoint, {} now", zp::json::printable(m.model_digest), expect.model_digest);
    throw InputError(f.path.string(), "meta.model_digest",
                     fmt::format("the model's config.json changed since the checkpoint was written: {}", what));
  }
}

std::string name_list(const auto& blobs) {
  std::string s;
  for (const auto& b : blobs) s += (s.empty() ? "" : ", ") + zp::json::printable(b.name);
  return s;
}

// The file's blob table against the caller's: same names in the same order, same sizes.
void check_blobs(const PartFile& f, std::span<const CheckpointBlob> want) {
  if (f.blobs.size() != want.size())
    bad(f.path, fmt::format("holds {} blobs ({}), this run restores {} ({})", f.blobs.size(), name_list(f.blobs),
                            want.size(), name_list(want)));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& have = f.blobs[i];
    if (have.name != want[i].name)
      bad(f.path, fmt::format("blob {} is '{}', this run expects '{}'", i, zp::json::printable(have.name), want[i].name));
    if (have.bytes != want[i].bytes)
      bad(f.path, fmt::format("blob {} size mismatch: the checkpoint has {} bytes, this run expects {}", want[i].name,
                              have.bytes, want[i].bytes));
    if (want[i].bytes > 0 && want[i].data == nullptr)
      throw std::invalid_argument(fmt::format("checkpoint: blob '{}' has {} bytes but no data to restore into",
                                              want[i].name, want[i].bytes));
  }
}

void restore(const PartFile& f, std::span<const CheckpointBlob> blobs) {
  std::int64_t offset = f.data_start;
  std::vector<char> staging;
  for (std::size_t i = 0; i < blobs.size(); ++i) {
    const BlobMemory* memory = blobs[i].memory;
    if (memory) staging.resize(kChunk);
    boost::crc_32_type crc;
    char* p = static_cast<char*>(blobs[i].data);
    for (auto left = static_cast<std::size_t>(blobs[i].bytes); left > 0;) {
      const std::size_t n = std::min(left, kChunk);
      char* h = memory ? staging.data() : p;
      read_exact(f, h, n, offset);
      crc.process_bytes(h, n);
      if (memory) memory->from_host(p, h, n);
      p += n;
      offset += static_cast<std::int64_t>(n);
      left -= n;
    }
    if (static_cast<std::uint32_t>(crc.checksum()) != f.blobs[i].crc)
      bad(f.path, fmt::format("corrupted (CRC mismatch in blob {})", blobs[i].name));
  }
}

std::string read_latest(const fs::path& dir) {
  const fs::path latest = dir / "latest";
  Fd fd(::open(latest.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT || errno == ENOTDIR)
      bad(latest, "no checkpoint to resume from (the file naming the newest checkpoint does not exist)");
    bad(latest, fmt::format("cannot open: {}", errno_text(errno)));
  }
  std::string text;
  std::array<char, 256> buf{};
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      bad(latest, fmt::format("cannot read: {}", errno_text(errno)));
    }
    if (r == 0) break;
    text.append(buf.data(), static_cast<std::size_t>(r));
    if (text.size() > 4096) bad(latest, "not a checkpoint tag (too long)");
  }
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) bad(latest, "empty: no checkpoint tag");
  text = text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
  // A tag names a folder next to `latest`: letters, digits, '.', '_' and '-' (DeepSpeed's
  // "global_stepN" or a name the user chose), never a path.
  const bool name_like = std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
  if (!name_like || text == "." || text == "..")
    bad(latest, fmt::format("'{}' is not a checkpoint tag (letters, digits, '.', '_' and '-')", zp::json::printable(text)));
  return text;
}

}  // namespace

std::string checkpoint_tag(std::int64_t step) { return fmt::format("global_step{}", step); }

std::optional<std::int64_t> step_of_tag(std::string_view tag) {
  constexpr std::string_view kPrefix = "global_step";
  if (tag.size() <= kPrefix.size() || tag.substr(0, kPrefix.size()) != kPrefix || tag.size() > kPrefix.size() + 18)
    return std::nullopt;
  std::int64_t v = 0;
  for (const char c : tag.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string latest_tag(const std::string& dir) { return read_latest(dir); }

std::string checkpoint_path(const std::string& dir, const std::string& tag, int rank, CheckpointPart part) {
  return (fs::path(dir) / tag / fmt::format("zero_pp_rank_{}_mp_rank_00_{}.zpck", rank, part_name(part))).string();
}

std::string config_digest(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

void save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                     std::span<const CheckpointBlob> model_blobs,
                     std::span<const CheckpointBlob> optim_blobs) {
  validate_meta(meta);
  validate_blobs(model_blobs, part_name(CheckpointPart::model_states));
  validate_blobs(optim_blobs, part_name(CheckpointPart::optim_states));
  const std::string tag = checkpoint_tag(meta.step);
  const fs::path step_dir = fs::path(dir) / tag;
  std::error_code ec;
  const bool made = fs::create_directories(step_dir, ec);
  if (ec) throw InputError(step_dir.string(), "", fmt::format("cannot create the checkpoint directory: {}", ec.message()));
  if (made) fsync_dir(step_dir.parent_path());
  // Both files are written completely before either replaces an existing one.
  const std::string id = new_save_id();
  auto model = write_part(checkpoint_path(dir, tag, meta.rank, CheckpointPart::model_states), tag,
                          CheckpointPart::model_states, id, meta, model_blobs);
  auto optim = write_part(checkpoint_path(dir, tag, meta.rank, CheckpointPart::optim_states), tag,
                          CheckpointPart::optim_states, id, meta, optim_blobs);
  model->commit();
  optim->commit();
}

void write_latest(const std::string& dir, std::int64_t step) {
  if (step < 0) throw std::invalid_argument(fmt::format("checkpoint: negative step {}", step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir, "", fmt::format("cannot create the checkpoint directory: {}", ec.message()));
  io::AtomicWriter f((fs::path(dir) / "latest").string(), "checkpoint");
  if (!f.replaces())
    throw InputError((fs::path(dir) / "latest").string(), "", "is not a regular file: it is replaced whole, not written through");
  f.write(checkpoint_tag(step));
  f.commit();
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "latest", ec);
}

CheckpointMeta load_checkpoint(const std::string& dir, const CheckpointMeta& expect,
                               std::span<const CheckpointBlob> model_blobs,
                               std::span<const CheckpointBlob> optim_blobs,
                               const std::string& tag) {
  validate_meta(expect);
  validate_blobs(model_blobs, part_name(CheckpointPart::model_states));
  validate_blobs(optim_blobs, part_name(CheckpointPart::optim_states));
  const std::string use_tag = tag.empty() ? read_latest(dir) : tag;
  const fs::path step_dir = fs::path(dir) / use_tag;
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec))
    bad(step_dir, fmt::format("missing: no checkpoint '{}' in {}", zp::json::printable(use_tag), dir));

  const auto open_checked = [&](CheckpointPart part) {
    const fs::path path = checkpoint_path(dir, use_tag, expect.rank, part);
    if (!fs::exists(path, ec) && expect.rank > 0) {
      // A rank with no file: most likely the checkpoint was written by fewer ranks.
      std::optional<PartFile> rank0;
      try {
        rank0 = open_part(checkpoint_path(dir, use_tag, 0, part), part);
      } catch (const InputError&) {
      }
      if (rank0 && rank0->meta.world_size != expect.world_size)
        throw InputError(path.string(), "",
                         fmt::format("missing: the checkpoint was written by {} ranks and this run has {}; resharding "
                                     "a checkpoint to another world size is not supported",
                                     rank0->meta.world_size, expect.world_size));
    }
    PartFile f = open_part(path, part);
    // The file must hold the step its folder names (files copied from another step's
    // folder would resume this rank elsewhere than its peers).
    const auto folder_step = step_of_tag(use_tag);
    if (f.tag != use_tag || (folder_step && f.meta.step != *folder_step))
      bad(f.path, fmt::format("holds the state of step {} (saved as {}), but lies in {}: a file of another step was "
                              "copied or moved here",
                              f.meta.step, zp::json::printable(f.tag), use_tag));
    check_meta(f, expect);
    return f;
  };
  const PartFile model = open_checked(CheckpointPart::model_states);
  const PartFile optim = open_checked(CheckpointPart::optim_states);
  if (model.save_id != optim.save_id || model.meta.step != optim.meta.step)
    bad(optim.path, fmt::format("does not belong to the same save as {} (an interrupted save over an existing "
                                "checkpoint?)", model.path.string()));
  check_blobs(model, model_blobs);
  check_blobs(optim, optim_blobs);
  restore(model, model_blobs);
  restore(optim, optim_blobs);
  return optim.meta;
}

}  // namespace zp::exec
