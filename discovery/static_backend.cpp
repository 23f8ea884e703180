// Static peers (`--peer`): names are resolved on the backend's own thread, since getaddrinfo
// may block for seconds. Every peer is announced again on a back-off until stop() (run() says why).
#include <arpa/inet.h>
#include <netdb.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "discovery/backend.hpp"
#include "discovery/backoff.hpp"
#include "discovery/static_peer.hpp"
#include "discovery/txt_record.hpp"

namespace mesh::discovery {
namespace {

expected<std::vector<std::string>> resolve(const static_peer& p) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(p.host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return make_error(error_code::network, "cannot resolve '" + p.host + "': " + gai_strerror(rc));
  std::vector<std::string> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = ai->ai_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr);
    if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) && inet_ntop(ai->ai_family, raw, text, sizeof text)) {
      std::string a = text;
      if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
    }
  }
  ::freeaddrinfo(res);
  if (out.empty()) return make_error(error_code::network, "'" + p.host + "' has no IP address");
  return out;
}

class static_backend final : public backend {
 public:
  explicit static_backend(std::vector<static_peer> peers) : peers_(std::move(peers)) {}
  ~static_backend() override { stop(); }

  expected<void> start(const announcement& self, event_callback on_event) override {
    if (thread_.joinable()) return make_error(error_code::invalid_argument, "static backend already started");
    if (auto ok = validate(self); !ok) return forward_error(ok);
    self_ = self;
    on_event_ = std::move(on_event);
    stopping_ = false;
    thread_ = std::thread([this] { run(); });
    return {};
  }

  void stop() override {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  // Each peer is resolved and announced again and again, on its own back-off (0.5 s doubling to
  // 10 s), until stop(): the consumer dials on every announcement (a no-op while connected), so a
  // configured peer that starts later, restarts or changes its address is found again without
  // the operator restarting this node. A name that does not resolve is warned about once per
  // failing streak, not every retry.
  void run() {
    using clock = std::chrono::steady_clock;
    on_event_({event::backend_up, {}, std::to_string(peers_.size()) + " static peers"});
    std::vector<backoff> waits(peers_.size(), backoff(std::chrono::milliseconds(500), std::chrono::milliseconds(10000)));
    std::vector<clock::time_point> due(peers_.size(), clock::now());
    std::vector<bool> failing(peers_.size(), false);
    for (;;) {
      const auto now = clock::now();
      for (std::size_t i = 0; i < peers_.size(); ++i) {
        if (due[i] > now) continue;
        due[i] = now + waits[i].next();
        const static_peer& p = peers_[i];
        auto addrs = resolve(p);
        if (!addrs) {
          if (!failing[i]) spdlog::warn("discovery/static: {} (will retry)", addrs.error().message);
          failing[i] = true;
          continue;
        }
        failing[i] = false;
        peer_info info{p.node_id, "", 0, std::move(*addrs), p.port, "", "static"};
        if (p.node_id.empty()) {
          on_event_({event::peer_hint, std::move(info), p.host});
        } else {
          // Configured by the operator as a member: it still has to pass admission to join.
          info.mesh_id = self_.mesh_id;
          info.protocol_version = self_.protocol_version;
          on_event_({event::peer_found, std::move(info), p.host});
        }
      }
      std::unique_lock lock(mutex_);
      if (peers_.empty()) {
        cv_.wait(lock, [&] { return stopping_; });
        return;
      }
      if (cv_.wait_until(lock, *std::min_element(due.begin(), due.end()), [&] { return stopping_; })) return;
    }
  }

  std::vector<static_peer> peers_;
  announcement self_;
  event_callback on_event_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace

expected<std::unique_ptr<backend>> make_static_backend(const std::vector<std::string>& peers) {
  std::vector<static_peer> parsed;
  for (const auto& text : peers) {
    auto p = parse_static_peer(text);
    if (!p) return forward_error(p);
    parsed.push_back(std::move(*p));
  }
  return std::unique_ptr<backend>(std::make_unique<static_backend>(std::move(parsed)));
}

}  // namespace mesh::discovery
