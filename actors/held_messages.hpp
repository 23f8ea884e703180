#pragma once
/// Messages for peers this node is not connected to (yet, or again), held in order per peer,
/// within a count, a byte and an age limit. Pure: the jobs actor decides when to hold, flush and
/// expire (jobs_actor.cpp says why messages wait at all).
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "base/node_id.hpp"
#include "wire/messages.hpp"

namespace mesh {

class held_messages {
 public:
  using clock = std::chrono::steady_clock;

  held_messages(size_t max_messages, size_t max_bytes, clock::duration ttl)
      : max_messages_(max_messages), max_bytes_(max_bytes), ttl_(ttl) {}

  /// Holds `m` (encoded size `bytes`) for `to` behind what already waits for it; false (nothing
  /// held) when the store is full.
  bool hold(const node_id& to, msg::message m, size_t bytes, clock::time_point now) {
    if (count_ >= max_messages_ || bytes_ + bytes > max_bytes_) return false;
    queues_[to].push_back({std::move(m), bytes, now});
    ++count_;
    bytes_ += bytes;
    return true;
  }

  /// Whether anything waits for `to`.
  bool holds(const node_id& to) const { return queues_.count(to) != 0; }

  /// What waits for `to`, in order; the store forgets it.
  std::vector<msg::message> take(const node_id& to) {
    std::vector<msg::message> out;
    auto it = queues_.find(to);
    if (it == queues_.end()) return out;
    for (auto& e : it->second) {
      out.push_back(std::move(e.m));
      bytes_ -= e.bytes;
      --count_;
    }
    queues_.erase(it);
    return out;
  }

  /// Hands what waits for `to` to `send`, in order, while it accepts (returns true); keeps the
  /// rest. True when nothing is left for `to`.
  template <class Send>
  bool flush(const node_id& to, Send send) {
    auto it = queues_.find(to);
    if (it == queues_.end()) return true;
    auto& q = it->second;
    size_t sent = 0;
    while (sent < q.size() && send(q[sent].m)) {
      bytes_ -= q[sent].bytes;
      --count_;
      ++sent;
    }
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(sent));
    if (!q.empty()) return false;
    queues_.erase(it);
    return true;
  }

  /// Drops what has waited longer than the age limit; returns how many messages.
  size_t expire(clock::time_point now) {
    size_t dropped = 0;
    for (auto it = queues_.begin(); it != queues_.end();) {
      auto& q = it->second;
      size_t old = 0;
      while (old < q.size() && now - q[old].since > ttl_) {
        bytes_ -= q[old].bytes;
        --count_;
        ++old;
      }
      q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(old));
      dropped += old;
      it = q.empty() ? queues_.erase(it) : std::next(it);
    }
    return dropped;
  }

  size_t count() const { return count_; }
  size_t bytes() const { return bytes_; }
  clock::duration ttl() const { return ttl_; }

 private:
  struct entry {
    msg::message m;
    size_t bytes;
    clock::time_point since;
  };
  size_t max_messages_, max_bytes_;
  clock::duration ttl_;
  std::map<node_id, std::vector<entry>> queues_;
  size_t count_ = 0, bytes_ = 0;
};

}  // namespace mesh
