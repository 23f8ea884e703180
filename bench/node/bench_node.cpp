// bench_node: figures for the node layer, with their reference measured in the same run.
//
//   tiny job round trip   client -> node -> executor -> client, y = x + 1 on 4 floats; the
//                         reference is a status request on the same connection (the messaging
//                         floor: same path without planning or execution)
//   failure detection     time from SIGKILL of a peer until the survivor declares it Dead,
//                         over N kills (polled every 20 ms through the client API)
// Usage: bench_node [kills=20] [jobs=300] [poll_ms=20]
// BENCH_DEBUG=1 prints a timeline; BENCH_NODE_LOG=debug sets the nodes' log level.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "client/client.hpp"
#include "graph/builder.hpp"

using namespace mesh;
using clock_type = std::chrono::steady_clock;

namespace {

pid_t start_node(const std::string& dir, const std::vector<std::string>& extra) {
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir + "/endpoint");
  std::vector<std::string> args = {MESHNODE_BIN, "--state-dir", dir, "--port", "0", "--device", "cpu", "--log-level", std::getenv("BENCH_NODE_LOG") ? std::getenv("BENCH_NODE_LOG") : "warn", "--mdns", "off",
                                   "--open"};  // the benchmark measures the mesh, not admission: its clients need no token
  args.insert(args.end(), extra.begin(), extra.end());
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen((dir + "/node.log").c_str(), "a", stdout);
    (void)f;
    dup2(1, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

std::string wait_endpoint(const std::string& dir) {
  for (int i = 0; i < 600; ++i) {
    std::ifstream f(dir + "/endpoint");
    std::string line;
    if (std::getline(f, line) && !line.empty()) return line;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return {};
}

void stop(pid_t pid, int sig = SIGKILL) {
  kill(pid, sig);
  waitpid(pid, nullptr, 0);
}

double percentile(std::vector<double> xs, double p) {
  std::sort(xs.begin(), xs.end());
  return xs[static_cast<size_t>(p * static_cast<double>(xs.size() - 1))];
}

int slow_status = 0, failed_status = 0;
const auto bench_start = std::chrono::steady_clock::now();
void debug(const char* what) {
  if (std::getenv("BENCH_DEBUG"))
    std::fprintf(stderr, "%8.3f s  %s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count(), what);
}

/// How `which` appears in the node's peer list: "healthy", "suspect", or "" once it is gone
/// (a Dead peer is dropped from the list). A failed status request is retried, not taken as gone.
std::string health_of(client& c, const std::string& which) {
  for (;;) {
    const auto t0 = clock_type::now();
    auto s = c.status(std::chrono::seconds(2));
    if (clock_type::now() - t0 > std::chrono::milliseconds(100)) ++slow_status;
    if (!s) {
      ++failed_status;
      debug(("status failed: " + s.error().message).c_str());
      if (failed_status > 20) return "";
      continue;
    }
    for (auto& p : s->peers)
      if (p.node.to_string() == which) return to_string(p.health);
    return "";
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int kills = argc > 1 ? std::atoi(argv[1]) : 20;
  const int jobs = argc > 2 ? std::atoi(argv[2]) : 300;
  // How often the survivor is asked (the resolution of the detection figure).
  const int poll_ms = argc > 3 ? std::atoi(argv[3]) : 20;
  char tmpl[] = "/tmp/bench-node-XXXXXX";
  const std::string root = mkdtemp(tmpl);

  const pid_t a = start_node(root + "/a", {});
  const std::string ea = wait_endpoint(root + "/a");
  auto c = client::connect(ea);
  if (!c) {
    std::fprintf(stderr, "bench_node: %s\n", c.error().message.c_str());
    stop(a);
    return 1;
  }

  // Tiny job round trip, against a status round trip on the same connection.
  builder b;
  auto x = b.input("x", dtype::f32, {4});
  b.output("y", x + 1.0);
  const graph g = *b.finish();
  const tensor_map in{{"x", tensor::from_floats({4}, {1, 2, 3, 4})}};
  std::vector<double> job_us, status_us;
  for (int i = 0; i < (jobs > 0 ? jobs + 20 : 0); ++i) {
    const auto t0 = clock_type::now();
    auto r = (*c)->run(g, in, {});
    const auto t1 = clock_type::now();
    auto s = (*c)->status();
    const auto t2 = clock_type::now();
    if (!r || !s) {
      std::fprintf(stderr, "bench_node: %s\n", (!r ? r.error() : s.error()).message.c_str());
      c->reset();
      stop(a);
      return 1;
    }
    if (i < 20) continue;  // warm-up: kernel cache, connection windows
    job_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    status_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  if (!job_us.empty()) {
  std::printf("tiny job round trip (%d runs): median %.0f us, p99 %.0f us\n", jobs, percentile(job_us, 0.5),
              percentile(job_us, 0.99));
  std::printf("status round trip, same connection (reference): median %.0f us, p99 %.0f us\n", percentile(status_us, 0.5),
              percentile(status_us, 0.99));
  std::printf("ratio job / messaging floor (median): %.2f\n", percentile(job_us, 0.5) / percentile(status_us, 0.5));
  }

  // Failure detection: start a peer, wait until a sees it healthy, SIGKILL it, time until a has
  // declared it Dead (dropped it).
  std::vector<double> detect_ms;
  for (int k = 0; k < kills; ++k) {
    const std::string dir = root + "/victim";
    const pid_t v = start_node(dir, {"--peer", ea});
    const std::string ev = wait_endpoint(dir);
    const std::string vid = ev.substr(0, ev.find('@'));
    debug("victim listening");
    const auto until = clock_type::now() + std::chrono::seconds(30);
    while (health_of(**c, vid) != "healthy" && clock_type::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    debug("victim healthy");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // some heartbeat history
    const auto t0 = clock_type::now();
    stop(v);
    debug("victim killed");
    while (!health_of(**c, vid).empty()) std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
    detect_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  if (!detect_ms.empty())
    std::printf("failure detection over %d SIGKILLs (dead_after 2500 ms, heartbeats 250 ms): median %.0f ms, max %.0f ms\n",
                kills, percentile(detect_ms, 0.5), *std::max_element(detect_ms.begin(), detect_ms.end()));
  std::printf("status requests slower than 100 ms: %d, failed: %d\n", slow_status, failed_status);
  c->reset();
  stop(a, SIGTERM);
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return 0;
}
