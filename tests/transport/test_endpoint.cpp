#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <cstring>
#include <thread>

#include "endpoint_harness.hpp"

using namespace mesh::transport;
using mesh::node_id;
using namespace mesh::transport::test;
using namespace std::chrono_literals;

namespace {

endpoint_config config_with_secret(uint8_t secret_byte) {
  endpoint_config c;
  c.mesh_secret.assign(32, secret_byte);
  return c;
}

// Connects b to a and waits until both report the other up.
void connect(node& a, node& b) {
  b.ep->dial(a.ep->id(), {a.address()});
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
  REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }));
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

std::array<uint8_t, 32> checksum(const std::vector<uint8_t>& v) {
  std::array<uint8_t, 32> h{};
  crypto_generichash(h.data(), h.size(), v.data(), v.size(), nullptr, 0);
  return h;
}

}  // namespace

TEST_CASE("endpoints connect and admit and exchange messages on every channel", "[transport][endpoint]") {
  node a(config_with_secret(7)), b(config_with_secret(7));
  REQUIRE(a.ep);
  REQUIRE(b.ep);
  connect(a, b);
  CHECK(a.log.up.front() == b.ep->id());
  CHECK(b.log.up.front() == a.ep->id());

  REQUIRE(b.ep->send(a.ep->id(), channel::control, {1, 2, 3}));
  REQUIRE(a.ep->send(b.ep->id(), channel::bulk, pattern(100000, 1)));
  REQUIRE(a.ep->send(b.ep->id(), channel::heartbeat, {9}));
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 1; }));
  CHECK(a.log.messages[0].from == b.ep->id());
  CHECK(a.log.messages[0].ch == channel::control);
  CHECK(a.log.messages[0].bytes == std::vector<uint8_t>{1, 2, 3});
  // The heartbeat is a datagram and may in principle be lost; on loopback it is not.
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == 2; }));
  bool saw_bulk = false, saw_heartbeat = false;
  for (auto& m : b.log.messages) {
    if (m.ch == channel::bulk) saw_bulk = m.bytes == pattern(100000, 1);
    if (m.ch == channel::heartbeat) saw_heartbeat = m.bytes == std::vector<uint8_t>{9};
  }
  CHECK(saw_bulk);
  CHECK(saw_heartbeat);

  auto st = a.ep->stats(b.ep->id());
  REQUIRE(st);
  CHECK(st->bytes_sent > 100000);
  CHECK(st->smoothed_rtt.count() > 0);
  CHECK(a.ep->peers() == std::vector<node_id>{b.ep->id()});
}

TEST_CASE("send refuses unknown peers and oversized messages", "[transport][endpoint]") {
  endpoint_config cfg;
  cfg.limits.control = 10;
  node a(cfg), b;
  auto r = a.ep->send(b.ep->id(), channel::control, {1});
  REQUIRE_FALSE(r);
  CHECK(r.error().code == mesh::error_code::network);
  auto big = a.ep->send(b.ep->id(), channel::control, std::vector<uint8_t>(11));
  REQUIRE_FALSE(big);
  CHECK(big.error().code == mesh::error_code::limit_exceeded);
}

TEST_CASE("a wrong mesh secret is refused on both sides", "[transport][endpoint][admission]") {
  node a(config_with_secret(1)), b(config_with_secret(2));
  b.ep->dial(a.ep->id(), {a.address()});
  REQUIRE(a.log.wait([&] { return !a.log.failed.empty(); }));
  REQUIRE(b.log.wait([&] { return !b.log.failed.empty(); }));
  CHECK(a.log.failed[0].second.find("admission") != std::string::npos);
  CHECK(b.log.failed[0].second.find("admission") != std::string::npos);
  CHECK(a.log.up.empty());
  CHECK(b.log.up.empty());
  CHECK(a.log.messages.empty());
  CHECK_FALSE(a.ep->send(b.ep->id(), channel::control, {1}));
}

TEST_CASE("a protocol version mismatch is refused with a clear reason", "[transport][endpoint][admission]") {
  endpoint_config ca, cb;
  ca.protocol_version = 1;
  cb.protocol_version = 2;
  node a(ca), b(cb);
  b.ep->dial(a.ep->id(), {a.address()});
  REQUIRE(a.log.wait([&] { return !a.log.failed.empty(); }));
  REQUIRE(b.log.wait([&] { return !b.log.failed.empty(); }));
  CHECK(a.log.failed[0].second.find("version") != std::string::npos);
  CHECK(b.log.failed[0].second.find("version") != std::string::npos);
  CHECK(a.log.up.empty());
}

