#pragma once
// Collects a backend's events (from its thread) and lets a test wait, bounded, for one.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "discovery/backend.hpp"

namespace mesh::discovery::test {

class event_log {
 public:
  /// The callback to give to backend::start.
  event_callback callback() {
    return [this](event e) {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(e));
      cv_.notify_all();
    };
  }

  /// Waits up to `timeout` for an event matching `pred`, among those already received too;
  /// true when one came (copied to `found` if given).
  bool wait_for(const std::function<bool(const event&)>& pred, std::chrono::milliseconds timeout,
                event* found = nullptr) {
    std::unique_lock lock(mutex_);
    const bool ok = cv_.wait_for(lock, timeout, [&] {
      for (const auto& e : events_) {
        if (pred(e)) {
          if (found) *found = e;
          return true;
        }
      }
      return false;
    });
    return ok;
  }

  /// Waits for `k` about `node_id` (any node when empty).
  bool wait_for(event::kind k, const std::string& node_id, std::chrono::milliseconds timeout,
                event* found = nullptr) {
    return wait_for([&](const event& e) { return e.k == k && (node_id.empty() || e.peer.node_id == node_id); },
                    timeout, found);
  }

  bool seen(event::kind k, const std::string& node_id = "") {
    return wait_for(k, node_id, std::chrono::milliseconds(0));
  }

  /// Forgets the events so far (to wait for a later occurrence of the same kind).
  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
  }

  std::vector<event> snapshot() {
    std::lock_guard lock(mutex_);
    return events_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<event> events_;
};

}  // namespace mesh::discovery::test
