#include "discovery/lab/avahi_lab.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

namespace mesh::discovery::lab {
namespace {

std::string prefix() { return "mnd-" + std::to_string(::getpid()) + "-"; }

std::string capture(const std::string& command) {
  std::string out;
  if (FILE* f = ::popen(command.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    ::pclose(f);
  }
  return out;
}

// Namespaces "mnd-<pid>-*" whose pid is gone were left by a crashed run: remove them (and the
// processes still running in them, which that run started).
void reap_stale() {
  std::string list = capture("ip netns list 2>/dev/null | cut -d' ' -f1 | grep '^mnd-[0-9]*-'");
  std::size_t pos = 0;
  while (pos < list.size()) {
    std::size_t nl = list.find('\n', pos);
    std::string ns = list.substr(pos, nl - pos);
    pos = nl == std::string::npos ? list.size() : nl + 1;
    const auto dash = ns.find('-', 4);
    if (dash == std::string::npos) continue;
    const std::string pid = ns.substr(4, dash - 4);
    if (::access(("/proc/" + pid).c_str(), F_OK) == 0) continue;
    sh("for p in $(ip netns pids " + ns + " 2>/dev/null); do kill -9 $p; done; ip netns del " + ns +
       " 2>/dev/null; rm -rf /tmp/" + ns);
  }
}

// Alive and not a zombie: daemons are reparented to pid 1, which may not reap them here.
bool alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (!(stat >> pid_field >> comm >> state)) return false;
  return state != "Z";
}

}  // namespace

int sh(const std::string& command) {
  int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int spawn(const std::string& command) {
  const std::string out = capture(command + " >/dev/null 2>&1 & echo $!");
  try {
    return std::stoi(out);
  } catch (...) {
    return 0;
  }
}

std::optional<std::string> reason_unavailable() {
  if (::geteuid() != 0) return "not root: cannot create network namespaces or private daemons";
  for (const char* tool : {"ip", "dbus-daemon", "avahi-daemon"}) {
    if (sh(std::string("command -v ") + tool + " >/dev/null 2>&1") != 0) {
      return std::string(tool) + " is not installed";
    }
  }
  static const bool netns_ok = [] {
    reap_stale();
    const std::string ns = prefix() + "probe";
    const bool ok = sh("ip netns add " + ns + " 2>/dev/null") == 0;
    sh("ip netns del " + ns + " 2>/dev/null");
    return ok;
  }();
  if (!netns_ok) return "cannot create network namespaces (ip netns add failed)";
  return std::nullopt;
}

bridge::bridge(std::string name) : netns_(prefix() + name) {
  sh("ip netns add " + netns_ + " && ip -n " + netns_ + " link add br0 type bridge && ip -n " +
     netns_ + " link set br0 up && ip -n " + netns_ + " link set lo up");
}

bridge::~bridge() { sh("ip netns del " + netns_ + " 2>/dev/null"); }

host::host(std::string name, std::string bridge_ns, std::string address, std::string ipv6_address)
    : name_(std::move(name)),
      netns_(prefix() + name_),
      dir_("/tmp/" + netns_),
      bridge_(std::move(bridge_ns)),
      loopback_only_(bridge_.empty()) {
  sh("rm -rf " + dir_ + " && mkdir -p " + dir_ + "/run && ip netns add " + netns_ + " && ip -n " +
     netns_ + " link set lo up");
  if (!loopback_only_) {
    // The veth end in the bridge namespace is named after the host; inside the host it is eth0.
    const std::string port = "p-" + name_.substr(0, 10);
    sh("ip -n " + bridge_ + " link add " + port + " type veth peer name eth0 netns " + netns_ +
       " && ip -n " + bridge_ + " link set " + port + " master br0 up && ip -n " + netns_ +
       " addr add " + address + "/24 dev eth0");
    if (!ipv6_address.empty()) {
      // No duplicate address detection: addresses (link-local too) are usable at once.
      sh("ip netns exec " + netns_ + " sysctl -qw net.ipv6.conf.eth0.accept_dad=0 && ip -n " + netns_ +
         " addr add " + ipv6_address + "/64 dev eth0 nodad");
    }
    sh("ip -n " + netns_ + " link set eth0 up");
  }
  std::ofstream conf(dir_ + "/avahi.conf");
  conf << "[server]\nhost-name=" << name_ << "\nuse-ipv4=yes\nuse-ipv6=" << (ipv6_address.empty() ? "no" : "yes") << "\n"
       << "allow-interfaces=" << (loopback_only_ ? "lo" : "eth0") << "\nenable-dbus=yes\n"
       << "ratelimit-interval-usec=1000000\nratelimit-burst=1000\n"
       << "[wide-area]\nenable-wide-area=no\n"
       << "[publish]\npublish-hinfo=no\npublish-workstation=no\npublish-aaaa-on-ipv4=no\n";
}

host::~host() {
  stop_avahi(true);
  stop_dbus();
  sh("for p in $(ip netns pids " + netns_ + " 2>/dev/null); do kill -9 $p; done; ip netns del " +
     netns_ + " 2>/dev/null; rm -rf " + dir_);
}

bool host::start_daemon() {
  // `ip netns exec` gives each command its own mount namespace: bind the host's directory over
  // /run there, so the daemons' sockets and pid files are reachable from outside as dir_/run.
  const bool dbus_up = ::access((dir_ + "/run/dbus/pid").c_str(), F_OK) == 0;
  const std::string dbus = dbus_up ? "" : "mkdir -p /run/dbus && dbus-daemon --system --fork && ";
  if (sh("ip netns exec " + netns_ + " sh -c 'mount --bind " + dir_ + "/run /run && " + dbus +
         "avahi-daemon -D --no-chroot -f " + dir_ + "/avahi.conf' >/dev/null 2>&1") != 0) {
    return false;
  }
  for (int i = 0; i < 100; ++i) {  // avahi-daemon -D returns once running; bound anyway
    if (::access((dir_ + "/run/avahi-daemon/pid").c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void host::kill_pidfile(const std::string& path, int sig) {
  std::ifstream in(path);
  int pid = 0;
  if (!(in >> pid) || pid <= 1) return;
  if (::kill(pid, sig) != 0) return;
  // Wait (bounded) for it to exit so that a restart does not race the old daemon.
  for (int i = 0; i < 200 && alive(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::unlink(path.c_str());
}

void host::stop_avahi(bool hard) {
  kill_pidfile(dir_ + "/run/avahi-daemon/pid", hard ? SIGKILL : SIGTERM);
  ::unlink((dir_ + "/run/avahi-daemon/socket").c_str());
}

void host::stop_dbus() {
  kill_pidfile(dir_ + "/run/dbus/pid", SIGTERM);
  ::unlink((dir_ + "/run/dbus/system_bus_socket").c_str());
}

std::string host::bus_address() const { return "unix:path=" + dir_ + "/run/dbus/system_bus_socket"; }

}  // namespace mesh::discovery::lab
