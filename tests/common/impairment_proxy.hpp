#pragma once
// A user-space UDP proxy that drops and delays datagrams: loss and stalls without kernel help
// (this kernel has no sch_netem). Shared by the transport tests and the node process tests.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

namespace mesh::test {

using namespace std::chrono_literals;

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

}  // namespace mesh::test