TEST_CASE("dialing the wrong node id fails the TLS handshake on both sides", "[transport][endpoint][tls]") {
  node a, b;
  auto impostor = identity::generate().id();
  b.ep->dial(impostor, {a.address()});
  REQUIRE(b.log.wait([&] { return !b.log.failed.empty(); }));
  CHECK(b.log.failed[0].second.find("expected " + impostor.to_string()) != std::string::npos);
  // The acceptor never saw the dialer's key (the dialer aborted first): it logs the reason.
  REQUIRE(a.log.wait([&] {
    for (auto& l : a.log.logs)
      if (l.find("TLS handshake failed") != std::string::npos) return true;
    return false;
  }));
  CHECK(a.log.up.empty());
  CHECK(b.log.up.empty());
}

TEST_CASE("dial falls back to the next address", "[transport][endpoint]") {
  endpoint_config cb;
  cb.handshake_timeout = 300ms;
  node a, b(cb);
  // Nothing listens on port 9 of loopback; the second address is right.
  b.ep->dial(a.ep->id(), {"127.0.0.1:9", a.address()});
  bool up = b.log.wait([&] { return !b.log.up.empty(); });
  for (auto& l : b.log.logs) UNSCOPED_INFO(l);
  for (auto& f : b.log.failed) UNSCOPED_INFO(f.second);
  REQUIRE(up);
  CHECK(b.log.failed.empty());
}

TEST_CASE("dials past the half-open bound fail at once, and the bound frees as dials end", "[transport][endpoint]") {
  // Peer exchange names nodes and addresses that a remote node chooses: however many it names,
  // the dials under way stay bounded.
  endpoint_config c;
  c.max_half_open = 2;
  c.handshake_timeout = 1500ms;
  node a(c), b;
  REQUIRE(a.ep);
  std::vector<node_id> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(identity::generate().id());
  for (const auto& id : ids) a.ep->dial(id, {"127.0.0.1:9"});  // nothing answers there
  REQUIRE(a.log.wait([&] { return !a.log.failed.empty(); }, 1000ms));
  {
    std::lock_guard l(a.log.mu);
    CHECK(a.log.failed.front().first == ids[2]);
    CHECK(a.log.failed.front().second.find("not dialed") != std::string::npos);
  }
  // Once the two attempts time out, a dial goes through again.
  REQUIRE(a.log.wait([&] { return a.log.failed.size() >= 3; }, 10s));
  a.ep->dial(b.ep->id(), {b.address()});
  CHECK(a.log.wait([&] { return !a.log.up.empty(); }));
}

TEST_CASE("1000 small messages sent after a bulk message arrive after it, in order", "[transport][endpoint]") {
  node a, b;
  connect(a, b);
  const size_t bulk_size = 48u << 20;
  REQUIRE(a.ep->send(b.ep->id(), channel::bulk, pattern(bulk_size, 5)));
  for (uint32_t i = 0; i < 1000; ++i) {
    std::vector<uint8_t> m(4);
    std::memcpy(m.data(), &i, 4);
    REQUIRE(a.ep->send(b.ep->id(), channel::control, std::move(m)));
  }
  auto all_sent = std::chrono::steady_clock::now();
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == 1001; }, 120s));
  uint32_t expect = 0;
  size_t bulk_position = 0;
  for (size_t i = 0; i < b.log.messages.size(); ++i) {
    auto& m = b.log.messages[i];
    if (m.ch == channel::bulk) {
      bulk_position = i;
      CHECK(m.bytes.size() == bulk_size);
      continue;
    }
    uint32_t got;
    std::memcpy(&got, m.bytes.data(), 4);
    CHECK(got == expect);
    ++expect;
  }
  CHECK(expect == 1000);
  // The order the application sees is the order sent: the control messages, which travel on
  // their own stream and may arrive first, wait for the bulk message queued before them.
  CHECK(bulk_position == 0);
  (void)all_sent;
}

