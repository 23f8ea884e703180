#include "transport/state_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace mesh::transport {

expected<void> prepare_state_dir(const std::filesystem::path& dir) {
  const std::string name = dir.string();
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return make_error(error_code::io_error, "cannot inspect state directory " + name + ": " + std::strerror(errno));
    std::error_code ec;
    if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
    if (ec) return make_error(error_code::io_error, "cannot create the parent of state directory " + name + ": " + ec.message());
    // Created 0700 from the start: no moment in which others could look in or plant files.
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return make_error(error_code::io_error, "cannot create state directory " + name + ": " + std::strerror(errno));
    if (::lstat(dir.c_str(), &st) != 0)
      return make_error(error_code::io_error, "cannot inspect state directory " + name + ": " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode))
    return make_error(error_code::invalid_argument, "state directory " + name +
                                                        " is a symbolic link; meshnode keeps its key and mesh secret only in a real "
                                                        "directory: pass the link's target as --state-dir");
  if (!S_ISDIR(st.st_mode)) return make_error(error_code::invalid_argument, "state directory " + name + " is not a directory");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return make_error(error_code::invalid_argument, "state directory " + name +
                                                        " may be written by other users, who could replace the node's key or mesh "
                                                        "secret: chmod 700 " + name);
  return {};
}

expected<std::shared_ptr<state_dir_lock>> state_dir_lock::take(const std::filesystem::path& dir) {
  const auto path = dir / "lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(error_code::io_error, "cannot open " + path.string() + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    std::ifstream f(path);
    std::string pid;
    std::getline(f, pid);
    return make_error(error_code::invalid_argument, "another meshnode" + (pid.empty() ? std::string() : " (pid " + pid + ")") +
                                                        " is running with state dir " + dir.string() +
                                                        "; give this one its own --state-dir");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0 && ::write(fd, pid.data(), pid.size()) < 0) {
    // the pid is only for the message above; the lock holds without it
  }
  return std::shared_ptr<state_dir_lock>(new state_dir_lock(dir, fd));
}

state_dir_lock::~state_dir_lock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace mesh::transport
