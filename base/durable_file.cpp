#include "base/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mesh {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

expected<void> sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_error(error_code::io_error, "cannot open directory " + dir.string() + " to sync it: " + errno_text());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) return make_error(error_code::io_error, "cannot sync directory " + dir.string() + ": " + why);
  return {};
}

expected<void> write_file_durably(const std::filesystem::path& path, std::span<const char> bytes, mode_t mode) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  ::unlink(tmp.c_str());  // a leftover of a crash in the middle of an earlier write
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return make_error(error_code::io_error, "cannot create " + tmp.string() + ": " + errno_text());
  ::fchmod(fd, mode);  // the umask may have removed bits the caller asked for
  const auto fail = [&](const std::string& what) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    return make_error(error_code::io_error, "cannot " + what + " " + tmp.string() + ": " + why);
  };
  size_t put = 0;
  while (put < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + put, bytes.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write");
    put += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("flush");
  if (::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    return make_error(error_code::io_error, "cannot close " + tmp.string() + ": " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    return make_error(error_code::io_error, "cannot rename " + tmp.string() + " to " + path.string() + ": " + why);
  }
  return sync_directory(path.parent_path());
}

}  // namespace mesh