TEST_CASE("a burst of 50000 small messages in 64 KB loopback packets arrives whole and in order",
          "[transport][endpoint]") {
  // A 64 KB packet holds over a thousand tiny messages, each added by one ngtcp2 call: the write
  // loop's bound then ends in the middle of a packet, which must be finished before the next
  // read (ngtcp2 aborts the process otherwise: this test did, before the fix).
  node a, b;
  connect(a, b);
  const uint32_t count = 50000;
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<uint8_t> m(4);
    std::memcpy(m.data(), &i, 4);
    REQUIRE(a.ep->send(b.ep->id(), channel::control, std::move(m)));
  }
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == count; }, 120s));
  bool in_order = true;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t got;
    std::memcpy(&got, b.log.messages[i].bytes.data(), 4);
    in_order = in_order && got == i;
  }
  CHECK(in_order);
}

TEST_CASE("bulk scheduling: every policy delivers in send order, oldest and shortest first finish one by one, round robin all at the end",
          "[transport][endpoint]") {
  // Four nearly equal bulk messages queued at once, each a few bytes shorter than the one
  // before (as the pieces of an all-reduce are), then one an eighth of their size. The
  // application sees them in send order under every policy (the receiver's inbox restores it).
  // Oldest-first sends them one after the other, so the first arrives well before the last:
  // after a quarter of the time on an idle link, 0.46-0.65 of it measured on the 2-core ASan
  // build (the first message also pays the connection's ramp-up). Shortest-first sends the small
  // one first (it then waits at the receiver) and the four in send order (sizes within a quarter
  // of each other count as equal). Round robin interleaves their packets, so the four arrive
  // close to the end (0.93-0.99 of it). Ratios of arrival times, not speeds: they hold on a slow
  // (ASan) build too.
  const size_t size = 6u << 20;
  for (auto order : {endpoint_config::bulk_order::oldest_first, endpoint_config::bulk_order::shortest_first,
                     endpoint_config::bulk_order::round_robin}) {
    endpoint_config cfg;
    cfg.bulk_scheduling = order;
    node a(cfg), b;
    connect(a, b);
    std::vector<std::vector<uint8_t>> messages;
    for (uint8_t k = 0; k < 5; ++k) {
      messages.push_back(pattern(k < 4 ? size - 64 * k : size / 8, 20 + k));
      messages.back()[0] = k;  // which message it is
    }
    const auto start = std::chrono::steady_clock::now();  // all queued within microseconds
    for (auto& m : messages) REQUIRE(a.ep->send(b.ep->id(), channel::bulk, std::move(m)));
    REQUIRE(b.log.wait([&] { return b.log.messages.size() == 5; }, 120s));
    const auto since = [&](size_t i) { return std::chrono::duration<double>(b.log.messages[i].at - start).count(); };
    std::vector<int> arrival;  // message ids in arrival order
    for (const auto& m : b.log.messages) arrival.push_back(m.bytes[0]);
    INFO("arrival order " << arrival[0] << arrival[1] << arrival[2] << arrival[3] << arrival[4]);
    CHECK(arrival == std::vector<int>{0, 1, 2, 3, 4});
    INFO("first arrival " << since(0) << " s, last large " << since(3) << " s");
    if (order != endpoint_config::bulk_order::round_robin)
      CHECK(since(0) < 0.72 * since(3));
    else
      CHECK(since(0) > 0.75 * since(3));
  }
}

TEST_CASE("large transfers both ways arrive intact", "[transport][endpoint]") {
  // The issue asks for 1 GiB each way; under ASan in Debug that takes minutes on two cores, so
  // the test moves 96 MiB each way and bench_transport moves the full 1 GiB.
  const size_t size = 96u << 20;
  node a, b;
  connect(a, b);
  auto to_b = pattern(size, 11), to_a = pattern(size, 12);
  auto sum_b = checksum(to_b), sum_a = checksum(to_a);
  REQUIRE(a.ep->send(b.ep->id(), channel::bulk, std::move(to_b)));
  REQUIRE(b.ep->send(a.ep->id(), channel::bulk, std::move(to_a)));
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == 1; }, 150s));
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 1; }, 150s));
  CHECK(b.log.messages[0].bytes.size() == size);
  CHECK(checksum(b.log.messages[0].bytes) == sum_b);
  CHECK(checksum(a.log.messages[0].bytes) == sum_a);
}

