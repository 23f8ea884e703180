// Loss and delay without kernel help: a user-space UDP proxy between two endpoints drops 5% of
// the datagrams in each direction and delays the rest by 50 ms. Runs everywhere (no root).
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "endpoint_harness.hpp"
#include "impairment_proxy.hpp"

using namespace mesh::transport;
using mesh::node_id;
using namespace mesh::transport::test;
using namespace std::chrono_literals;
using mesh::test::impairment_proxy;

namespace {

}  // namespace

TEST_CASE("5% loss and 50 ms delay each way: interleaved control and bulk messages arrive whole, in the order sent", "[transport][endpoint][impaired]") {
  endpoint_config cfg;
  cfg.handshake_timeout = 10000ms;
  // Internet-sized packets, not loopback's 64 KB ones: a few hundred packets, so that 5% loss
  // certainly hits some of the data (with 64 KB packets the whole exchange is a dozen).
  cfg.loopback_udp_payload = 0;
  node a(cfg), b(cfg);
  impairment_proxy proxy(a.ep->port(), 0.05, 50ms);
  b.ep->dial(a.ep->id(), {"127.0.0.1:" + std::to_string(proxy.port())});
  REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }, 20s));
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }, 20s));

  // Control and bulk messages interleaved, each numbered in its first 4 bytes: the application
  // must see them in the order sent, whatever the losses did to the streams carrying them.
  // Loss-bound throughput (Mathis: ~MSS/RTT/sqrt(p), ~80 KB/s here) keeps the bulk part small.
  std::mt19937 rng(3);
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t i = 0; i < 320; ++i) {
    const bool bulk = i % 16 == 5;  // 20 bulk messages of 4 to 24 KiB among 300 control ones
    std::vector<uint8_t> m(bulk ? (4u << 10) + rng() % (20u << 10) : 4 + rng() % 60);
    for (size_t k = 4; k < m.size(); ++k) m[k] = static_cast<uint8_t>(k * 13 + i);
    std::memcpy(m.data(), &i, 4);
    sent.push_back(m);
    REQUIRE(b.ep->send(a.ep->id(), bulk ? channel::bulk : channel::control, std::move(m)));
  }
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == sent.size(); }, 90s));
  uint32_t expect = 0;
  for (auto& m : a.log.messages) {
    REQUIRE(m.bytes.size() >= 4);
    uint32_t got;
    std::memcpy(&got, m.bytes.data(), 4);
    CHECK(got == expect);
    CHECK(m.ch == (expect % 16 == 5 ? channel::bulk : channel::control));
    CHECK(m.bytes == sent[expect]);
    ++expect;
  }
  CHECK(expect == sent.size());
  CHECK(proxy.dropped() > 0);  // the impairment really happened
  auto st = b.ep->stats(a.ep->id());
  REQUIRE(st);
  CHECK(st->min_rtt >= 100ms);
  CHECK(st->packets_lost > 0);  // the sender saw the losses it recovered from
}

TEST_CASE("a connection survives the client's address changing", "[transport][endpoint][migration]") {
  node a, b;
  impairment_proxy proxy(a.ep->port(), 0.0, 0ms);
  b.ep->dial(a.ep->id(), {"127.0.0.1:" + std::to_string(proxy.port())});
  REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }));
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
  REQUIRE(b.ep->send(a.ep->id(), channel::control, {1}));
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 1; }));
  auto before = a.ep->stats(b.ep->id());
  REQUIRE(before);

  uint16_t new_port = proxy.rebind();  // as a NAT rebinding: same connection, new source port
  REQUIRE(b.ep->send(a.ep->id(), channel::control, {2}));
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 2; }));
  REQUIRE(a.ep->send(b.ep->id(), channel::control, {3}));
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == 1; }));
  CHECK(b.log.messages[0].bytes == std::vector<uint8_t>{3});
  auto after = a.ep->stats(b.ep->id());
  REQUIRE(after);
  CHECK(after->remote_address == "127.0.0.1:" + std::to_string(new_port));
  CHECK(after->remote_address != before->remote_address);
  CHECK(a.log.down.empty());
  CHECK(b.log.down.empty());
}

