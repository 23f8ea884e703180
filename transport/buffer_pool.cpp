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
    auto smallest = std::min_element(kept_.begin(), kept_.end(),
                                     [](const auto& x, const auto& y) { return x.capacity() < y.capacity(); });
    if (smallest == kept_.end() || smallest->capacity() >= cap) return;
    if (kept_bytes_ - smallest->capacity() + cap > max_bytes_) return;
    kept_bytes_ -= smallest->capacity();
    evicted = std::move(*smallest);
    kept_.erase(smallest);
  }
  kept_bytes_ += cap;
  kept_.push_back(std::move(b));
}

std::vector<uint8_t> buffer_pool::take(size_t n) {
  std::lock_guard lock(mu_);
  // The smallest kept buffer that holds n bytes, if it is no more than twice n.
  auto best = kept_.end();
  for (auto it = kept_.begin(); it != kept_.end(); ++it)
    if (it->capacity() >= n && (best == kept_.end() || it->capacity() < best->capacity())) best = it;
  if (best == kept_.end() || best->capacity() / 2 > n) return {};
  std::vector<uint8_t> b = std::move(*best);
  kept_.erase(best);
  kept_bytes_ -= b.capacity();
  return b;
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