TEST_CASE("disconnect reports the peer down on both sides", "[transport][endpoint]") {
  node a, b;
  connect(a, b);
  a.ep->disconnect(b.ep->id());
  REQUIRE(a.log.wait([&] { return !a.log.down.empty(); }));
  REQUIRE(b.log.wait([&] { return !b.log.down.empty(); }));
  CHECK(b.log.down[0].first == a.ep->id());
  CHECK(b.log.down[0].second.reason.find("closed by the peer") != std::string::npos);
  // A deliberate close, told by its close code: orderly on both sides.
  CHECK(b.log.down[0].second.orderly);
  CHECK(a.log.down[0].second.orderly);
  CHECK(b.ep->peers().empty());
}

TEST_CASE("stopping an endpoint closes its connections cleanly", "[transport][endpoint]") {
  node a, b;
  connect(a, b);
  b.ep->stop();
  REQUIRE(a.log.wait([&] { return !a.log.down.empty(); }, 5s));
  CHECK(a.log.down[0].second.reason.find("shutting down") != std::string::npos);
  CHECK(a.log.down[0].second.orderly);
}

TEST_CASE("garbage datagrams do no harm", "[transport][endpoint]") {
  node a, b;
  int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(a.ep->port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 2000; ++i) {
    auto junk = pattern(static_cast<size_t>(1 + (i * 37) % 1500), static_cast<uint32_t>(i));
    if (i % 3 == 0) junk[0] = 0xc0;  // long header, QUIC v1, the rest random
    if (i % 3 == 0 && junk.size() > 4) junk[1] = junk[2] = junk[3] = 0, junk[4] = 1;
    ::sendto(s, junk.data(), junk.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  }
  ::close(s);
  for (int i = 0; i < 100 && a.ep->counters().packets_dropped < 1000; ++i) std::this_thread::sleep_for(10ms);
  CHECK(a.ep->counters().packets_dropped >= 1000);  // most are dropped before any state exists
  CHECK(a.ep->counters().connections == 0);
  connect(a, b);  // still accepting and admitting
  REQUIRE(b.ep->send(a.ep->id(), channel::control, {42}));
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 1; }));
  CHECK(a.log.messages[0].bytes == std::vector<uint8_t>{42});
}

TEST_CASE("a killed peer is reported down", "[transport][endpoint]") {
  // The peer runs in a child process so that it can really die (SIGKILL: no close packet).
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  auto child_id = identity::generate();
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    endpoint_config cfg;
    cfg.id = child_id;
    cfg.bind = "127.0.0.1";
    auto e = endpoint::start(cfg, {});
    uint16_t port = e ? (*e)->port() : 0;
    [[maybe_unused]] auto w = ::write(ready[1], &port, sizeof(port));
    for (int i = 0; i < 600; ++i) ::usleep(100000);  // bounded: the parent kills it long before
    ::_exit(0);
  }
  ::close(ready[1]);
  uint16_t port = 0;
  REQUIRE(::read(ready[0], &port, sizeof(port)) == sizeof(port));
  ::close(ready[0]);
  struct reaper {
    pid_t pid;
    ~reaper() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } guard{pid};
  REQUIRE(port != 0);

  endpoint_config cfg;
  cfg.idle_timeout = 1500ms;
  cfg.keep_alive = 300ms;
  node a(cfg);
  a.ep->dial(child_id.id(), {"127.0.0.1:" + std::to_string(port)});
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
  // Mid-transfer: a bulk message is in flight when the peer dies.
  REQUIRE(a.ep->send(child_id.id(), channel::bulk, pattern(32u << 20, 3)));
  std::this_thread::sleep_for(50ms);
  ::kill(pid, SIGKILL);
  REQUIRE(a.log.wait([&] { return !a.log.down.empty(); }, 10s));
  CHECK(a.log.down[0].first == child_id.id());
  CHECK(a.log.down[0].second.reason.find("idle timeout") != std::string::npos);
  CHECK_FALSE(a.log.down[0].second.orderly);  // a killed peer failed: it did not leave
  CHECK(a.ep->peers().empty());
}

TEST_CASE("simultaneous dials leave exactly one connection", "[transport][endpoint]") {
  node a, b;
  a.ep->dial(b.ep->id(), {b.address()});
  b.ep->dial(a.ep->id(), {a.address()});
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
  REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }));
  std::this_thread::sleep_for(300ms);
  REQUIRE(a.ep->send(b.ep->id(), channel::control, {5}));
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == 1; }));
  CHECK(a.log.up.size() == 1);
  CHECK(b.log.up.size() == 1);
  CHECK(a.log.down.empty());
  CHECK(b.log.down.empty());
}

