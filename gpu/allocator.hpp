#pragma once
/// Sub-allocation of tensors inside a few large device memory blocks (pure bookkeeping).
///
/// Vulkan limits the number of memory allocations (often 4096) and each costs a driver call, so
/// tensors never get their own VkDeviceMemory: the device shell maps each block of this allocator
/// to one VkDeviceMemory + VkBuffer and binds tensors as (buffer, offset, range).
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace mesh::gpu {

class block_allocator {
 public:
  /// Where a tensor lives.
  struct range {
    uint32_t block = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
  };

  /// `alignment`: every offset is a multiple of it (minStorageBufferOffsetAlignment); a power of 2.
  explicit block_allocator(uint64_t alignment) : alignment_(alignment) {}

  /// First fit over the existing blocks; nullopt when none has room (then add_block() and retry).
  /// `align` (a power of 2, at least the allocator's) raises the offset alignment of this range.
  std::optional<range> allocate(uint64_t size, uint64_t align = 0);
  /// Adds an empty block of `size` bytes; returns its index.
  uint32_t add_block(uint64_t size);
  /// Returns a range (coalescing with free neighbours).
  void release(const range& r);

  uint64_t used_bytes() const { return used_; }
  size_t block_count() const { return blocks_.size(); }
  uint64_t block_size(uint32_t b) const { return blocks_[b].size; }
  /// Bytes that can be allocated in one piece in block b.
  uint64_t largest_free(uint32_t b) const;

 private:
  struct block {
    uint64_t size = 0;
    std::map<uint64_t, uint64_t> free;  // offset -> size, no two adjacent
  };
  uint64_t round_up(uint64_t v) const { return (v + alignment_ - 1) & ~(alignment_ - 1); }

  uint64_t alignment_;
  uint64_t used_ = 0;
  std::vector<block> blocks_;
};

}  // namespace mesh::gpu
