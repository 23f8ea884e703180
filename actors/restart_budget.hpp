#pragma once
/// The supervisor's restart budget: at most `max_restarts` restarts of children within a sliding
/// `window`; one more means something is persistently wrong and the node should stop (non-zero
/// exit) so that its own supervisor (systemd, `meshnode --supervise`) restarts it whole.
#include <chrono>
#include <deque>

#include "actors/health.hpp"

namespace mesh {

class restart_budget {
 public:
  restart_budget(int max_restarts = 5, std::chrono::milliseconds window = std::chrono::seconds(30))
      : max_(max_restarts), window_(window) {}

  /// Records a restart at `now`; false when the budget is exhausted (escalate).
  bool allow(mono_time now) {
    while (!times_.empty() && now - times_.front() >= window_) times_.pop_front();
    if (static_cast<int>(times_.size()) >= max_) return false;
    times_.push_back(now);
    return true;
  }
  int used(mono_time now) {
    while (!times_.empty() && now - times_.front() >= window_) times_.pop_front();
    return static_cast<int>(times_.size());
  }

 private:
  int max_;
  std::chrono::milliseconds window_;
  std::deque<mono_time> times_;
};

}  // namespace mesh
