// A discovery-only node for multi-daemon tests and benchmarks: runs one backend and prints each
// event as one tab-separated line on stdout:
//   <ms since start> <kind> <node id> <mesh id> <port> <addresses,comma-separated> <detail>
// It stops (withdrawing its announcement) when stdin reaches end of file, so a parent stops it
// by closing the pipe, and it never outlives its parent. The daemon used is the one on
// DBUS_SYSTEM_BUS_ADDRESS: one process per daemon, because libdbus reads that address once.
//
// usage: discovery_node avahi|dnssd <node id> <mesh id> <port> [service name]
#include <spdlog/cfg/env.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "discovery/backend.hpp"

using namespace mesh::discovery;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s avahi|dnssd <node id> <mesh id> <port> [service name]\n", argv[0]);
    return 2;
  }
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows the backends' debug lines
  const auto t0 = std::chrono::steady_clock::now();
  const std::string kind = argv[1];
  mdns_options options;
  if (argc > 5) options.service_name = argv[5];
  options.retry_initial = std::chrono::milliseconds(100);
  options.retry_max = std::chrono::milliseconds(1000);
  options.remind_every = std::chrono::milliseconds(1000);
  auto node = kind == "dnssd" ? make_dnssd_backend(options) : make_avahi_backend(options);
  announcement self{argv[2], argv[3], 1, static_cast<uint16_t>(std::stoi(argv[4])), "test node"};
  std::mutex out;
  auto started = node->start(self, [&](event e) {
    std::string addrs;
    for (const auto& a : e.peer.addresses) addrs += (addrs.empty() ? "" : ",") + a;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(out);
    std::printf("%lld\t%s\t%s\t%s\t%u\t%s\t%s\n", static_cast<long long>(ms), to_string(e.k),
                e.peer.node_id.c_str(), e.peer.mesh_id.c_str(), e.peer.port, addrs.c_str(),
                e.detail.c_str());
    std::fflush(stdout);
  });
  if (!started) {
    std::fprintf(stderr, "start failed: %s\n", started.error().to_string().c_str());
    return 1;
  }
  char buf[256];
  while (::read(0, buf, sizeof buf) > 0) {
  }
  node->stop();
  return 0;
}
