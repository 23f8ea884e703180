#pragma once
/// Network namespaces for benchmarks over shaped links (bench/node/bench_allreduce.cpp,
/// bench/train/bench_shaped.cpp): a hub namespace with a bridge and one namespace per rank, each
/// joined to the bridge by a veth pair whose both ends are shaped by tc tbf (the rank's upload and
/// download, like a host on a switch port), and the registry that undoes it all on exit, on error
/// and on SIGINT/SIGTERM/SIGHUP. Needs root and iproute2. The kernel here has tbf but no netem:
/// add_delay() delays each rank's egress with an iptables NFQUEUE rule whose verdicts a thread
/// of this process holds (tests/common/kernel_delay_line.hpp: a target using this header adds
/// tests/common to its include directories).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernel_delay_line.hpp"

namespace mesh::bench {

/// Everything a benchmark must undo: child processes and network namespaces. Shared with the
/// signal thread, hence the mutex.
struct cleanup_registry {
  std::mutex mu;
  std::set<pid_t> children;
  std::vector<std::string> namespaces;

  void kill_children() {
    std::lock_guard l(mu);
    for (pid_t p : children) ::kill(p, SIGKILL);
    for (pid_t p : children) ::waitpid(p, nullptr, 0);
    children.clear();
  }
  void remove_namespaces() {
    std::lock_guard l(mu);
    for (auto it = namespaces.rbegin(); it != namespaces.rend(); ++it)
      (void)std::system(("ip netns del " + *it + " >/dev/null 2>&1").c_str());
    namespaces.clear();
  }
};

/// The process's one registry.
inline cleanup_registry& cleanup() {
  static cleanup_registry r;
  return r;
}

/// Runs a shell command quietly; true when it exited 0.
inline bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

/// The namespaces of one topology: a hub with bridge br0, and per rank a namespace whose eth0
/// (10.77.0.<r+1>/24) is a veth to the bridge, shaped to `gbit` both ways by tbf.
struct netns_topology {
  std::string hub;
  std::vector<std::string> ranks;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<test::kernel_delay_line>> delay_lines;  ///< add_delay's, one per rank

  /// `tag` starts every namespace's name (with this process's id: other processes on the
  /// machine may own namespaces). Nothing is left behind when it fails.
  static std::optional<netns_topology> create(int n, double gbit, const std::string& tag) {
    netns_topology t;
    const std::string prefix = tag + "-" + std::to_string(::getpid()) + "-";
    t.hub = prefix + "hub";
    auto add_ns = [](const std::string& name) {
      if (!sh("ip netns add " + name)) return false;
      std::lock_guard l(cleanup().mu);
      cleanup().namespaces.push_back(name);
      return true;
    };
    // tbf needs a bucket of at least one timer tick of traffic; 512 KiB per Gbit/s is what
    // bench_transport's link uses (and reaches 92-96% of the rate with it).
    const long burst_kb = std::max(64L, static_cast<long>(512 * gbit));
    char tbf[160];
    std::snprintf(tbf, sizeof tbf, "tbf rate %.0fmbit burst %ldkb latency 20ms", gbit * 1000, burst_kb);
    bool ok = add_ns(t.hub) && sh("ip -n " + t.hub + " link set lo up") &&
              sh("ip -n " + t.hub + " link add br0 type bridge") && sh("ip -n " + t.hub + " link set br0 up");
    for (int r = 0; ok && r < n; ++r) {
      const std::string ns = prefix + "r" + std::to_string(r), hv = "h" + std::to_string(r);
      const std::string ip = "10.77.0." + std::to_string(r + 1);
      ok = add_ns(ns) && sh("ip -n " + t.hub + " link add " + hv + " type veth peer name eth0 netns " + ns) &&
           sh("ip -n " + t.hub + " link set " + hv + " master br0") && sh("ip -n " + t.hub + " link set " + hv + " up") &&
           sh("ip -n " + ns + " addr add " + ip + "/24 dev eth0") && sh("ip -n " + ns + " link set eth0 up") &&
           sh("ip -n " + ns + " link set lo up") &&
           sh("ip netns exec " + ns + " tc qdisc add dev eth0 root " + tbf) &&          // rank -> bridge
           sh("ip netns exec " + t.hub + " tc qdisc add dev " + hv + " root " + tbf);  // bridge -> rank
      t.ranks.push_back(ns);
      t.addresses.push_back(ip);
    }
    if (!ok) {
      cleanup().remove_namespaces();
      return std::nullopt;
    }
    return t;
  }

