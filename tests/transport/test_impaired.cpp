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

using namespace mesh::transport;
using namespace mesh::transport::test;
using namespace std::chrono_literals;

namespace {

// Forwards between the first client that writes to its front socket and `server_port`, through
// a back socket, impairing both ways. rebind() swaps the back socket for one on a new port: the
// server then sees the client's address change, as after a NAT rebinding.
class impairment_proxy {
 public:
  impairment_proxy(uint16_t server_port, double loss, std::chrono::milliseconds delay, bool black_hole_replies = false)
      : loss_(loss), delay_(delay), black_hole_replies_(black_hole_replies) {
    front_ = open_socket(&port_);
    back_ = open_socket(nullptr);
    server_.sin_family = AF_INET;
    server_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    server_.sin_port = htons(server_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~impairment_proxy() {
    stop_ = true;
    thread_.join();
    ::close(front_);
    ::close(back_.load());
  }
  uint16_t port() const { return port_; }
  size_t dropped() const { return dropped_; }
  void set_loss(double loss) { loss_ = loss; }
  /// The server-facing side moves to a new port; returns it.
  uint16_t rebind() {
    uint16_t p = 0;
    int fresh = open_socket(&p);
    int old = back_.exchange(fresh);
    std::this_thread::sleep_for(20ms);  // let the loop stop using the old socket
    ::close(old);
    return p;
  }

 private:
  struct pending {
    std::chrono::steady_clock::time_point due;
    bool to_server;
    std::vector<uint8_t> bytes;
  };

  static int open_socket(uint16_t* port) {
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t l = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    if (port) *port = ntohs(a.sin_port);
    int big = 8 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    return fd;
  }

  void loop() {
    std::mt19937 rng(1234);
    std::uniform_real_distribution<double> coin(0, 1);
    std::deque<pending> queue;  // FIFO: constant delay keeps it ordered by due time
    std::vector<uint8_t> buf(65536);
    bool have_client = false;
    while (!stop_) {
      int back = back_.load();
      auto now = std::chrono::steady_clock::now();
      while (!queue.empty() && queue.front().due <= now) {
        auto& p = queue.front();
        if (p.to_server)
          ::sendto(back, p.bytes.data(), p.bytes.size(), 0, reinterpret_cast<sockaddr*>(&server_), sizeof(server_));
        else if (have_client)
          ::sendto(front_, p.bytes.data(), p.bytes.size(), 0, reinterpret_cast<sockaddr*>(&client_), sizeof(client_));
        queue.pop_front();
      }
      int wait_ms = queue.empty() ? 10
                                  : static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         queue.front().due - now).count());
      pollfd pfd[2] = {{front_, POLLIN, 0}, {back, POLLIN, 0}};
      if (::poll(pfd, 2, std::clamp(wait_ms, 0, 10)) <= 0) continue;
      for (int side = 0; side < 2; ++side) {
        for (int i = 0; i < 256; ++i) {
          sockaddr_in from{};
          socklen_t fl = sizeof(from);
          ssize_t n = ::recvfrom(side == 0 ? front_ : back, buf.data(), buf.size(), MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr*>(&from), &fl);
          if (n <= 0) break;
          if (side == 0) {
            client_ = from;
            have_client = true;
          }
          if (coin(rng) < loss_ || (side == 1 && black_hole_replies_)) {
            ++dropped_;
            continue;
          }
          queue.push_back({std::chrono::steady_clock::now() + delay_, side == 0,
                           std::vector<uint8_t>(buf.begin(), buf.begin() + n)});
        }
      }
    }
  }

  int front_ = -1;
  std::atomic<int> back_{-1};
  uint16_t port_ = 0;
  std::atomic<double> loss_;
  std::chrono::milliseconds delay_;
  bool black_hole_replies_;
  sockaddr_in server_{}, client_{};
  std::atomic<bool> stop_{false};
  std::atomic<size_t> dropped_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("5% loss and 50 ms delay each way still deliver everything in order", "[transport][endpoint][impaired]") {
  endpoint_config cfg;
  cfg.handshake_timeout = 10000ms;
  node a(cfg), b(cfg);
  impairment_proxy proxy(a.ep->port(), 0.05, 50ms);
  b.ep->dial(a.ep->id(), {"127.0.0.1:" + std::to_string(proxy.port())});
  REQUIRE(b.log.wait([&] { return !b.log.up.empty(); }, 20s));
  REQUIRE(a.log.wait([&] { return !a.log.up.empty(); }, 20s));

  // Loss-bound throughput (Mathis: ~MSS/RTT/sqrt(p), ~80 KB/s here) keeps the bulk part small.
  std::vector<uint8_t> bulk(512u << 10);
  for (size_t i = 0; i < bulk.size(); ++i) bulk[i] = static_cast<uint8_t>(i * 13 + 1);
  REQUIRE(b.ep->send(a.ep->id(), channel::bulk, bulk));
  for (uint32_t i = 0; i < 300; ++i) {
    std::vector<uint8_t> m(4);
    std::memcpy(m.data(), &i, 4);
    REQUIRE(b.ep->send(a.ep->id(), channel::control, m));
  }
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 301; }, 90s));
  uint32_t expect = 0;
  for (auto& m : a.log.messages) {
    if (m.ch == channel::bulk) {
      CHECK(m.bytes == bulk);
      continue;
    }
    uint32_t got;
    std::memcpy(&got, m.bytes.data(), 4);
    CHECK(got == expect++);
  }
  CHECK(expect == 300);
  CHECK(proxy.dropped() > 0);  // the impairment really happened
  auto st = b.ep->stats(a.ep->id());
  REQUIRE(st);
  CHECK(st->min_rtt >= 100ms);
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
  server_cfg.handshake_timeout = 2000ms;
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
  for (int i = 0; i < 200 && !shed; ++i) {
    std::this_thread::sleep_for(10ms);
    auto k = server.ep->counters();
    shed = k.initials_shed > 0 && k.half_open == 2;
  }
  CHECK(shed);
  CHECK(server.ep->counters().half_open <= 2);
  // Once the stuck handshakes time out, a real client gets in (its Initial is retransmitted).
  endpoint_config client_cfg;
  client_cfg.handshake_timeout = 10000ms;
  node client(client_cfg);
  client.ep->dial(server.ep->id(), {"127.0.0.1:" + std::to_string(server.ep->port())});
  REQUIRE(client.log.wait([&] { return !client.log.up.empty(); }, 15s));
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