TEST_CASE("messages sent while simultaneous dials settle arrive once and in order", "[transport][endpoint]") {
  // Both ends dial at once and start sending as soon as the peer is up, on whichever connection
  // came up first; one of the two connections is then retired. Every control message must still
  // arrive exactly once and in order, and every bulk message exactly once, in each direction.
  // Several trials: which connection comes up first on each side varies.
  const int control_count = 400, bulk_every = 40;
  for (int trial = 0; trial < 6; ++trial) {
    INFO("trial " << trial);
    node a, b;
    a.ep->dial(b.ep->id(), {b.address()});
    b.ep->dial(a.ep->id(), {a.address()});
    REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
    REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }));
    auto sender = [&](node& from, node& to) {
      for (int i = 0; i < control_count; ++i) {
        std::vector<uint8_t> m(4);
        std::memcpy(m.data(), &i, 4);
        REQUIRE(from.ep->send(to.ep->id(), channel::control, m));
        if (i % bulk_every == 0) {
          auto big = pattern(200'000, static_cast<uint32_t>(i));
          std::memcpy(big.data(), &i, 4);
          REQUIRE(from.ep->send(to.ep->id(), channel::bulk, std::move(big)));
        }
        std::this_thread::sleep_for(100us);
      }
    };
    std::thread ta([&] { sender(a, b); });
    sender(b, a);
    ta.join();
    const size_t expected = control_count + control_count / bulk_every;
    for (node* n : {&a, &b}) {
      n->log.wait([&] { return n->log.messages.size() >= expected; }, 20s);
      std::lock_guard lock(n->log.mu);
      std::vector<int> control, bulk;
      for (const auto& m : n->log.messages) {
        int i = 0;
        std::memcpy(&i, m.bytes.data(), 4);
        (m.ch == channel::control ? control : bulk).push_back(i);
      }
      std::sort(bulk.begin(), bulk.end());
      std::vector<int> want_control(control_count), want_bulk;
      for (int i = 0; i < control_count; ++i) {
        want_control[i] = i;
        if (i % bulk_every == 0) want_bulk.push_back(i);
      }
      CHECK(control == want_control);
      CHECK(bulk == want_bulk);
      CHECK(n->log.up.size() == 1);
      CHECK(n->log.down.empty());
    }
    // And the retired twin is gone: one connection left on each side.
    for (node* n : {&a, &b}) {
      bool one = false;
      for (int i = 0; i < 200 && !one; ++i) {
        one = n->ep->counters().connections == 1;
        if (!one) std::this_thread::sleep_for(10ms);
      }
      CHECK(one);
    }
  }
}

TEST_CASE("a second live node with the same identity is refused", "[transport][endpoint]") {
  auto shared = identity::generate();
  endpoint_config c1, c2;
  c1.id = shared;
  c2.id = shared;
  node hub, first(c1), clone(c2);
  first.ep->dial(hub.ep->id(), {hub.address()});
  REQUIRE(hub.log.wait([&] { return hub.log.up.size() == 1; }));
  clone.ep->dial(hub.ep->id(), {hub.address()});
  REQUIRE(clone.log.wait([&] { return !clone.log.failed.empty() || !clone.log.down.empty(); }));
  std::string why = !clone.log.failed.empty() ? clone.log.failed[0].second : clone.log.down[0].second.reason;
  CHECK(why.find("already uses node id") != std::string::npos);
  // The first one is unaffected.
  REQUIRE(first.ep->send(hub.ep->id(), channel::control, {8}));
  REQUIRE(hub.log.wait([&] { return hub.log.messages.size() == 1; }));
  CHECK(hub.log.up.size() == 1);
  CHECK(hub.log.down.empty());
}

