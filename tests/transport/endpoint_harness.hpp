#pragma once
// Test harness: an endpoint whose callbacks record everything, and waits bounded in time.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transport/endpoint.hpp"

namespace mesh::transport::test {

struct event_log {
  struct message {
    node_id from;
    channel ch;
    std::vector<uint8_t> bytes;
    std::chrono::steady_clock::time_point at;  // when the callback ran
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<node_id> up;
  std::vector<std::pair<node_id, peer_down>> down;
  std::vector<std::pair<std::optional<node_id>, std::string>> failed;
  std::deque<message> messages;
  std::vector<std::string> logs;

  template <class Pred>
  bool wait(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return pred(); });
  }
};

inline handlers recording_handlers(event_log& log) {
  handlers h;
  h.on_peer_up = [&log](const node_id& id, const peer_info&) {
    std::lock_guard l(log.mu);
    log.up.push_back(id);
    log.cv.notify_all();
  };
  h.on_peer_down = [&log](const node_id& id, const peer_down& why) {
    std::lock_guard l(log.mu);
    log.down.emplace_back(id, why);
    log.cv.notify_all();
  };
  h.on_message = [&log](const node_id& id, channel ch, std::vector<uint8_t> bytes) {
    std::lock_guard l(log.mu);
    log.messages.push_back({id, ch, std::move(bytes), std::chrono::steady_clock::now()});
    log.cv.notify_all();
  };
  h.on_connect_failed = [&log](const std::optional<node_id>& id, const std::string&, const std::string& why) {
    std::lock_guard l(log.mu);
    log.failed.emplace_back(id, why);
    log.cv.notify_all();
  };
  h.on_log = [&log](const std::string& line) {
    std::lock_guard l(log.mu);
    log.logs.push_back(line);
    log.cv.notify_all();
  };
  return h;
}

/// An endpoint on 127.0.0.1 with its event log.
struct node {
  event_log log;
  std::unique_ptr<endpoint> ep;

  explicit node(endpoint_config cfg = {}) {
    if (cfg.bind == "::") cfg.bind = "127.0.0.1";
    auto e = endpoint::start(std::move(cfg), recording_handlers(log));
    if (e) ep = std::move(*e);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(ep->port()); }
};

}  // namespace mesh::transport::test
