#pragma once
// Starts real meshnode processes on loopback for integration tests, and stops them.
#include <algorithm>
#include <catch2/catch.hpp>

#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <fstream>
#include <string>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "client/client.hpp"
#include "transport/join_token.hpp"

namespace mesh::test {

/// The mesh every node of this test process joins (a new one per process, so that concurrent
/// tests never form one mesh by accident).
inline const transport::mesh_credential& test_credential() {
  static const transport::mesh_credential c = transport::new_mesh_credential();
  return c;
}
/// The join token of test_credential().
inline std::string test_token() { return transport::encode_join_token(test_credential()); }
/// Client options of a member of the test mesh.
inline client_options member_options() {
  client_options o;
  o.mesh_secret = test_credential().secret;
  o.mesh_id = test_credential().mesh_id;
  return o;
}

/// Whether this process may give a child a mount namespace of its own (root, or CAP_SYS_ADMIN):
/// what node_process's `hidden` needs.
inline bool can_hide_directories() {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) _exit(unshare(CLONE_NEWNS) == 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// One meshnode child process with its own state directory under a temporary folder. Unless
/// `extra` names a credential (--join, --secret-file, --open) or `join_test_mesh` is false, the
/// node joins the test mesh (--join test_token()). The directories in `hidden` look empty to it
/// (an empty tmpfs over each, in a mount namespace of its own; see can_hide_directories()): a
/// node on the same machine that lacks the files another node has.
class node_process {
 public:
  node_process(const std::filesystem::path& dir, std::vector<std::string> extra = {}, bool join_test_mesh = true,
               std::vector<std::filesystem::path> hidden = {})
      : dir_(dir) {
    std::filesystem::create_directories(dir_);
    // meshnode refuses a state directory others may write to (a umask of 002 would make one).
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    std::filesystem::remove(dir_ / "endpoint");
    const auto names = [&](const char* flag) { return std::find(extra.begin(), extra.end(), flag) != extra.end(); };
    std::vector<std::string> args = {MESHNODE_BIN, "--state-dir", dir_.string(), "--log-level", "info", "--mdns", "off"};
    if (!names("--device")) args.insert(args.end(), {"--device", "cpu"});  // the CPU back end unless a test names another
    if (!names("--port")) args.insert(args.end(), {"--port", "0"});
    args.insert(args.end(), extra.begin(), extra.end());
    if (join_test_mesh && !names("--join") && !names("--secret-file") && !names("--open"))
      args.insert(args.end(), {"--join", test_token()});
    // Everything the child needs is made here: this process has threads (clients, streams), and
    // a child of a threaded process may only make async-signal-safe calls before exec (an
    // allocation could wait for ever on a lock another thread held at the fork).
    const std::string log_path = (dir_ / "node.log").string();
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log < 0) FAIL("cannot open " << log_path);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);  // or the child re-prints what the parent had buffered
    pid_ = fork();
    if (pid_ == 0) {
      const auto fail = [](const char* why) {
        const ssize_t n = ::write(2, why, std::strlen(why));
        (void)n;
        _exit(126);
      };
      dup2(log, 1);
      dup2(log, 2);
      if (!hidden.empty() && (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0))
        fail("node_process: cannot make a mount namespace\n");
      for (const auto& h : hidden)
        if (mount("tmpfs", h.c_str(), "tmpfs", 0, "size=1m") != 0) fail("node_process: cannot hide a directory with a tmpfs\n");
      execv(argv[0], argv.data());
      _exit(127);
    }
    ::close(log);
  }
  ~node_process() { kill(SIGKILL); }

  /// "id@127.0.0.1:port", once the node is listening (waits up to 60 s: device measurement under
  /// sanitizers takes a while).
  std::string endpoint() {
    for (int i = 0; i < 600; ++i) {
      std::ifstream f(dir_ / "endpoint");
      std::string line;
      if (std::getline(f, line) && !line.empty()) return line;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL("meshnode in " << dir_ << " did not start; log:\n" << log());
    return {};
  }
  std::string log() const {
    std::ifstream f(dir_ / "node.log");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  /// Waits for the process to exit by itself; returns its exit code, or -1 on timeout.
  int wait_exit(std::chrono::seconds timeout) {
    for (int i = 0; i < timeout.count() * 10; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  bool running() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

/// The node id (hex) of an endpoint line "ID@HOST:PORT".
inline std::string node_id_of(const std::string& endpoint) { return endpoint.substr(0, endpoint.find('@')); }

/// A fresh temporary folder, removed at the end.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/meshnode-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// Waits until the node behind `c` sees `healthy` healthy peers.
inline bool wait_for_peers(client& c, size_t healthy, std::chrono::seconds timeout = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (auto s = c.status()) {
      size_t n = 0;
      for (auto& p : s->peers) n += p.health == mesh::peer_health::healthy;
      if (n >= healthy) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

/// Three nodes: b and c are told about a, c also about b.
struct three_nodes {
  temp_dir tmp;
  std::unique_ptr<node_process> a, b, c;
  std::string ea, eb, ec;
  explicit three_nodes(std::vector<std::string> extra = {}) {
    a = std::make_unique<node_process>(tmp.path / "a", extra);
    ea = a->endpoint();
    auto with = [&](std::vector<std::string> peers) {
      auto args = extra;
      for (auto& p : peers) {
        args.push_back("--peer");
        args.push_back(p);
      }
      return args;
    };
    b = std::make_unique<node_process>(tmp.path / "b", with({ea}));
    eb = b->endpoint();
    c = std::make_unique<node_process>(tmp.path / "c", with({ea, eb}));
    ec = c->endpoint();
  }
};


}  // namespace mesh::test