TEST_CASE("an oversized frame from a peer closes that connection only", "[transport][endpoint]") {
  endpoint_config loose;
  loose.limits.control = 8u << 20;
  endpoint_config strict;
  strict.limits.control = 1u << 20;
  node sender(loose), receiver(strict), bystander;
  connect(receiver, sender);
  connect(receiver, bystander);
  REQUIRE(sender.ep->send(receiver.ep->id(), channel::control, std::vector<uint8_t>(2u << 20, 1)));
  REQUIRE(receiver.log.wait([&] { return !receiver.log.down.empty(); }));
  CHECK(receiver.log.down[0].first == sender.ep->id());
  CHECK(receiver.log.down[0].second.reason.find("limit") != std::string::npos);
  CHECK_FALSE(receiver.log.down[0].second.orderly);
  REQUIRE(sender.log.wait([&] { return !sender.log.down.empty(); }));
  CHECK(sender.log.down[0].second.reason.find("limit") != std::string::npos);  // the reason reached the peer
  CHECK_FALSE(sender.log.down[0].second.orderly);
  CHECK(receiver.log.messages.empty());
  // The receiver still serves its other peers.
  REQUIRE(bystander.ep->send(receiver.ep->id(), channel::control, {4}));
  REQUIRE(receiver.log.wait([&] { return receiver.log.messages.size() == 1; }));
}

TEST_CASE("more bulk messages than the peer's stream limit keep flowing", "[transport][endpoint]") {
  // Each bulk message is a stream of its own: the receiver must give stream credit back, or a
  // connection stalls after initial_max_streams_uni (128) messages in each direction.
  node a(config_with_secret(7)), b(config_with_secret(7));
  REQUIRE(a.ep);
  REQUIRE(b.ep);
  connect(a, b);
  for (int i = 0; i < 600; ++i) {
    REQUIRE(a.ep->send(b.ep->id(), channel::bulk, pattern(200, static_cast<uint8_t>(i))));
    INFO("message " << i);
    REQUIRE(b.log.wait([&] { return b.log.messages.size() == static_cast<size_t>(i + 1); }, std::chrono::seconds(5)));
    REQUIRE(b.ep->send(a.ep->id(), channel::bulk, pattern(500, static_cast<uint8_t>(i))));
    REQUIRE(a.log.wait([&] { return a.log.messages.size() == static_cast<size_t>(i + 1); }, std::chrono::seconds(5)));
  }
}

TEST_CASE("bulk data in flight is held to its limit", "[transport][endpoint]") {
  // LAN-sized packets on loopback. Held: whenever the sender is sampled its bulk bytes in flight
  // are within the limit it reports (plus the packet being written), the limit at least the
  // floor, and data was waiting while the limit held it. Not held (floor 0), ngtcp2's window
  // takes the same transfer past that limit: the bound is the hold's doing. The limit follows
  // the measured rate and the window's growth depends on the machine's load, so the transfer
  // without the hold is made up to three times (a CI run once saw its window stay under the
  // limit: 174,000 against 192,799 bytes). Bytes in flight were sent under the limits of the
  // last moments, and the limit may fall while they are out (a CI run under load saw 134,400 in
  // flight against a limit of 131,072), so each sample is held to the largest limit of the last
  // 20 samples; and a loss timer's probe (up to 2 packets, which ngtcp2 sends whatever the window)
  // may come on top of the packet being written.
  const uint64_t floor = 128u << 10, packet = 1452, slack = 4 * packet;
  std::deque<uint64_t> recent_limits;
  uint64_t most[2] = {0, 0}, over = 0, limit = 0;
  bool held_back = false;
  for (int run = 0; run < 4; ++run) {
    const int held = run == 0 ? 1 : 0;  // held first: the unheld runs are compared with its limit
    if (!held && most[0] > limit + slack) break;
    endpoint_config cfg;
    cfg.loopback_udp_payload = 0;
    cfg.bulk_in_flight_floor = held ? floor : 0;
    node a(cfg), b(cfg);
    connect(a, b);
    const size_t size = 48u << 20;
    REQUIRE(a.ep->send(b.ep->id(), channel::bulk, pattern(size, 31)));
    while (!b.log.wait([&] { return b.log.messages.size() == 1; }, 1ms)) {
      auto s = a.ep->stats(b.ep->id());
      if (!s) continue;
      most[held] = std::max(most[held], s->bytes_in_flight);
      if (!held) continue;
      limit = s->bulk_in_flight_limit;
      recent_limits.push_back(limit);
      if (recent_limits.size() > 20) recent_limits.pop_front();
      if (s->bytes_in_flight > *std::max_element(recent_limits.begin(), recent_limits.end()) + slack) ++over;
      if (s->bytes_in_flight + 2 * packet >= limit && s->unsent_bytes > 0) held_back = true;
    }
    CHECK(b.log.messages[0].bytes.size() == size);
  }
  INFO("most bytes in flight: not held " << most[0] << ", held " << most[1] << "; limit " << limit);
  CHECK(over == 0);
  CHECK(limit >= floor);
  CHECK(held_back);
  CHECK(most[0] > limit + slack);
}

