// bench_allreduce: ring all-reduce bus bandwidth between real processes over the QUIC transport,
// against PyTorch's Gloo all-reduce on the same links in the same run (issue 7).
//
//   bench_allreduce [--ranks 3] [--mib 64] [--iters 10] [--warmup 2] [--pieces 4[,16...]]
//                   [--formats f32,bf16] [--netns] [--rate 1] [--delay-ms 0] [--no-loopback] [--no-gloo]
//                   [--python /usr/bin/python3] [--gloo-script PATH] [--inject-error]
//
// --inject-error is the self-test of the result check: rank 0 adds 1 to one element of its
// input (not of the expected sum), so every rank must report a wrong result and the bench must
// exit non-zero.
//
// What "ours" measures is what a training step does (actors/train_worker.cpp, train_collective.cpp + actors/jobs_actor.cpp):
// every rank is its own process with its own transport::endpoint on real UDP, admitted to a mesh
// by a random mesh secret; a round is mesh::ring_allreduce (n chunks of `pieces` pieces each),
// every piece travels as a msg::allreduce_piece encoded with msg::encode_message, on the bulk
// channel when the encoded message is over 64 KiB and on the control channel otherwise (the rule
// of jobs_actor.cpp's send_to), is decoded with msg::decode_message and handled off the endpoint's I/O
// thread (as the node's core actor does). Only the coordinator/worker bookkeeping is left out.
//
// Timing: the coordinating process (this one, without --rank) starts the ranks, and for every
// round sends "prep" (build the input, untimed), then "go" to all ranks; each rank reports its
// start and end times on CLOCK_MONOTONIC (shared by all processes of the machine, also across
// network namespaces). A round's time is max(end) - min(start). Bus bandwidth is the nccl-tests
// definition: busbw = algbw * 2(n-1)/n, algbw = buffer bytes / time.
//
// Correctness: rank r's element i in round k is ((7i + 13r + 5k) mod 31) - 15, small integers
// whose sums are exact in f32 and bf16, so every rank checks every element of its result for
// equality with the expected sum after each round (warm-up included). A wrong result makes the
// bench exit non-zero; the Gloo script checks the same pattern.
//
// --netns (root, iproute2, tc tbf): a hub namespace with a bridge and one namespace per rank,
// each joined to the bridge by a veth pair whose both ends are shaped to --rate Gbit/s by tbf
// (the rank's upload and download, like a host on a switch port). Everything made is removed on
// exit, on error and on SIGINT/SIGTERM/SIGHUP (bench/netns_topology.hpp). The kernel here has tbf
// but no netem: --delay-ms D holds each rank's egress packets D ms in an NFQUEUE delay line (a
// round trip of 2D between ranks).
//
// Build Release to measure; never a timed test.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "wire/messages.hpp"
#include "actors/ring_allreduce.hpp"
#include "transport/endpoint.hpp"

#include "allreduce_common.hpp"
#include "bench/netns_topology.hpp"

using namespace mesh::bench_allreduce;

namespace {

// ---------------------------------------------------------------------------------------------
// Coordinator: child processes, namespaces, cleanup on any exit
// ---------------------------------------------------------------------------------------------

using mesh::bench::netns_topology;
using mesh::bench::sh;
using mesh::bench::tbf_drops;
using mesh::bench::udp_rcvbuf_errors;

/// Child processes and namespaces to undo on any exit (bench/netns_topology.hpp).
mesh::bench::cleanup_registry& registry = mesh::bench::cleanup();

/// A child process with a pipe to its stdin and one from its stdout.
struct child {
  pid_t pid = -1;
  FILE* in = nullptr;   ///< its stdin
  int out_fd = -1;      ///< its stdout
  std::string pending;  ///< bytes read past the last full line

