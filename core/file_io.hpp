#pragma once
// Reading inputs with a size cap, and writing every output the project writes.
//
// Inputs: read_capped reads a file whole, refusing a directory, and anything longer than
// the reader's cap (so /dev/zero or /dev/urandom given as a config ends at once with one
// line instead of filling memory).
//
// Outputs: AtomicWriter is the one way an output reaches its path.
//   - a regular file, or a path that does not exist yet (also through symlinks, dangling
//     ones included): written to a unique temporary in the target's own directory
//     (".NAME.tmp-XXXXXX", mkstemp), fsync'ed, renamed over the target, the directory
//     fsync'ed. Readers see the old file or the new one, never a mix; of concurrent
//     writers, the last rename wins whole. The temporary is removed on every failure.
//     A new file gets mode 0666 & ~umask, a replaced one keeps its mode.
//   - a character device, FIFO or socket (/dev/null, /dev/stdout on a terminal or pipe,
//     a named pipe): written through, never replaced.
//   - the file this process's stdout or stderr already writes to (`--out /dev/stdout`
//     with stdout redirected to a file): written through that stream.
//   - a directory, a symlink loop, an unwritable place: InputError, one line, and nothing
//     is left behind.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zp::io {

// Caps: a DeepSpeed or model config.json is a few KB; a cluster description or an NCCL
// topology dump some 10 KB; measurement and prediction documents grow with the number of
// events of the step program.
constexpr std::int64_t kConfigMaxBytes = std::int64_t{8} << 20;   // ds_config, model config, cluster JSON/XML
constexpr std::int64_t kDocumentMaxBytes = std::int64_t{256} << 20; // simulate --json, train --out

// The whole file. Refuses (InputError naming `path`) a directory, a file that cannot be
// opened or read, and one of more than `max_bytes` ("more than 8 MiB: too large for
// <what>"; `what` with its article: "a model config.json").
std::string read_capped(const std::string& path, std::int64_t max_bytes, std::string_view what);

// Where and how an output is written (see the top of this file).
class AtomicWriter {
 public:
  // `flag`: the option that named the path ("--out"), for messages. Opens the temporary
  // (or the special file); InputError when the path cannot be written.
  AtomicWriter(std::string path, std::string flag);
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter();  // not committed: the temporary is removed

  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Rewrites bytes already written (a header's checksum). Only for regular targets
  // (std::logic_error otherwise: callers that need it write regular files only).
  void write_at(const void* data, std::size_t n, std::int64_t offset);
  // fsync, rename into place, fsync of the directory (regular targets); a flush for the
  // others. After commit the writer is done; a second commit is a logic_error.
  void commit();

  // Whether the target is replaced by rename (false: written through in place).
  bool replaces() const { return fd_ >= 0 && !tmp_.empty(); }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const;
  std::string path_, flag_;
  std::string final_;  // the regular file that is replaced (symlinks resolved)
  std::string tmp_;    // the temporary, while it exists
  int fd_ = -1;
  bool owns_fd_ = true;  // false: this process's stdout/stderr
  bool committed_ = false;
};

// Writes `content` to `path` as AtomicWriter does.
void write_atomic(const std::string& path, std::string_view content, const std::string& flag);

// Refuses (InputError naming `flag` and the input) an output that is the same file as an
// input: the same device and inode once symlinks are followed, whatever the names. Only
// regular files count (a terminal may be both stdin and stdout). Inputs: (flag, path);
// empty paths and paths that do not exist are skipped.
void refuse_same_file(const std::string& output, const std::string& flag,
                      const std::vector<std::pair<std::string, std::string>>& inputs);

}  // namespace zp::io