  /// Holds every packet a rank sends on eth0 for `delay` before it reaches the tbf (netem's
  /// `delay`, which this kernel lacks): rank to rank, a packet spends `delay` one way and a round
  /// trip 2 x `delay`. The queue is an iptables NFQUEUE rule in the rank's namespace (queue
  /// 40 + rank), its verdicts held by a thread of this process; the packets stay in the kernel.
  /// Empty on success, else why not.
  std::string add_delay(std::chrono::milliseconds delay) {
    // The delay lines' threads outrank the work they carry (nice -10; a new thread takes its
    // creator's nice value): a verdict should not wait for a core the ranks hold.
    const auto self = static_cast<id_t>(::gettid());
    const int nice0 = ::getpriority(PRIO_PROCESS, self);
    ::setpriority(PRIO_PROCESS, self, -10);
    std::string why;
    for (size_t r = 0; r < ranks.size() && why.empty(); ++r) {
      const auto queue = static_cast<uint16_t>(40 + r);
      if (!sh("ip netns exec " + ranks[r] + " iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num " + std::to_string(queue))) {
        why = "the iptables NFQUEUE rule failed in " + ranks[r];
        break;
      }
      delay_lines.push_back(std::make_unique<test::kernel_delay_line>(ranks[r], queue, delay));
      if (!delay_lines.back()->ok()) why = "the delay line in " + ranks[r] + ": " + delay_lines.back()->error();
    }
    ::setpriority(PRIO_PROCESS, self, nice0);
    return why;
  }
};

/// Packets the delay lines' queues dropped in `ns` so far (queue full, or not delivered to the
/// delay line: /proc/net/netfilter/nfnetlink_queue's queue_dropped + user_dropped).
inline uint64_t delay_queue_drops(const std::string& ns) {
  uint64_t total = 0;
  FILE* p = ::popen(("ip netns exec " + ns + " cat /proc/net/netfilter/nfnetlink_queue 2>/dev/null").c_str(), "r");
  if (!p) return 0;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::vector<uint64_t> v;
    for (uint64_t x; in >> x;) v.push_back(x);
    if (v.size() >= 7) total += v[5] + v[6];
  }
  ::pclose(p);
  return total;
}

/// Packets the tbf qdiscs of the topology dropped so far (queue full): with a shaped link this is
/// the loss that congestion control causes and then has to recover from.
inline uint64_t tbf_drops(const std::string& hub, const std::vector<std::string>& ranks) {
  uint64_t total = 0;
  auto count = [&total](const std::string& cmd) {
    FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
    if (!p) return;
    char line[512];
    while (std::fgets(line, sizeof line, p))
      if (const char* d = std::strstr(line, "dropped ")) total += std::strtoull(d + 8, nullptr, 10);
    ::pclose(p);
  };
  for (const auto& ns : ranks) count("ip netns exec " + ns + " tc -s qdisc show dev eth0");
  count("ip netns exec " + hub + " tc -s qdisc show");
  return total;
}

/// UDP datagrams the ranks' namespaces dropped because a socket's receive buffer was full
/// (Udp RcvbufErrors, counted per namespace): QUIC loss that no link caused.
inline uint64_t udp_rcvbuf_errors(const std::vector<std::string>& ranks) {
  uint64_t total = 0;
  auto words = [](const char* s) {
    std::istringstream in(s);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  for (const auto& ns : ranks) {
    FILE* p = ::popen(("ip netns exec " + ns + " cat /proc/net/snmp 2>/dev/null").c_str(), "r");
    if (!p) continue;
    char line[2048];
    std::vector<std::string> names;
    while (std::fgets(line, sizeof line, p)) {
      if (std::strncmp(line, "Udp: ", 5) != 0) continue;
      auto w = words(line + 5);
      if (names.empty()) {
        names = w;  // the header line comes first, then the values
        continue;
      }
      for (size_t i = 0; i < names.size() && i < w.size(); ++i)
        if (names[i] == "RcvbufErrors") total += std::strtoull(w[i].c_str(), nullptr, 10);
      break;
    }
    ::pclose(p);
  }
  return total;
}

/// Bytes that interface `dev` of namespace `ns` sent so far (all traffic, IP headers included).
inline uint64_t tx_bytes(const std::string& ns, const std::string& dev = "eth0") {
  uint64_t v = 0;
  FILE* p = ::popen(("ip netns exec " + ns + " cat /sys/class/net/" + dev + "/statistics/tx_bytes 2>/dev/null").c_str(), "r");
  if (!p) return 0;
  char line[64];
  if (std::fgets(line, sizeof line, p)) v = std::strtoull(line, nullptr, 10);
  ::pclose(p);
  return v;
}

/// The pipe install_signal_cleanup's handler writes a caught signal's number to.
inline int signal_pipe = -1;

/// On SIGINT, SIGTERM or SIGHUP: kill the children, remove the namespaces, exit. The handler only
/// writes the signal's number to a pipe that a thread of its own reads; no signal is blocked, so
/// the processes this one starts get an ordinary signal mask (a meshnode started by
/// app::node_process stops on the SIGTERM its parent's death sends it). `program` names the
/// benchmark in the message.
inline void install_signal_cleanup(const std::string& program) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return;
  signal_pipe = p[1];
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    const auto b = static_cast<unsigned char>(sig);
    [[maybe_unused]] const ssize_t n = ::write(signal_pipe, &b, 1);
  };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  std::thread([fd = p[0], program] {
    unsigned char sig = 0;
    while (::read(fd, &sig, 1) != 1) {
      if (errno != EINTR) return;
    }
    std::fprintf(stderr, "\n%s: signal %d: stopping the children and removing the namespaces\n", program.c_str(), sig);
    cleanup().kill_children();
    cleanup().remove_namespaces();
    std::_Exit(128 + sig);
  }).detach();
}

}  // namespace mesh::bench
