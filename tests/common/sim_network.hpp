#pragma once
// The simulated network every engine test runs on: the delivery semantics of the real transport,
// without sockets or time.
//
// What the transport guarantees (transport/ordered_inbox.hpp) holds here: the messages one node
// sends another arrive in the order sent, whatever their size. What it does not guarantee is
// varied: messages of different sender-receiver pairs interleave in a random order (a seeded
// shuffle), as link delays, losses and retransmissions would have them. Nothing is ever lost
// without its node dying: QUIC retransmits, and a connection that gives up takes its peer down
// (tests model that with their own kill()).
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "test_ids.hpp"

namespace mesh::test {

template <class Message>
class sim_network {
 public:
  struct delivery {
    std::string from, to;
    Message m;
  };

  /// `shuffle` false: one global FIFO (everything in the order posted), for tests that want a
  /// reference run; true: pairs interleave at random, each pair in order.
  explicit sim_network(uint64_t seed = 1, bool shuffle = true) : rng_(seed), shuffle_(shuffle) {}

  void set_shuffle(bool on) { shuffle_ = on; }

  void post(const std::string& from, const std::string& to, Message m) {
    links_[{from, to}].push_back({next_++, std::move(m)});
    ++size_;
  }

  /// Posts each of a node's outgoing messages (anything with a `to`) to its receiver.
  template <class Out>
  void post_all(const std::string& from, std::vector<Out> out) {
    for (auto& o : out) {
      const std::string to = name_of(o.to);  // before `o` is moved from (argument order is unspecified)
      post(from, to, std::move(o));
    }
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  /// The next message to deliver: the oldest one of a pair chosen at random (shuffle), or the
  /// oldest of all.
  std::optional<delivery> next() {
    if (size_ == 0) return std::nullopt;
    auto pick = links_.end();
    if (shuffle_) {
      auto n = std::uniform_int_distribution<size_t>(0, links_.size() - 1)(rng_);
      pick = std::next(links_.begin(), static_cast<std::ptrdiff_t>(n));
    } else {
      for (auto it = links_.begin(); it != links_.end(); ++it)
        if (pick == links_.end() || it->second.front().seq < pick->second.front().seq) pick = it;
    }
    delivery d{pick->first.first, pick->first.second, std::move(pick->second.front().m)};
    pick->second.pop_front();
    if (pick->second.empty()) links_.erase(pick);
    --size_;
    return d;
  }

  /// Everything still in flight, oldest first within each pair (tests look for a message).
  void for_each(const std::function<void(const std::string& from, const std::string& to, const Message&)>& f) const {
    for (const auto& [link, q] : links_)
      for (const auto& e : q) f(link.first, link.second, e.m);
  }

  /// Drops what is in flight from or to `node` (it died: its connections are gone).
  void drop_node(const std::string& node) {
    for (auto it = links_.begin(); it != links_.end();) {
      if (it->first.first == node || it->first.second == node) {
        size_ -= it->second.size();
        it = links_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct entry {
    uint64_t seq;
    Message m;
  };
  std::map<std::pair<std::string, std::string>, std::deque<entry>> links_;
  std::mt19937_64 rng_;
  bool shuffle_;
  uint64_t next_ = 0;
  size_t size_ = 0;
};

}  // namespace mesh::test