TEST_CASE("can_reach tells which announced addresses the socket can dial", "[transport][endpoint]") {
  node v4;  // bound to 127.0.0.1
  REQUIRE(v4.ep);
  CHECK(v4.ep->can_reach("127.0.0.1:4000"));
  CHECK(v4.ep->can_reach("[::ffff:127.0.0.1]:4000"));  // IPv4-mapped: still IPv4
  CHECK_FALSE(v4.ep->can_reach("[fd00::2]:4000"));
  CHECK_FALSE(v4.ep->can_reach("not an address"));
  endpoint_config cfg;
  cfg.bind = "::";
  event_log log;
  auto dual = endpoint::start(cfg, recording_handlers(log));
  if (!dual) {
    WARN("dual-stack part skipped: no IPv6 socket here (" << dual.error().message << ")");
    return;
  }
  CHECK((*dual)->can_reach("127.0.0.1:4000"));
  CHECK((*dual)->can_reach("[fd00::2]:4000"));
}

TEST_CASE("a peer's unfinished bulk messages are held to the receive budget", "[transport][endpoint]") {
  // Six 6 MiB messages sent round robin, so all are open at once. With an 8 MiB budget and 1 MiB
  // stream windows the receiver holds at most 8 + 6 x 1 MiB of them at any time, and every
  // message still arrives whole (the waiting ones get credit as earlier ones finish). With a
  // 64 MiB budget the same transfer holds more than that: the bound is the budget's doing.
  const size_t count = 6, size = 6u << 20;
  const uint64_t window = 1u << 20, budget = 8u << 20;
  uint64_t peak[2] = {0, 0};
  for (int bounded = 1; bounded >= 0; --bounded) {
    endpoint_config cfg = config_with_secret(3);
    cfg.stream_window = window;
    cfg.limits.bulk = 8u << 20;
    cfg.bulk_receive_budget = bounded ? budget : 64u << 20;
    cfg.bulk_scheduling = endpoint_config::bulk_order::round_robin;
    node a(cfg), b(cfg);
    REQUIRE(a.ep);
    REQUIRE(b.ep);
    connect(a, b);
    std::vector<std::array<uint8_t, 32>> sums;
    std::vector<std::vector<uint8_t>> messages;
    for (size_t i = 0; i < count; ++i) {
      messages.push_back(pattern(size, static_cast<uint32_t>(100 + i)));
      sums.push_back(checksum(messages.back()));
    }
    for (auto& m : messages) REQUIRE(a.ep->send(b.ep->id(), channel::bulk, std::move(m)));
    INFO("budget " << cfg.bulk_receive_budget);
    REQUIRE(b.log.wait([&] { return b.log.messages.size() == count; }, std::chrono::seconds(30)));
    std::vector<std::array<uint8_t, 32>> got;
    for (auto& m : b.log.messages) got.push_back(checksum(m.bytes));
    std::sort(sums.begin(), sums.end());
    std::sort(got.begin(), got.end());
    CHECK(got == sums);
    auto s = b.ep->stats(a.ep->id());
    REQUIRE(s);
    CHECK(s->bulk_receiving_bytes == 0);
    peak[bounded] = s->bulk_receiving_peak;
  }
  INFO("peak bytes held: budget 8 MiB " << peak[1] << ", budget 64 MiB " << peak[0]);
  CHECK(peak[1] <= budget + count * window);
  CHECK(peak[0] > budget + count * window);
}

TEST_CASE("a peer that never sends its admission proof is closed after the handshake timeout", "[transport][endpoint]") {
  endpoint_config server_cfg = config_with_secret(5);
  server_cfg.handshake_timeout = 2000ms;  // also the TLS handshake's limit: ample under load
  endpoint_config mute = config_with_secret(5);
  mute.send_admission_proof = false;
  mute.handshake_timeout = 30000ms;  // only the server's deadline may end it
  node server(server_cfg), client(mute);
  REQUIRE(server.ep);
  REQUIRE(client.ep);
  const auto start = std::chrono::steady_clock::now();
  client.ep->dial(server.ep->id(), {server.address()});
  REQUIRE(client.log.wait([&] { return !client.log.failed.empty() || !client.log.down.empty(); }, 12s));
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 1900ms);
  CHECK(took < 7s);
  std::string why = !client.log.failed.empty() ? client.log.failed[0].second : client.log.down[0].second.reason;
  INFO("the client was told: " << why);
  CHECK(why.find("no admission proof") != std::string::npos);
  CHECK(server.log.up.empty());
  CHECK(server.log.messages.empty());
}

