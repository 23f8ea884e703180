#include "transport/state_dir.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

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

}  // namespace mesh::transport
