#include "serving/rate_series.hpp"

#include <algorithm>
#include <cassert>

namespace mesh::serving {

rate_series::rate_series(clock::time_point origin, std::chrono::milliseconds interval, size_t length)
    : origin_(origin), interval_(interval), ring_(std::max<size_t>(1, length)) {
  assert(interval.count() > 0);
}

int64_t rate_series::index_of(clock::time_point t) const {
  if (t < origin_) return -1;
  return static_cast<int64_t>((t - origin_) / interval_);
}

rate_series::slot* rate_series::slot_for(int64_t index) {
  const auto n = static_cast<int64_t>(ring_.size());
  if (index < 0 || index <= newest_ - n) return nullptr;
  newest_ = std::max(newest_, index);
  slot& s = ring_[static_cast<size_t>(index % n)];
  if (s.index != index) s = slot{index, 0, 0};
  return &s;
}

void rate_series::add_request(clock::time_point t) {
  if (slot* s = slot_for(index_of(t))) s->requests += 1;
}

void rate_series::add_tokens(clock::time_point from, clock::time_point to, double tokens) {
  if (tokens <= 0) return;
  if (to <= from) {
    if (slot* s = slot_for(index_of(to))) s->tokens += tokens;
    return;
  }
  const double total = std::chrono::duration<double>(to - from).count();
  // Walk the intervals [from, to] covers, each getting its share of the time.
  for (clock::time_point t = std::max(from, origin_); t < to;) {
    const int64_t i = index_of(t);
    const clock::time_point end = std::min(to, origin_ + interval_ * (i + 1));
    const double share = std::chrono::duration<double>(end - t).count() / total;
    if (slot* s = slot_for(i)) s->tokens += tokens * share;
    t = end;
  }
}

rate_series::view rate_series::at(clock::time_point now) const {
  view v;
  v.interval_s = std::chrono::duration<double>(interval_).count();
  const auto n = static_cast<int64_t>(ring_.size());
  v.requests.assign(ring_.size(), 0);
  v.tokens.assign(ring_.size(), 0);
  const int64_t current = index_of(now);
  // Position k (0 oldest) is interval current - n + k; the current interval is left out.
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = current - n + k;
    if (i < 0) continue;
    const slot& s = ring_[static_cast<size_t>(i % n)];
    if (s.index != i) continue;
    v.requests[static_cast<size_t>(k)] = s.requests;
    v.tokens[static_cast<size_t>(k)] = s.tokens;
  }
  return v;
}

}  // namespace mesh::serving
