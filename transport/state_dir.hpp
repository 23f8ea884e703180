#pragma once
/// The node's state directory: identity key, mesh credential, endpoint file.
#include <filesystem>
#include <memory>

#include "base/error.hpp"

namespace mesh::transport {

/// Makes sure `dir` is fit to hold secrets: creates it (and missing parents) with mode 0700 when
/// absent; refuses a `dir` that is a symbolic link (whoever can change the link chooses where
/// the node's key and mesh secret are read and written), that is no directory, or that others
/// may write to (they could swap the key files). Errors are invalid_argument or io_error with
/// a sentence naming the directory and what to do.
expected<void> prepare_state_dir(const std::filesystem::path& dir);

/// An exclusive lock on `<state dir>/lock` for as long as a node runs (flock: released by the
/// kernel when the process ends, even by SIGKILL, so a crashed node never blocks its restart).
/// One node per state directory: two would share one identity and overwrite each other's
/// endpoint file and mesh token.
class state_dir_lock {
 public:
  /// Takes the lock or says which process holds it (invalid_argument), without waiting.
  static expected<std::shared_ptr<state_dir_lock>> take(const std::filesystem::path& dir);
  ~state_dir_lock();
  state_dir_lock(const state_dir_lock&) = delete;
  state_dir_lock& operator=(const state_dir_lock&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  state_dir_lock(std::filesystem::path dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::filesystem::path dir_;
  int fd_ = -1;
};

}  // namespace mesh::transport
