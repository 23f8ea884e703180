#pragma once
/// Messages a node refused, per peer: how many and why the last one was refused (another protocol
/// version, past the decode budget, malformed). The bridge records refusals as it decodes; status
/// replies (`meshctl peers`) report them. Thread-safe: written on the bridge's thread, read on the
/// status actor's.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "base/node_id.hpp"

namespace mesh {

class refusal_log {
 public:
  struct entry {
    uint64_t count = 0;
    std::string last;  ///< the reason for the most recent refusal
    uint64_t seq = 0;  ///< when it was recorded (the log's own counter)
  };

  void record(const node_id& peer, std::string why) {
    std::lock_guard lock(mu_);
    auto& e = by_peer_[peer];
    ++e.count;
    e.last = std::move(why);
    e.seq = ++seq_;
    // Bounded: peers that connect under ever new ids cannot grow the log without limit; the one
    // that refused nothing for longest goes.
    if (by_peer_.size() > max_peers)
      by_peer_.erase(std::min_element(by_peer_.begin(), by_peer_.end(),
                                      [](const auto& a, const auto& b) { return a.second.seq < b.second.seq; }));
  }

  entry of(const node_id& peer) const {
    std::lock_guard lock(mu_);
    auto it = by_peer_.find(peer);
    return it == by_peer_.end() ? entry{} : it->second;
  }

  static constexpr size_t max_peers = 4096;

 private:
  mutable std::mutex mu_;
  std::map<node_id, entry> by_peer_;
  uint64_t seq_ = 0;
};

}  // namespace mesh
