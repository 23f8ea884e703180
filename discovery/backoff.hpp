#pragma once
/// Exponential back-off for reconnecting to a daemon that is gone. Pure and deterministic.
#include <algorithm>
#include <chrono>

namespace mesh::discovery {

class backoff {
 public:
  using duration = std::chrono::milliseconds;
  backoff(duration initial, duration max) : initial_(initial), max_(max), next_(initial) {}

  /// The wait before the next attempt; each call doubles the following one, up to the maximum.
  duration next() {
    const duration now = next_;
    next_ = std::min(max_, next_ * 2);
    return now;
  }
  /// After a success: the next failure starts again from the initial wait.
  void reset() { next_ = initial_; }

 private:
  duration initial_, max_, next_;
};

}  // namespace mesh::discovery
