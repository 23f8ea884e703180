#pragma once
/// The device memory free on each node as far as this node knows: its own asked of its memory
/// probe (gpu/memory_probe.hpp) each time, each peer's as its latest heartbeat reported it. Split
/// plans share layers by these figures (docs/serving.md, "Split over the mesh"). No CAF; any
/// thread may use it (the health actor writes, split planning reads).
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "base/node_id.hpp"

namespace mesh::generation {

class free_memory {
 public:
  /// `own` answers for `self` (called on every own() and of(self)).
  free_memory(node_id self, std::function<uint64_t()> own) : self_(self), own_(std::move(own)) {}

  /// A peer's heartbeat said it has `bytes` free.
  void reported(const node_id& peer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    peers_[peer] = bytes;
  }
  /// The peer left: what it said no longer holds.
  void forget(const node_id& peer) {
    std::lock_guard<std::mutex> lock(m_);
    peers_.erase(peer);
  }
  uint64_t own() const { return own_ ? own_() : 0; }
  /// This node's, or a peer's latest report; nullopt for a peer that has not reported.
  std::optional<uint64_t> of(const node_id& n) const {
    if (n == self_) return own();
    std::lock_guard<std::mutex> lock(m_);
    auto it = peers_.find(n);
    if (it == peers_.end()) return std::nullopt;
    return it->second;
  }

 private:
  node_id self_;
  std::function<uint64_t()> own_;
  mutable std::mutex m_;
  std::map<node_id, uint64_t> peers_;
};

}  // namespace mesh::generation