TEST_CASE("inbound half-open handshakes are bounded", "[transport][endpoint][limits]") {
  endpoint_config server_cfg;
  server_cfg.max_half_open = 2;
  server_cfg.retry_above_half_open = 1000;  // no Retry: blind clients get state, the bound sheds them
  server_cfg.accept_timeout = 2000ms;
  node server(server_cfg);
  // Three clients whose handshakes can never finish: the server's replies vanish.
  std::vector<std::unique_ptr<impairment_proxy>> holes;
  std::vector<std::unique_ptr<node>> stuck;
  for (int i = 0; i < 3; ++i) {
    holes.push_back(std::make_unique<impairment_proxy>(server.ep->port(), 0.0, 0ms, true));
    endpoint_config stuck_cfg;
    stuck_cfg.handshake_timeout = 1500ms;  // gone before the server's half-open slots free up
    stuck.push_back(std::make_unique<node>(stuck_cfg));
    stuck.back()->ep->dial(server.ep->id(), {"127.0.0.1:" + std::to_string(holes.back()->port())});
  }
  bool shed = false;
  for (int i = 0; i < 300 && !shed; ++i) {
    std::this_thread::sleep_for(10ms);
    auto k = server.ep->counters();
    shed = k.initials_shed > 0 && k.half_open == 2;
  }
  CHECK(shed);
  CHECK(server.ep->counters().half_open <= 2);
  CHECK(server.ep->counters().refused_global_full > 0);
  // Once the stuck handshakes time out (accept_timeout), a real client gets in (its Initial is
  // retransmitted).
  endpoint_config client_cfg;
  client_cfg.handshake_timeout = 10000ms;
  node client(client_cfg);
  client.ep->dial(server.ep->id(), {"127.0.0.1:" + std::to_string(server.ep->port())});
  REQUIRE(client.log.wait([&] { return !client.log.up.empty(); }, 15s));
  CHECK(server.ep->counters().accept_timeouts >= 2);
  stuck.clear();
  holes.clear();
}

TEST_CASE("with Retry, clients that cannot receive get no state at all", "[transport][endpoint][limits]") {
  endpoint_config server_cfg;
  server_cfg.max_half_open = 2;  // Retry is demanded always (the default)
  node server(server_cfg);
  std::vector<std::unique_ptr<impairment_proxy>> holes;
  std::vector<std::unique_ptr<node>> stuck;
  for (int i = 0; i < 3; ++i) {
    holes.push_back(std::make_unique<impairment_proxy>(server.ep->port(), 0.0, 0ms, true));
    stuck.push_back(std::make_unique<node>());
    stuck.back()->ep->dial(server.ep->id(), {"127.0.0.1:" + std::to_string(holes.back()->port())});
  }
  bool retried = false;
  for (int i = 0; i < 300 && !retried; ++i) {
    std::this_thread::sleep_for(10ms);
    retried = server.ep->counters().retries_sent >= 3;
  }
  CHECK(retried);
  CHECK(server.ep->counters().half_open == 0);
  CHECK(server.ep->counters().connections == 0);
  // A real client passes the Retry at once: the blind ones hold nothing.
  node client;
  const auto t0 = std::chrono::steady_clock::now();
  client.ep->dial(server.ep->id(), {"127.0.0.1:" + std::to_string(server.ep->port())});
  REQUIRE(client.log.wait([&] { return !client.log.up.empty(); }, 5s));
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  stuck.clear();
  holes.clear();
}

TEST_CASE("a full send queue pushes back until acknowledgements drain it", "[transport][endpoint][limits]") {
  endpoint_config cfg;
  cfg.max_queued_bytes = 1u << 20;
  cfg.idle_timeout = 20000ms;
  node a(cfg), b(cfg);
  impairment_proxy proxy(a.ep->port(), 0.0, 0ms);
  b.ep->dial(a.ep->id(), {"127.0.0.1:" + std::to_string(proxy.port())});
  REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }));
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
  proxy.set_loss(1.0);  // nothing gets through, so nothing is acknowledged
  REQUIRE(b.ep->send(a.ep->id(), channel::bulk, std::vector<uint8_t>(700u << 10, 1)));
  auto full = b.ep->send(a.ep->id(), channel::bulk, std::vector<uint8_t>(700u << 10, 2));
  REQUIRE_FALSE(full);
  CHECK(full.error().code == mesh::error_code::limit_exceeded);
  CHECK(full.error().message.find("queue") != std::string::npos);
  CHECK(b.ep->send(a.ep->id(), channel::heartbeat, {1}));  // datagrams are not queued: never refused
  proxy.set_loss(0.0);
  REQUIRE(a.log.wait([&] { return a.log.messages.size() >= 1; }, 20s));
  bool accepted = false;
  for (int i = 0; i < 500 && !accepted; ++i) {
    accepted = bool(b.ep->send(a.ep->id(), channel::bulk, std::vector<uint8_t>(700u << 10, 2)));
    if (!accepted) std::this_thread::sleep_for(10ms);
  }
  CHECK(accepted);
}
