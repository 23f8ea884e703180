#include "discovery/lab/node_process.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <vector>

extern char** environ;

namespace mesh::discovery::test {
namespace {

event::kind parse_kind(const std::string& s) {
  for (auto k : {event::peer_found, event::peer_updated, event::peer_lost, event::foreign_peer,
                 event::peer_rejected, event::peer_hint, event::backend_down, event::backend_up,
                 event::peer_still_announced}) {
    if (s == to_string(k)) return k;
  }
  return event::peer_rejected;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

}  // namespace

std::string discovery_node_path() { return MESH_DISCOVERY_NODE_PATH; }

node_process::node_process(const std::string& kind, const announcement& self,
                           const std::string& bus_address, const std::string& service_name,
                           const std::string& netns) {
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) return;
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  const std::string path = discovery_node_path();
  const std::string port = std::to_string(self.port);
  std::vector<std::string> args{path, kind, self.node_id, self.mesh_id, port};
  if (!netns.empty()) args.insert(args.begin(), {"ip", "netns", "exec", netns});  // execs in place
  if (!service_name.empty()) args.push_back(service_name);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_storage{"DBUS_SYSTEM_BUS_ADDRESS=" + bus_address, "AVAHI_COMPAT_NOWARN=1"};
  for (char** e = environ; *e; ++e) {
    const std::string v = *e;
    if (v.rfind("DBUS_SYSTEM_BUS_ADDRESS=", 0) != 0 && v.rfind("AVAHI_COMPAT_NOWARN=", 0) != 0) {
      env_storage.push_back(v);
    }
  }
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0].c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (rc != 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return;
  }
  pid_ = pid;
  stdin_fd_ = in_pipe[1];
  const int out_fd = out_pipe[0];
  auto sink = log_.callback();
  reader_ = std::thread([out_fd, sink] {
    FILE* f = ::fdopen(out_fd, "r");
    if (!f) return;
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      std::string l(line);
      if (!l.empty() && l.back() == '\n') l.pop_back();
      auto fields = split(l, '\t');
      if (fields.size() < 6) {  // the node's own log lines: pass them on for the reader
        std::fprintf(stderr, "[discovery_node] %s\n", l.c_str());
        continue;
      }
      event e;
      e.k = parse_kind(fields[1]);
      e.peer.node_id = fields[2];
      e.peer.mesh_id = fields[3];
      e.peer.port = static_cast<uint16_t>(std::stoul(fields[4]));
      e.peer.addresses = split(fields[5], ',');
      e.detail = fields.size() > 6 ? fields[6] : "";
      e.peer.source = "t=" + fields[0];  // the child's clock: ms since it started
      sink(std::move(e));
    }
    std::fclose(f);
  });
}

void node_process::stop() {
  if (pid_ <= 0) return;
  ::close(stdin_fd_);
  stdin_fd_ = -1;
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 500 && !exited; ++i) {  // up to 5 s for a clean withdrawal
    exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  if (reader_.joinable()) reader_.join();
}

node_process::~node_process() { stop(); }

}  // namespace mesh::discovery::test