  /// The next line, or nullopt on EOF, error or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto end = clk::now() + timeout;
    for (;;) {
      if (auto nl = pending.find('\n'); nl != std::string::npos) {
        std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clk::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{out_fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (r < 0 && errno != EINTR) return std::nullopt;
      if (r <= 0) continue;
      char buf[4096];
      const ssize_t got = ::read(out_fd, buf, sizeof buf);
      if (got <= 0) return std::nullopt;
      pending.append(buf, static_cast<size_t>(got));
    }
  }
  void send(const std::string& line) {
    std::fputs((line + "\n").c_str(), in);
    std::fflush(in);
  }
  /// Closes our ends and waits for the process (killing it after `grace`); returns its exit
  /// status, or -1 when it had to be killed or died of a signal.
  int finish(std::chrono::milliseconds grace = std::chrono::seconds(10)) {
    if (in) std::fclose(in);
    in = nullptr;
    if (out_fd >= 0) ::close(out_fd);
    out_fd = -1;
    int status = 0;
    const auto end = clk::now() + grace;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (clk::now() >= end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    {
      std::lock_guard l(registry.mu);
      registry.children.erase(pid);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

/// Starts `argv` (argv[0] a path) with `env` added, inside network namespace `ns` when not
/// empty (setns in the child before exec, so the program and all its sockets live there).
std::optional<child> spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                           const std::string& ns) {
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return std::nullopt;
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    return std::nullopt;
  }
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<char*> cargv;
  for (const auto& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  for (const auto& e : env) env_strings.push_back(e);
  std::vector<char*> cenv;
  for (auto& s : env_strings) cenv.push_back(s.data());
  cenv.push_back(nullptr);
  const std::string ns_path = ns.empty() ? std::string() : "/run/netns/" + ns;
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  std::lock_guard l(registry.mu);  // a signal's cleanup must see this child
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    // Die with the coordinator, whatever kills it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // a clean mask, whatever the forking thread had
    if (!ns_path.empty()) {
      const int fd = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ::_exit(126);
    }
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  registry.children.insert(pid);
  child c;
  c.pid = pid;
  c.in = ::fdopen(to_child[1], "w");
  c.out_fd = from_child[0];
  return c;
}

/// Where the ranks of one measurement run: loopback, or the namespaces.
struct link_setup {
  std::string name;                    ///< "loopback" or "netns 1 Gbit/s"
  std::vector<std::string> namespaces;  ///< per rank; empty = none
  std::vector<std::string> addresses;   ///< per rank bind address
  std::string gloo_ifname;             ///< GLOO_SOCKET_IFNAME
  double link_bytes_per_s = 0;         ///< 0 = no shaped link
  std::string hub;                     ///< the hub namespace (tbf drop counters), if any
};

/// One measurement: per-round times in seconds (warm-up excluded), or why there is none.
struct measurement {
  std::vector<double> seconds;
  std::vector<double> cpu_seconds;  ///< per timed round, summed over the ranks
  /// Per timed round, summed over the ranks: link idle seconds with nothing to send / with the
  /// congestion window full / held otherwise (see rank_main's sampler).
  std::vector<double> idle_empty, idle_cwnd, idle_held;
  uint64_t bytes_sent_per_rank = 0;
  std::string skipped;  ///< non-empty: not measured (the reason)
  bool wrong = false;   ///< a rank's result was wrong, or a rank failed
  std::optional<uint64_t> drops;  ///< tbf drops during the whole measurement (warm-up included)
  std::optional<uint64_t> rcvbuf_drops;  ///< UDP receive-buffer drops in the ranks' namespaces
};

struct bench_config {
  int n = 3;
  double mib = 64;
  int iters = 10, warmup = 2;
  std::vector<int> pieces = {4};  ///< pieces per chunk, one "ours" row each
  std::string python, gloo_script;  ///< the interpreter's full path (execve does not search PATH)
  bool inject_error = false;  ///< rank 0 adds 1 to one element: the check must catch it
  std::string gloo_skip;  ///< non-empty: why the Gloo reference cannot run (checked once)
};

/// Ours: n rank processes, `warmup + iters` rounds, chunks cut into `pieces`.
measurement run_ours(const bench_config& bc, const link_setup& link, const std::string& format, int pieces) {
  measurement m;
  const int n = bc.n;
  const auto line_timeout = std::chrono::milliseconds(static_cast<long>(60000 + 2000 * bc.mib));
  std::random_device rd;
  auto random_bytes = [&rd](size_t count) {
    std::vector<uint8_t> v(count);
    for (auto& b : v) b = static_cast<uint8_t>(rd());
    return v;
  };
  const auto secret = random_bytes(32);  // a mesh of our own: nothing else on the machine joins it
  std::vector<std::vector<uint8_t>> seeds;
  std::vector<node_id> ids;
  for (int r = 0; r < n; ++r) {
    seeds.push_back(random_bytes(32));
    std::array<uint8_t, 32> s{};
    std::copy(seeds.back().begin(), seeds.back().end(), s.begin());
    ids.push_back(transport::identity::from_seed(s).id());
  }
  std::vector<child> ranks;
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "bench_allreduce: ours, %s, %s: %s\n", link.name.c_str(), format.c_str(), why.c_str());
    for (auto& c : ranks) {
      ::kill(c.pid, SIGKILL);
      c.finish();
    }
    m.wrong = true;
    return m;
  };
  // This very program, by inode: a rebuild that replaces the file on disk mid-run does not matter.
  const std::string exe = "/proc/self/exe";
  for (int r = 0; r < n; ++r) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%g", bc.mib);
    std::vector<std::string> argv = {exe, "--rank", std::to_string(r), "--ranks", std::to_string(n), "--mib", mib,
                                     "--pieces", std::to_string(pieces), "--format", format,
                                     "--seed", to_hex(seeds[r].data(), 32), "--secret", to_hex(secret.data(), 32),
                                     "--bind", link.addresses[r]};
    if (bc.inject_error) argv.push_back("--inject-error");
    auto c = spawn(argv, {}, link.namespaces.empty() ? "" : link.namespaces[r]);
    if (!c) return fail("cannot start rank " + std::to_string(r));
    ranks.push_back(std::move(*c));
  }
  // Expects one line starting with `word` from every rank; returns the lines.
  auto collect = [&](const std::string& word) -> std::optional<std::vector<std::vector<std::string>>> {
    std::vector<std::vector<std::string>> lines;
    for (int r = 0; r < n; ++r) {
      auto l = ranks[r].read_line(line_timeout);
      if (!l) {
        std::fprintf(stderr, "bench_allreduce: rank %d: no answer (waiting for \"%s\")\n", r, word.c_str());
        return std::nullopt;
      }
      auto w = split(*l);
      if (w.empty() || w[0] != word) {
        std::fprintf(stderr, "bench_allreduce: rank %d: %s\n", r, l->c_str());
        return std::nullopt;
      }
      lines.push_back(std::move(w));
    }
    return lines;
  };
  auto ports = collect("port");
  if (!ports) return fail("a rank did not start");
  for (int r = 0; r < n; ++r) {
    const int s = (r + 1) % n, p = (r + n - 1) % n;
    ranks[r].send("ring " + ids[p].to_string() + " " + ids[s].to_string() + " " + link.addresses[s] + ":" + (*ports)[s][1]);
  }
  if (!collect("ready")) return fail("the ring did not connect");
  for (int k = 0; k < bc.warmup + bc.iters; ++k) {
    for (auto& c : ranks) c.send("prep " + std::to_string(k));
    if (!collect("prepped")) return fail("prep failed");
    for (auto& c : ranks) c.send("go");
    auto done = collect("done");
    if (!done) return fail("round " + std::to_string(k) + " failed");
    int64_t start = INT64_MAX, end = 0, cpu = 0, idle_empty = 0, idle_cwnd = 0, idle_held = 0;
    for (const auto& w : *done) {
      if (w.size() != 9) return fail("bad done line");
      cpu += std::stoll(w[5]);
      idle_empty += std::stoll(w[6]);
      idle_cwnd += std::stoll(w[7]);
      idle_held += std::stoll(w[8]);
      start = std::min<int64_t>(start, std::stoll(w[2]));
      end = std::max<int64_t>(end, std::stoll(w[3]));
      m.bytes_sent_per_rank = std::stoull(w[4]);
    }
    for (auto& c : ranks) c.send("check");
    auto checked = collect("checked");
    if (!checked) return fail("check failed");
    for (int r = 0; r < n; ++r)
      if ((*checked)[r].size() < 2 || (*checked)[r][1] != "ok") {
        std::string why;
        for (const auto& w : (*checked)[r]) why += w + " ";
        return fail("WRONG RESULT on rank " + std::to_string(r) + ": " + why);
      }
    if (k >= bc.warmup) {
      m.seconds.push_back(static_cast<double>(end - start) / 1e9);
      m.cpu_seconds.push_back(static_cast<double>(cpu) / 1e9);
      m.idle_empty.push_back(static_cast<double>(idle_empty) / 1e9);
      m.idle_cwnd.push_back(static_cast<double>(idle_cwnd) / 1e9);
      m.idle_held.push_back(static_cast<double>(idle_held) / 1e9);
    }
  }
  for (auto& c : ranks) c.send("quit");
  for (auto& c : ranks) c.finish();
  return m;
}

/// Whether `python` can import torch.distributed with Gloo; empty when it can, else why not.
std::string gloo_unavailable(const std::string& python) {
  const std::string cmd = python + " -c 'import torch.distributed as d, sys; sys.exit(0 if d.is_available() and "
                                   "d.is_gloo_available() else 1)' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0)
    return "PyTorch with Gloo is not importable by " + python + " (apt-get install -y python3-torch)";
  return {};
}

/// A free TCP port on 127.0.0.1 for Gloo's rendezvous (a small race, harmless here).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 29500;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

/// The reference: gloo_allreduce.py in n processes on the same addresses and namespaces.
measurement run_gloo(const bench_config& bc, const link_setup& link, const std::string& format) {
  measurement m;
  if (!bc.gloo_skip.empty()) {
    m.skipped = bc.gloo_skip;
    return m;
  }
  const int n = bc.n;
  const std::string init = "tcp://" + link.addresses[0] + ":" + std::to_string(free_port());
  std::vector<child> ranks;
  char mib[32];
  std::snprintf(mib, sizeof mib, "%g", bc.mib);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {bc.python, bc.gloo_script, "--rank", std::to_string(r), "--world", std::to_string(n),
                                     "--init", init, "--mib", mib, "--iters", std::to_string(bc.iters),
                                     "--warmup", std::to_string(bc.warmup), "--dtype", format};
    auto c = spawn(argv, {"GLOO_SOCKET_IFNAME=" + link.gloo_ifname, "OMP_NUM_THREADS=1"},
                   link.namespaces.empty() ? "" : link.namespaces[r]);
    if (!c) {
      m.skipped = "cannot start python";
      break;
    }
    ranks.push_back(std::move(*c));
  }
  // Each rank prints "iter K START_NS END_NS CPU_NS" per timed iteration, then "check ok" or
  // "check bad ...", or "unsupported ..." when this torch's Gloo cannot reduce the dtype.
  struct iter_times {
    int64_t start = 0, end = 0, cpu = 0;
  };
  std::vector<std::map<int, iter_times>> times(ranks.size());
  const auto timeout = std::chrono::milliseconds(static_cast<long>(120000 + 4000 * bc.mib));
  bool all_ok = ranks.size() == static_cast<size_t>(n);
  for (size_t r = 0; r < ranks.size(); ++r) {
    bool checked = false;
    while (auto l = ranks[r].read_line(timeout)) {
      auto w = split(*l);
      if (w.size() == 5 && w[0] == "iter")
        times[r][std::stoi(w[1])] = {std::stoll(w[2]), std::stoll(w[3]), std::stoll(w[4])};
      else if (w.size() >= 2 && w[0] == "check") {
        checked = w[1] == "ok";
        if (!checked) {
          std::fprintf(stderr, "bench_allreduce: gloo rank %zu: WRONG RESULT: %s\n", r, l->c_str());
          m.wrong = true;
        }
      } else if (!w.empty() && w[0] == "unsupported") {
        m.skipped = "Gloo: " + l->substr(12);
      }
    }
    if (!checked) all_ok = false;
  }
  bool exit_ok = true;
  for (auto& c : ranks) exit_ok = (c.finish(std::chrono::seconds(30)) == 0) && exit_ok;
  if (!m.skipped.empty()) return m;
  if (!all_ok || !exit_ok) {
    if (!m.wrong) m.skipped = "the Gloo script failed (its error is above)";
    return m;
  }
  for (int k = 0; k < bc.iters; ++k) {
    int64_t start = INT64_MAX, end = 0, cpu = 0;
    for (const auto& t : times) {
      auto it = t.find(k);
      if (it == t.end()) {
        m.skipped = "the Gloo script reported no time for iteration " + std::to_string(k);
        m.seconds.clear();
        return m;
      }
      start = std::min(start, it->second.start);
      end = std::max(end, it->second.end);
      cpu += it->second.cpu;
    }
    m.seconds.push_back(static_cast<double>(end - start) / 1e9);
    m.cpu_seconds.push_back(static_cast<double>(cpu) / 1e9);
  }
  return m;
}

/// One row of the result table.
struct row {
  std::string link, impl, format;
  measurement m;
  double link_bytes_per_s = 0;
};

/// The Gloo reference for `format`; PyTorch 1.13's Gloo has no bf16 all-reduce ("Invalid scalar
/// type"), so bf16 falls back to f16: the same bytes on the wire, which is what the link sees.
row run_gloo_row(const bench_config& bc, const link_setup& link, const std::string& format) {
  row r{link.name, "gloo", format, run_gloo(bc, link, format), link.link_bytes_per_s};
  if (format == "bf16" && !r.m.wrong && r.m.skipped.rfind("Gloo: ", 0) == 0) {
    std::fprintf(stderr, "bench_allreduce: this Gloo cannot reduce bf16 (%s); f16 instead\n", r.m.skipped.c_str());
    r.format = "f16";
    r.m = run_gloo(bc, link, "f16");
  }
  return r;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t k = xs.size();
  return k % 2 ? xs[k / 2] : (xs[k / 2 - 1] + xs[k / 2]) / 2;
}

void print_table(const bench_config& bc, const std::vector<row>& rows) {
  const double elems = bc.mib * (1 << 20) / 4;
  const double ring = 2.0 * (bc.n - 1) / bc.n;
  std::printf("\nall-reduce of %g MiB of f32 (%.0f elements), n = %d ranks, %d timed rounds after %d warm-up\n", bc.mib,
              elems, bc.n, bc.iters, bc.warmup);
  std::printf("busbw = 2(n-1)/n x f32 buffer bytes / time (nccl-tests); wire busbw counts the bytes the wire format\n"
              "carries (bf16: half). On a shaped link the ring's limit is busbw (wire) = link rate: every rank sends\n"
              "2(n-1)/n of the buffer on its own link. share = median wire busbw / link rate.\n\n");
  std::printf("%-18s %-8s %-5s %9s %9s %11s %11s %10s %7s %8s %9s %13s\n", "link", "impl", "wire", "median ms", "best ms",
              "algbw MB/s", "busbw MB/s", "wire Gb/s", "share", "vs Gloo", "CPU s/rd", "drops tbf/udp");
  for (const auto& r : rows) {
    if (!r.m.skipped.empty() || r.m.seconds.empty()) {
      std::printf("%-18s %-8s %-5s %s\n", r.link.c_str(), r.impl.c_str(), r.format.c_str(),
                  r.m.wrong ? "FAILED / WRONG RESULT" : ("skipped: " + r.m.skipped).c_str());
      continue;
    }
    const double med = median(r.m.seconds), best = *std::min_element(r.m.seconds.begin(), r.m.seconds.end());
    const double value_bytes = r.format == "f32" ? 4 : 2;
    const double algbw = elems * 4 / med, busbw = algbw * ring;
    const double wire_busbw = elems * value_bytes * ring / med;
    std::string share = "-", vs = "-";
    if (r.link_bytes_per_s > 0) {
      char b[32];
      std::snprintf(b, sizeof b, "%.1f%%", 100 * wire_busbw / r.link_bytes_per_s);
      share = b;
    }
    if (r.impl.rfind("ours", 0) == 0) {
      for (const auto& g : rows)
        // A 2-byte Gloo row (f16 where Gloo has no bf16) is the reference of our bf16 row.
        if (g.impl == "gloo" && g.link == r.link && g.m.skipped.empty() && !g.m.seconds.empty() &&
            (g.format == r.format || (r.format == "bf16" && g.format == "f16"))) {
          char b[32];
          std::snprintf(b, sizeof b, "%.2fx", median(g.m.seconds) / med);
          vs = b;
        }
    }
    std::string drops = r.m.drops ? std::to_string(*r.m.drops) : "-";
    if (r.m.rcvbuf_drops) drops += "/" + std::to_string(*r.m.rcvbuf_drops);
    std::printf("%-18s %-8s %-5s %9.1f %9.1f %11.1f %11.1f %10.3f %7s %8s %9.2f %13s\n", r.link.c_str(), r.impl.c_str(),
                r.format.c_str(), med * 1e3, best * 1e3, algbw / 1e6, busbw / 1e6, wire_busbw * 8 / 1e9, share.c_str(),
                vs.c_str(), median(r.m.cpu_seconds), drops.c_str());
  }
  for (const auto& r : rows)
    if (r.impl.rfind("ours", 0) == 0 && r.m.bytes_sent_per_rank && !r.m.seconds.empty())
      std::printf("\n%s, %s, %s: %.1f MB sent per rank per round (2(n-1)/n of the buffer in the wire format)",
                  r.impl.c_str(), r.link.c_str(), r.format.c_str(), static_cast<double>(r.m.bytes_sent_per_rank) / 1e6);
  for (const auto& r : rows)
    if (r.impl.rfind("ours", 0) == 0 && !r.m.idle_empty.empty()) {
      // Rounds with their idle split, so that a slow round can be told from a fast one.
      std::printf("\n%s, %s, %s: link idle per round, all ranks summed, ms (nothing to send / cwnd full / held):",
                  r.impl.c_str(), r.link.c_str(), r.format.c_str());
      for (size_t k = 0; k < r.m.idle_empty.size(); ++k)
        std::printf(" [%.0f ms: %.0f/%.0f/%.0f]", r.m.seconds[k] * 1e3, r.m.idle_empty[k] * 1e3, r.m.idle_cwnd[k] * 1e3,
                    r.m.idle_held[k] * 1e3);
    }
  std::printf("\n\"ours/P\": P pieces per chunk (training uses 4: actors/train_engine_state.hpp, ring_pieces).");
  std::printf("\n\"vs Gloo\": Gloo's median time / ours (above 1: ours is faster). \"CPU s/rd\": CPU seconds\n"
              "(user + system) of all ranks together during a round, median: what the round costs whatever the load.\n"
              "\"drops tbf/udp\": packets the shaped links dropped (queue full) / UDP datagrams dropped at a full socket\n"
              "receive buffer in the ranks' namespaces (ours only: Gloo is TCP), during the measurement, warm-up included.\n");
}

int coordinator_main(const args& a) {
  bench_config bc;
  bc.inject_error = a.has("--inject-error");
  bc.n = static_cast<int>(a.num("--ranks", 3));
  bc.mib = a.real("--mib", 64);
  bc.iters = static_cast<int>(a.num("--iters", 10));
  bc.warmup = static_cast<int>(a.num("--warmup", 2));
  // 4 = train_engine_state.hpp's ring_pieces; a list ("4,16") adds one row per value.
  {
    std::string list = a.get("--pieces").value_or("4");
    std::replace(list.begin(), list.end(), ',', ' ');
    bc.pieces.clear();
    for (const auto& w : split(list)) bc.pieces.push_back(std::atoi(w.c_str()));
  }
  // Debian's interpreter by default: python3-torch installs there, and a python3 earlier in PATH
  // (pyenv, a venv) may not see it.
  bc.python = a.get("--python").value_or("/usr/bin/python3");
  if (bc.python.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "/usr/bin");
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (::access((dir + "/" + bc.python).c_str(), X_OK) == 0) {
        bc.python = dir + "/" + bc.python;
        break;
      }
  }
  bc.gloo_script = a.get("--gloo-script").value_or(MESH_GLOO_SCRIPT);
  const double rate = a.real("--rate", 1);
  std::vector<std::string> formats;
  {
    std::string list = a.get("--formats").value_or("f32,bf16");
    std::replace(list.begin(), list.end(), ',', ' ');
    formats = split(list);
  }
  if (bc.n < 2 || bc.n > 16 || bc.mib <= 0 || bc.iters < 1 || bc.warmup < 0 || bc.pieces.empty() ||
      *std::min_element(bc.pieces.begin(), bc.pieces.end()) < 1 || rate <= 0) {
    std::fprintf(stderr, "bench_allreduce: need 2 <= --ranks <= 16, --mib > 0, --iters >= 1, --pieces >= 1, --rate > 0\n");
    return 2;
  }
  for (const auto& f : formats)
    if (!parse_format(f)) {
      std::fprintf(stderr, "bench_allreduce: unknown wire format %s (f32, bf16, f16)\n", f.c_str());
      return 2;
    }
  const bool gloo = !a.has("--no-gloo");
  if (gloo) {
    bc.gloo_skip = gloo_unavailable(bc.python);
    if (!bc.gloo_skip.empty()) std::printf("Gloo reference skipped: %s\n", bc.gloo_skip.c_str());
  }
  mesh::bench::install_signal_cleanup("bench_allreduce");

