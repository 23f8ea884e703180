// The handshake-flood attack test (docs/security.md, "Handshake floods"): a real endpoint with
// default limits under >= 1,000 QUIC handshake attempts a second from throwaway keys, eight
// loopback source addresses and many ports, while peers with the mesh secret connect.
#include <catch2/catch.hpp>
#include <sodium.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "endpoint_harness.hpp"
#include "flooder.hpp"

using namespace mesh::transport;
using namespace mesh::transport::test;
using namespace std::chrono_literals;
using mesh::node_id;

namespace {
endpoint_config with_secret() {
  endpoint_config c;
  c.mesh_secret.assign(32, 0x5a);
  return c;
}
}  // namespace

TEST_CASE("a handshake flood from many keys and addresses keeps no peer with the secret out", "[transport][endpoint][flood]") {
  node server(with_secret());
  REQUIRE(server.ep);
  const endpoint_config limits;  // the server runs with the defaults
  std::vector<std::string> sources;
  for (int i = 2; i <= 9; ++i) sources.push_back("127.0.0." + std::to_string(i));
  flooder flood(server.ep->port(), server.ep->id(), sources, 4, 32);
  REQUIRE(flood.ready());
  REQUIRE(flood.sockets() == 32);
  constexpr double rate = 1200;  // attempts per second
  flood.start(rate, 10s);

  // Sample the server's bounds while the flood runs.
  std::atomic<bool> sampling{true};
  endpoint_counters peak{};
  std::thread sampler([&] {
    while (sampling) {
      auto k = server.ep->counters();
      peak.connections = std::max(peak.connections, k.connections);
      peak.half_open = std::max(peak.half_open, k.half_open);
      std::this_thread::sleep_for(20ms);
    }
  });

  // Legitimate peers dial during the flood (from 127.0.0.1, an address of their own).
  std::vector<std::chrono::milliseconds> connect_times;
  std::vector<node_id> legit;
  std::this_thread::sleep_for(1500ms);  // the flood is in full swing: the half-open table is full
  for (int i = 0; i < 4; ++i) {
    node peer(with_secret());
    REQUIRE(peer.ep);
    legit.push_back(peer.ep->id());
    const auto t0 = std::chrono::steady_clock::now();
    peer.ep->dial(server.ep->id(), {server.address()});
    REQUIRE(peer.log.wait([&] { return !peer.log.up.empty(); }, 5s));
    connect_times.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0));
    REQUIRE(peer.ep->send(server.ep->id(), channel::control, {1, 2, 3}));
    REQUIRE(server.log.wait([&] { return server.log.messages.size() == legit.size(); }, 5s));
    std::this_thread::sleep_for(1500ms);
  }
  while (flood.running()) std::this_thread::sleep_for(50ms);
  sampling = false;
  sampler.join();
  const auto fs = flood.stats();
  const auto k = server.ep->counters();
  for (size_t i = 0; i < connect_times.size(); ++i) INFO("peer " << i << " connected in " << connect_times[i].count() << " ms");
  INFO("flood: " << fs.attempts << " attempts, " << fs.retries << " Retries answered, " << fs.handshakes
                 << " TLS handshakes finished, flooder peak " << fs.peak_live << " live attempts");
  INFO("server: retries " << k.retries_sent << ", refused source_full " << k.refused_source_full << " source_rate "
                          << k.refused_source_rate << " global_full " << k.refused_global_full << " invalid_token "
                          << k.refused_invalid_token << ", evicted " << k.evicted << ", accept timeouts "
                          << k.accept_timeouts << ", peak connections " << peak.connections << ", peak half-open "
                          << peak.half_open);
  WARN("flood " << fs.attempts << " attempts in 10 s; legit connect ms " << connect_times[0].count() << " "
                << connect_times[1].count() << " " << connect_times[2].count() << " " << connect_times[3].count()
                << "; server retries " << k.retries_sent << " source_full " << k.refused_source_full << " source_rate "
                << k.refused_source_rate << " global_full " << k.refused_global_full << " evicted " << k.evicted
                << " accept_timeouts " << k.accept_timeouts << " peak half-open " << peak.half_open
                << " peak connections " << peak.connections << " flood handshakes " << fs.handshakes);
  CHECK(fs.attempts >= 10'000);  // >= 1,000 a second for 10 s
  // Kept out, a peer would not connect within the handshake timeout (5 s): a full table drops its
  // Initials until an attempt's slot frees. Admitted, it connects in well under a second on a
  // quiet machine; the bound leaves room for this 2-core machine under ASan sharing its cores
  // with the flood (1.0-1.7 s seen).
  for (auto t : connect_times) CHECK(t < 2500ms);
  // Admission before state: the table never grew beyond its bounds (the legitimate peers'
  // connections, one at a time, come on top of the half-open ones).
  CHECK(peak.half_open <= limits.max_half_open);
  CHECK(peak.connections <= limits.max_half_open + 2);
  CHECK(k.retries_sent >= fs.attempts / 2);      // the flood met address validation
  CHECK(k.refused_source_full + k.refused_source_rate > 0);  // and the per-source bounds
  // Nothing of the flood was delivered: only the legitimate peers came up and spoke.
  std::lock_guard lock(server.log.mu);
  CHECK(server.log.messages.size() == legit.size());
  for (const auto& m : server.log.messages) CHECK(std::find(legit.begin(), legit.end(), m.from) != legit.end());
  for (const auto& id : server.log.up) CHECK(std::find(legit.begin(), legit.end(), id) != legit.end());
}