TEST_CASE("delivered messages whose receipts the application keeps hold the sender back at the receive budget",
          "[transport][endpoint][security]") {
  // The receiver's handler keeps every message's receipt (as the node keeps it until the owning
  // actor has handled the message). With a 4 MiB budget, 1 MiB bulk messages stop arriving once
  // 4 are held, and small control messages stop once the budget and the control window are full;
  // the sender is held by flow control, nothing is lost, and releasing lets everything in.
  const uint64_t window = 256u << 10, budget = 4u << 20;
  endpoint_config cfg = config_with_secret(5);
  cfg.stream_window = window;
  cfg.limits.bulk = 2u << 20;
  cfg.bulk_receive_budget = budget;
  struct held_messages {
    std::mutex mu;
    bool keep = true;
    std::vector<delivery_receipt> receipts;
    uint64_t bytes = 0;  // delivered while kept
  } held;
  node a(cfg);
  event_log log;
  handlers h = recording_handlers(log);
  auto record = h.on_message;
  h.on_message = [&held, record](const node_id& id, channel ch, std::vector<uint8_t> bytes) {
    {
      std::lock_guard l(held.mu);
      if (held.keep) {
        held.receipts.push_back(take_delivery_receipt());
        held.bytes += bytes.size();
      }
    }
    record(id, ch, std::move(bytes));
  };
  auto cfg_b = cfg;
  cfg_b.bind = "127.0.0.1";
  auto b = endpoint::start(cfg_b, h);
  REQUIRE(a.ep);
  REQUIRE(b);
  (*b)->dial(a.ep->id(), {a.address()});
  REQUIRE(log.wait([&] { return !log.up.empty(); }));
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }));
  const node_id bid = (*b)->id();

  const size_t bulk_count = 16, bulk_size = 1u << 20;
  for (size_t i = 0; i < bulk_count; ++i) REQUIRE(a.ep->send(bid, channel::bulk, pattern(bulk_size, static_cast<uint32_t>(i))));
  std::this_thread::sleep_for(2s);
  {
    std::lock_guard l(log.mu);
    INFO("bulk messages delivered while their receipts were kept: " << log.messages.size());
    CHECK(log.messages.size() == budget / bulk_size);
  }
  auto s = (*b)->stats(a.ep->id());
  REQUIRE(s);
  CHECK(s->delivered_held_bytes <= budget);
  {
    std::lock_guard l(held.mu);
    CHECK(s->delivered_held_bytes == held.bytes);
  }

  // Releasing lets the rest in, whole and in order.
  {
    std::lock_guard l(held.mu);
    held.keep = false;
    held.receipts.clear();
    held.bytes = 0;
  }
  REQUIRE(log.wait([&] { return log.messages.size() == bulk_count; }, 20s));
  for (size_t i = 0; i < bulk_count; ++i) CHECK(log.messages[i].bytes == pattern(bulk_size, static_cast<uint32_t>(i)));

  // Control messages: held to the budget plus one control window.
  {
    std::lock_guard l(held.mu);
    held.keep = true;
  }
  const size_t control_count = 1500, control_size = 8u << 10;  // 12 MiB in all
  for (size_t i = 0; i < control_count; ++i) REQUIRE(a.ep->send(bid, channel::control, std::vector<uint8_t>(control_size, static_cast<uint8_t>(i))));
  std::this_thread::sleep_for(2s);
  uint64_t kept = 0;
  {
    std::lock_guard l(held.mu);
    kept = held.bytes;
  }
  INFO("control bytes delivered while their receipts were kept: " << kept);
  CHECK(kept >= budget);
  // ngtcp2 grows a stream's window up to max_stream_window (4 x stream_window) as it is used.
  CHECK(kept <= budget + 4 * window + control_size);
  {
    std::lock_guard l(held.mu);
    held.keep = false;
    held.receipts.clear();
  }
  REQUIRE(log.wait([&] { return log.messages.size() == bulk_count + control_count; }, 20s));
  CHECK(log.down.empty());
  (*b)->stop();
}