  std::vector<link_setup> links;
  if (!a.has("--no-loopback")) {
    link_setup l{"loopback", {}, std::vector<std::string>(bc.n, "127.0.0.1"), "lo", 0, ""};
    links.push_back(l);
  }
  std::optional<netns_topology> topo;
  if (a.has("--netns")) {
    topo = netns_topology::create(bc.n, rate, "mnar");
    if (!topo) {
      std::fprintf(stderr, "bench_allreduce: network namespace set-up failed (needs root, iproute2, tc tbf)\n");
      return 1;
    }
    const long delay_ms = a.num("--delay-ms", 0);
    if (delay_ms > 0)
      if (auto why = topo->add_delay(std::chrono::milliseconds(delay_ms)); !why.empty()) {
        std::fprintf(stderr, "bench_allreduce: %s\n", why.c_str());
        registry.remove_namespaces();
        return 1;
      }
    char name[64];
    if (delay_ms > 0) std::snprintf(name, sizeof name, "netns %g Gbit/s %ld ms", rate, delay_ms);
    else std::snprintf(name, sizeof name, "netns %g Gbit/s", rate);
    links.push_back({name, topo->ranks, topo->addresses, "eth0", rate * 1e9 / 8, topo->hub});
  }
  std::vector<row> rows;
  bool wrong = false;
  for (const auto& link : links) {
    for (const auto& f : formats) {
      const bool shaped = !link.hub.empty();
      uint64_t d0 = 0;
      for (int p : bc.pieces) {
        std::fprintf(stderr, "bench_allreduce: ours, %d pieces, %s, %s ...\n", p, link.name.c_str(), f.c_str());
        d0 = shaped ? tbf_drops(link.hub, link.namespaces) : 0;
        const uint64_t u0 = shaped ? udp_rcvbuf_errors(link.namespaces) : 0;
        rows.push_back({link.name, "ours/" + std::to_string(p), f, run_ours(bc, link, f, p), link.link_bytes_per_s});
        wrong = wrong || rows.back().m.wrong;
        if (shaped) {
          rows.back().m.drops = tbf_drops(link.hub, link.namespaces) - d0;
          rows.back().m.rcvbuf_drops = udp_rcvbuf_errors(link.namespaces) - u0;
        }
      }
      if (gloo) {
        std::fprintf(stderr, "bench_allreduce: gloo, %s, %s ...\n", link.name.c_str(), f.c_str());
        d0 = shaped ? tbf_drops(link.hub, link.namespaces) : 0;
        rows.push_back(run_gloo_row(bc, link, f));
        wrong = wrong || rows.back().m.wrong;
        if (shaped) rows.back().m.drops = tbf_drops(link.hub, link.namespaces) - d0;
      }
    }
  }
  registry.kill_children();
  registry.remove_namespaces();
  print_table(bc, rows);
  if (wrong) std::printf("\nFAILED: a rank failed or a result was wrong (see above)\n");
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) a.v.emplace_back(argv[i]);
  if (a.has("--help") || a.has("-h")) {
    std::printf(
        "bench_allreduce [--ranks 3] [--mib 64] [--iters 10] [--warmup 2] [--pieces 4[,16..]] [--formats f32,bf16]\n"
        "                [--netns] [--rate 1] [--delay-ms 0] [--no-loopback] [--no-gloo] [--python /usr/bin/python3] [--gloo-script PATH]\n"
        "                [--inject-error]  (self-test: a wrong input on rank 0 must fail the bench)\n"
        "Ring all-reduce bus bandwidth over the QUIC transport between rank processes, against PyTorch Gloo.\n"
        "--netns (root): also between network namespaces on a bridge, each rank's link shaped to --rate Gbit/s,\n"
        "with --delay-ms each way (an NFQUEUE delay line: this kernel has no netem).\n");
    return 0;
  }
  if (a.get("--rank")) return rank_main(a);
  return coordinator_main(a);
}
