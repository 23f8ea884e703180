#include "transport/buffer_pool.hpp"

#include <algorithm>

namespace mesh::transport {

void buffer_pool::give(std::vector<uint8_t> b) {
  const size_t cap = b.capacity();
  if (cap < min_capacity_ || cap > max_bytes_) return;
  b.clear();
  std::vector<uint8_t> evicted;  // freed after the lock is released
  std::lock_guard lock(mu_);
  if (kept_.size() >= max_buffers_ || kept_bytes_ + cap > max_bytes_) {
    auto smallest = std::min_element(kept_.begin(), kept_.end(), [](const kept& x, const kept& y) {
      return x.buffer.capacity() < y.buffer.capacity();
    });
    if (smallest == kept_.end() || smallest->buffer.capacity() >= cap) return;
    if (kept_bytes_ - smallest->buffer.capacity() + cap > max_bytes_) return;
    kept_bytes_ -= smallest->buffer.capacity();
    evicted = std::move(smallest->buffer);
    kept_.erase(smallest);
  }
  kept_bytes_ += cap;
  kept_.push_back({std::move(b), std::chrono::steady_clock::now()});
}

std::vector<uint8_t> buffer_pool::take(size_t n) {
  std::lock_guard lock(mu_);
  // The smallest kept buffer that holds n bytes, if it is no more than twice n.
  auto best = kept_.end();
  for (auto it = kept_.begin(); it != kept_.end(); ++it)
    if (it->buffer.capacity() >= n && (best == kept_.end() || it->buffer.capacity() < best->buffer.capacity())) best = it;
  if (best == kept_.end() || best->buffer.capacity() / 2 > n) return {};
  std::vector<uint8_t> b = std::move(best->buffer);
  kept_.erase(best);
  kept_bytes_ -= b.capacity();
  return b;
}

void buffer_pool::release_older_than(std::chrono::steady_clock::time_point cutoff) {
  std::vector<kept> old;  // freed after the lock is released
  {
    std::lock_guard lock(mu_);
    auto stale = std::stable_partition(kept_.begin(), kept_.end(), [&](const kept& k) { return k.given >= cutoff; });
    for (auto it = stale; it != kept_.end(); ++it) {
      kept_bytes_ -= it->buffer.capacity();
      old.push_back(std::move(*it));
    }
    kept_.erase(stale, kept_.end());
  }
}

size_t buffer_pool::buffers() const {
  std::lock_guard lock(mu_);
  return kept_.size();
}

uint64_t buffer_pool::bytes() const {
  std::lock_guard lock(mu_);
  return kept_bytes_;
}

}  // namespace mesh::transport
