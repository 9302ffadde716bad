#include "core/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"

namespace zp::io {

namespace {

constexpr int kMaxSymlinks = 40;  // as the kernel's ELOOP limit
constexpr std::size_t kChunk = std::size_t{4} << 20;

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string size_text(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30) && bytes % (std::int64_t{1} << 30) == 0)
    return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (std::int64_t{1} << 20) && bytes % (std::int64_t{1} << 20) == 0)
    return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

std::string dirname_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string basename_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// The process's umask, read without changing it (umask(2) would, for every thread).
mode_t current_umask() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Umask:", 0) != 0) continue;
    try {
      return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
    } catch (const std::exception&) {
      break;
    }
  }
  return 022;
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// The file this process's stdout (1) or stderr (2) writes to, when it is `st`; else -1.
int standard_stream_of(const struct stat& st) {
  for (int fd : {1, 2}) {
    struct stat s{};
    if (::fstat(fd, &s) == 0 && same_file(s, st)) return fd;
  }
  return -1;
}

}  // namespace

std::string read_capped(const std::string& path, std::int64_t max_bytes, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) throw InputError(path, "", "cannot open file: no such file");
    throw InputError(path, "", fmt::format("cannot open file: {}", errno_text(e)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw InputError(path, "", fmt::format("cannot read: {}", errno_text(errno)));
  if (S_ISDIR(st.st_mode)) throw InputError(path, "", fmt::format("is a directory, not {}", what));
  const std::string too_large = fmt::format("more than {}: too large for {}", size_text(max_bytes), what);
  if (S_ISREG(st.st_mode) && st.st_size > max_bytes) throw InputError(path, "", too_large);
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<std::size_t>(st.st_size));
  std::array<char, 65536> buf{};
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EISDIR) throw InputError(path, "", fmt::format("is a directory, not {}", what));
      throw InputError(path, "", fmt::format("cannot read: {}", errno_text(errno)));
    }
    if (r == 0) break;
    out.append(buf.data(), static_cast<std::size_t>(r));
    if (static_cast<std::int64_t>(out.size()) > max_bytes) throw InputError(path, "", too_large);
  }
  return out;
}

AtomicWriter::AtomicWriter(std::string path, std::string flag) : path_(std::move(path)), flag_(std::move(flag)) {
  if (path_.empty()) throw InputError(flag_, "", "an empty path is not a file to write");
  struct stat st{};
  mode_t mode = 0666 & ~current_umask();
  if (::stat(path_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw InputError(path_, flag_, "is a directory; give the path of a file to write");
    if (S_ISBLK(st.st_mode)) throw InputError(path_, flag_, "is a block device; give the path of a file to write");
    if (S_ISSOCK(st.st_mode)) throw InputError(path_, flag_, "is a socket; give the path of a file to write");
    if (!S_ISREG(st.st_mode)) {
      // A character device or FIFO: written through, as a shell redirection would.
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd_ < 0) fail("cannot open for writing", errno);
      return;
    }
    if (const int fd = standard_stream_of(st); fd >= 0) {
      std::fflush(nullptr);  // what was printed before goes out first
      fd_ = fd;
      owns_fd_ = false;
      return;
    }
    std::array<char, PATH_MAX> real{};
    if (::realpath(path_.c_str(), real.data()) == nullptr) fail("cannot resolve the path", errno);
    final_ = real.data();
    mode = st.st_mode & 07777;
  } else {
    const int e = errno;
    if (e == ELOOP) throw InputError(path_, flag_, "is a symlink loop");
    if (e != ENOENT) fail("cannot write here", e);
    // Not there yet: the path itself, or where a dangling symlink points.
    final_ = path_;
    for (int hops = 0;; ++hops) {
      struct stat ls{};
      if (::lstat(final_.c_str(), &ls) != 0 || !S_ISLNK(ls.st_mode)) break;
      if (hops == kMaxSymlinks) throw InputError(path_, flag_, "is a symlink loop");
      std::array<char, PATH_MAX> target{};
      const ssize_t n = ::readlink(final_.c_str(), target.data(), target.size() - 1);
      if (n < 0) fail("cannot read the symlink", errno);
      const std::string t(target.data(), static_cast<std::size_t>(n));
      final_ = !t.empty() && t[0] == '/' ? t : dirname_of(final_) + "/" + t;
    }
  }
  const std::string dir = dirname_of(final_);
  std::string tmpl = dir + "/." + basename_of(final_) + ".tmp-XXXXXX";
  fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd_ < 0) {
    const int e = errno;
    throw InputError(path_, flag_, fmt::format("cannot create a file in {}: {}", dir, errno_text(e)));
  }
  tmp_ = tmpl;
  if (::fchmod(fd_, mode) != 0) fail("cannot set the file mode", errno);
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0 && owns_fd_) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicWriter::fail(const std::string& what, int err) const {
  throw InputError(path_, flag_, fmt::format("{}: {}", what, errno_text(err)));
}

void AtomicWriter::write(const void* data, std::size_t n) {
  if (committed_ || fd_ < 0) throw std::logic_error("AtomicWriter: write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min(n, kChunk));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", errno);
    }
    if (w == 0) fail("cannot write", EIO);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void AtomicWriter::write_at(const void* data, std::size_t n, std::int64_t offset) {
  if (tmp_.empty()) throw std::logic_error("AtomicWriter: write_at on a target written through");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, std::min(n, kChunk), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", errno);
    }
    if (w == 0) fail("cannot write", EIO);
    p += w;
    offset += w;
    n -= static_cast<std::size_t>(w);
  }
}

void AtomicWriter::commit() {
  if (committed_ || fd_ < 0) throw std::logic_error("AtomicWriter: committed twice");
  committed_ = true;
  if (tmp_.empty()) {
    const int fd = fd_;
    fd_ = -1;
    if (owns_fd_ && ::close(fd) != 0) fail("cannot write", errno);
    return;
  }
  if (::fsync(fd_) != 0) fail("cannot sync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot write", errno);
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    const int e = errno;
    if (e == EISDIR) throw InputError(path_, flag_, "is a directory; give the path of a file to write");
    fail("cannot rename the temporary file into place", e);
  }
  tmp_.clear();
  // The rename is durable once the directory is; filesystems that cannot sync a
  // directory (EINVAL) are accepted.
  const int d = ::open(dirname_of(final_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  const int rc = ::fsync(d);
  const int e = errno;
  ::close(d);
  if (rc != 0 && e != EINVAL) fail("cannot sync the directory", e);
}

void write_atomic(const std::string& path, std::string_view content, const std::string& flag) {
  AtomicWriter w(path, flag);
  w.write(content);
  w.commit();
}

void refuse_same_file(const std::string& output, const std::string& flag,
                      const std::vector<std::pair<std::string, std::string>>& inputs) {
  struct stat out{};
  if (output.empty() || ::stat(output.c_str(), &out) != 0 || !S_ISREG(out.st_mode)) return;
  for (const auto& [in_flag, in_path] : inputs) {
    struct stat in{};
    if (in_path.empty() || ::stat(in_path.c_str(), &in) != 0 || !S_ISREG(in.st_mode)) continue;
    if (same_file(out, in))
      throw InputError(output, flag,
                       fmt::format("is the same file as the input {} {}; writing it would replace that input", in_flag,
                                   in_path));
  }
}

}  // namespace zp::io
