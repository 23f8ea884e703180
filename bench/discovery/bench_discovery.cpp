// Time from start to first peer found, on loopback and across namespaces, against avahi's own
// tools as the reference measured in the same run (the floor set by mDNS probing), and time for
// 8 nodes in 8 namespaces to converge. Needs root. Usage: bench_discovery [repeats]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "discovery/lab/avahi_lab.hpp"
#include "discovery/lab/node_process.hpp"

using namespace mesh::discovery;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// Ids differ in their first hex digits, as random keys do, so that default service names
// ("meshnode-<12 hex>") do not collide.
std::string id_of(int n) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", n + 1);
  return hex + std::string(56, 'a');
}

announcement node(int n, std::string mesh = "bench") { return {id_of(n), std::move(mesh), 1, uint16_t(6000 + n), "bench"}; }

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// Reference: avahi's own tools. An avahi-browse on `browse_bus` is running; an avahi-publish on
// `publish_bus` starts at t0; the time until avahi-browse prints the resolved service.
double reference_ms(const std::string& browse_bus, const std::string& publish_bus, int round) {
  const std::string type = "_meshref" + std::to_string(round) + "._udp";
  // The first line is the shell's pid, which `exec` hands to timeout: stop it by that pid.
  FILE* browse = ::popen(("echo $$; DBUS_SYSTEM_BUS_ADDRESS=" + browse_bus + " exec timeout 20 avahi-browse -r -p " + type).c_str(), "r");
  if (!browse) return -1;
  char line[1024];
  if (!std::fgets(line, sizeof line, browse)) {
    ::pclose(browse);
    return -1;
  }
  const int browse_pid = std::atoi(line);
  std::this_thread::sleep_for(300ms);  // let the browser start
  const auto t0 = clock_type::now();
  const int pub = lab::spawn("DBUS_SYSTEM_BUS_ADDRESS=" + publish_bus + " timeout 20 avahi-publish -s ref " + type + " 7000");
  double result = -1;
  while (std::fgets(line, sizeof line, browse)) {
    if (line[0] == '=') {
      result = ms_since(t0);
      break;
    }
  }
  if (pub > 0) ::kill(pub, SIGTERM);
  if (browse_pid > 0) ::kill(browse_pid, SIGTERM);
  ::pclose(browse);
  return result;
}

struct pair_result {
  double found_first = -1;  // the new node's first peer (already announced) found
  double found_by = -1;     // the new node found by the node already running
};

pair_result measure_pair(lab::host& ha, lab::host& hb, int round) {
  const announcement a = node(100 + round * 2), b = node(101 + round * 2);
  test::node_process na("avahi", a, ha.bus_address());
  if (!na.log().wait_for(event::backend_up, "", 10s)) return {};
  std::this_thread::sleep_for(1500ms);  // a's announcement is established (probing done)
  const auto t0 = clock_type::now();
  test::node_process nb("avahi", b, hb.bus_address());
  pair_result r;
  if (nb.log().wait_for(event::peer_found, a.node_id, 20s)) r.found_first = ms_since(t0);
  if (na.log().wait_for(event::peer_found, b.node_id, 20s)) r.found_by = ms_since(t0);
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void report_pairs(const char* where, lab::host& ha, lab::host& hb, int repeats) {
  std::vector<double> first, by, ref;
  for (int i = 0; i < repeats; ++i) {
    auto r = measure_pair(ha, hb, i);
    if (r.found_first >= 0) first.push_back(r.found_first);
    if (r.found_by >= 0) by.push_back(r.found_by);
    const double f = reference_ms(ha.bus_address(), hb.bus_address(), i);
    if (f >= 0) ref.push_back(f);
  }
  const double floor = median(ref);
  std::printf("%-10s start -> first peer found        median %7.0f ms (n=%zu)\n", where, median(first), first.size());
  std::printf("%-10s start -> found by running peer   median %7.0f ms (n=%zu)\n", where, median(by), by.size());
  std::printf("%-10s reference avahi-publish -> avahi-browse median %7.0f ms (n=%zu)\n", where, floor, ref.size());
  if (floor > 0) {
    std::printf("%-10s found-by vs reference: %+.0f ms, ratio %.2f\n", where, median(by) - floor, median(by) / floor);
  }
}

// 8 hosts on a bridge, one node each, all started at once; with `same_name` every node
// announces one service name (the worst case of name conflicts).
void converge(bool same_name) {
  constexpr int n = 8;
  lab::bridge br(same_name ? "sbr" : "cbr");
  std::vector<std::unique_ptr<lab::host>> hosts;
  for (int i = 0; i < n; ++i) {
    // Names built with append: `"literal" + std::string&&` trips a false -Wrestrict in g++ 12 -O2.
    std::string name(same_name ? "s" : "c"), address("10.77.0.");
    name.append(std::to_string(i));
    address.append(std::to_string(i + 1));
    hosts.push_back(std::make_unique<lab::host>(name, br.netns(), address));
    if (!hosts.back()->start_daemon()) return;
  }
  std::this_thread::sleep_for(1500ms);  // the daemons' host names are probed
  const auto t0 = clock_type::now();
  std::vector<std::unique_ptr<test::node_process>> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(std::make_unique<test::node_process>("avahi", node(i), hosts[i]->bus_address(),
                                                         same_name ? "meshnode-same" : ""));
  }
  bool all = true;
  for (int i = 0; i < n && all; ++i) {
    for (int j = 0; j < n && all; ++j) {
      if (i != j) all = nodes[i]->log().wait_for(event::peer_found, id_of(j), 30s);
    }
  }
  const double converged = all ? ms_since(t0) : -1;
  std::printf("netns      8 nodes on 8 hosts%s: all 56 peer_found after %7.0f ms%s\n",
              same_name ? ", one service name" : "", converged, all ? "" : " (NOT within 30 s)");
}

}  // namespace

int main(int argc, char** argv) {
  if (auto why = lab::reason_unavailable()) {
    std::printf("bench_discovery: cannot run: %s\n", why->c_str());
    return 1;
  }
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  {
    lab::host h("blo");
    if (!h.start_daemon()) return 1;
    report_pairs("loopback", h, h, repeats);
  }
  {
    lab::bridge br("bbr");
    lab::host h1("b1", br.netns(), "10.77.0.1"), h2("b2", br.netns(), "10.77.0.2");
    if (!h1.start_daemon() || !h2.start_daemon()) return 1;
    report_pairs("netns", h1, h2, repeats);
  }
  converge(false);
  converge(true);
  return 0;
}
