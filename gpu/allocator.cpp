#include "gpu/allocator.hpp"

#include <algorithm>

namespace mesh::gpu {

std::optional<block_allocator::range> block_allocator::allocate(uint64_t size, uint64_t align) {
  const uint64_t need = round_up(std::max<uint64_t>(size, 1));
  align = std::max(align, alignment_);
  for (uint32_t b = 0; b < blocks_.size(); ++b) {
    auto& fl = blocks_[b].free;
    for (auto it = fl.begin(); it != fl.end(); ++it) {
      const uint64_t start = it->first, len = it->second;
      const uint64_t off = (start + align - 1) & ~(align - 1);
      if (off - start + need > len) continue;
      fl.erase(it);
      if (off > start) fl[start] = off - start;  // the padding stays free
      if (off + need < start + len) fl[off + need] = start + len - off - need;
      used_ += need;
      return range{b, off, need};
    }
  }
  return std::nullopt;
}

uint32_t block_allocator::add_block(uint64_t size) {
  block b;
  b.size = size;
  if (size) b.free[0] = size;
  blocks_.push_back(std::move(b));
  return static_cast<uint32_t>(blocks_.size() - 1);
}

void block_allocator::release(const range& r) {
  auto& fl = blocks_[r.block].free;
  used_ -= r.size;
  uint64_t off = r.offset, size = r.size;
  auto next = fl.lower_bound(off);
  if (next != fl.end() && off + size == next->first) {
    size += next->second;
    next = fl.erase(next);
  }
  if (next != fl.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += size;
      return;
    }
  }
  fl[off] = size;
}

uint64_t block_allocator::largest_free(uint32_t b) const {
  uint64_t best = 0;
  for (const auto& [off, size] : blocks_[b].free) best = std::max(best, size);
  return best;
}

}  // namespace mesh::gpu
