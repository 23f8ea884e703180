#pragma once
/// Requests finished and tokens generated per interval over a recent window (by default 5 s
/// intervals over 10 minutes), so that the dashboard shows history when it first loads. A
/// ring of counts indexed by interval; time is passed in, no threads.
#include <chrono>
#include <cstdint>
#include <vector>

namespace mesh::serving {

class rate_series {
 public:
  using clock = std::chrono::steady_clock;

  /// Intervals are counted from `origin`; `length` of them are kept.
  rate_series(clock::time_point origin, std::chrono::milliseconds interval, size_t length);

  /// A request that finished at `t`.
  void add_request(clock::time_point t);
  /// `tokens` generated between `from` and `to`, spread evenly over the intervals they cover
  /// (a long generation raises every interval it ran in, not only its last).
  void add_tokens(clock::time_point from, clock::time_point to, double tokens);

  struct view {
    double interval_s = 0;
    /// Completed intervals before `now`, oldest first, `length` of them (zero where nothing
    /// happened or before the origin); the one `now` is in is still filling and left out.
    std::vector<double> requests, tokens;
  };
  view at(clock::time_point now) const;

 private:
  struct slot {
    int64_t index = -1;  ///< which interval this slot holds now (-1: none yet)
    double requests = 0, tokens = 0;
  };
  int64_t index_of(clock::time_point t) const;
  /// The slot of interval `index`, reset if it held an older one; null when `index` is older
  /// than the window kept.
  slot* slot_for(int64_t index);

  clock::time_point origin_;
  clock::duration interval_;
  std::vector<slot> ring_;
  int64_t newest_ = -1;  ///< newest interval written
};

}  // namespace mesh::serving
