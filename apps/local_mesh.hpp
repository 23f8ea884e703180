#pragma once
/// Starts meshnode processes on this machine (for the demo and the examples) and stops them.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"

namespace mesh::app {

/// One meshnode child process, its output in <state dir>/node.log.
class node_process {
 public:
  node_process(const std::string& binary, const std::filesystem::path& state_dir, std::vector<std::string> args)
      : dir_(state_dir) {
    std::filesystem::create_directories(dir_);
    // meshnode refuses a state directory others may write to (a umask of 002 would make one).
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    std::filesystem::remove(dir_ / "endpoint");
    args.insert(args.begin(), {binary, "--state-dir", dir_.string()});
    // Everything the child needs is made here: a child of a threaded process may only make
    // async-signal-safe calls before exec (an allocation could wait for ever on a lock another
    // thread held at the fork).
    const std::string log_path = (dir_ / "node.log").string();
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);  // or the child re-prints what the parent had buffered
    const pid_t parent = ::getpid();
    pid_ = log < 0 ? -1 : fork();
    if (pid_ == 0) {
      // The node goes when this process does, however it ends: a crash or SIGKILL runs no
      // destructor that could stop it, and an orphaned node would keep its port and state
      // directory. (The death signal fires when the forking thread exits: nodes are started
      // from threads that live as long as the process.)
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) _exit(0);  // it died before the signal was asked for
      dup2(log, 1);
      dup2(log, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (log >= 0) ::close(log);
  }
  node_process(const node_process&) = delete;
  node_process& operator=(const node_process&) = delete;
  ~node_process() { stop(); }

  /// "id@127.0.0.1:port" once the node listens.
  expected<std::string> endpoint(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream f(dir_ / "endpoint");
      std::string line;
      if (std::getline(f, line) && !line.empty()) return line;
      if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return make_error(error_code::timeout, "meshnode in " + dir_.string() + " did not start; see " + (dir_ / "node.log").string());
  }
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  /// SIGTERM (a clean leave), SIGKILL after 5 s.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

/// The meshnode binary next to this program (they are built together).
inline std::string meshnode_beside(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::filesystem::path self = n > 0 ? std::filesystem::path(std::string(buf, static_cast<size_t>(n))) : std::filesystem::path(argv0);
  return (self.parent_path() / "meshnode").string();
}

}  // namespace mesh::app
