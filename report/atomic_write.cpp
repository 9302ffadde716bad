#include "report/atomic_write.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace zp::report {

namespace fs = std::filesystem;

namespace {

std::string dir_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

[[noreturn]] void fail(const std::string& flag, const std::string& path, const std::string& why) {
  throw InputError(path, "", fmt::format("{}: cannot write the file: {}", flag, why));
}

}  // namespace

void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) throw InputError(flag, "", "needs a file name");
  const std::string dir = dir_of(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail(flag, path, fmt::format("directory {}: {}", dir, std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) fail(flag, path, fmt::format("{} is not a directory", dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(flag, path, fmt::format("directory {}: {}", dir, std::strerror(errno)));
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(flag, path, S_ISDIR(st.st_mode) ? "it is a directory" : "it is not a regular file");
}

void write_file_atomically(const std::string& path, std::string_view content, const std::string& flag) {
  check_writable(path, flag);
  const std::string dir = dir_of(path);
  const std::string tmpl = fmt::format("{}/.{}.XXXXXX", dir, fs::path(path).filename().string());
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) fail(flag, path, fmt::format("temporary in {}: {}", dir, std::strerror(errno)));
  const std::string tmp(name.data());
  auto abandon = [&](const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(flag, path, why);
  };
  // mkstemp creates 0600; a page is for reading: the usual 0644 less the umask.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0644 & ~mask) != 0) abandon(std::strerror(errno));
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t w = ::write(fd, content.data() + done, content.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      abandon(std::strerror(errno));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) abandon(std::strerror(errno));
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    fail(flag, path, why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    fail(flag, path, why);
  }
  // The rename itself is durable once the directory is.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace zp::report
