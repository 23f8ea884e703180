#pragma once
/// Device memory for the Vulkan executor: a pool per memory type (device-local for tensors, host
/// visible for staging) holds a few large blocks, each a VkDeviceMemory bound to one VkBuffer,
/// and tensors are sub-allocated from them (block_allocator does the bookkeeping).
#include <vulkan/vulkan.h>

#include <cstdint>
#include <vector>

#include "base/error.hpp"
#include "gpu/allocator.hpp"
#include "gpu/vk_device.hpp"

namespace mesh::gpu {

/// One memory type's blocks: each block is a VkDeviceMemory bound to one VkBuffer.
class memory_pool {
 public:
  struct block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkBuffer buffer = VK_NULL_HANDLE;
    uint8_t* mapped = nullptr;
  };
  struct allocation {
    block_allocator::range range;
    VkBuffer buffer = VK_NULL_HANDLE;
    uint8_t* mapped = nullptr;  ///< host pools only
  };

  /// Blocks of memory type `type` (mapped when `host`), at least `block_bytes` each.
  /// `*budget_used` counts the bytes of the blocks made (pools may share one count); a block that
  /// would take it past `budget` (0: no limit) is an out-of-memory error.
  memory_pool(vk_device& d, uint32_t type, bool host, uint64_t block_bytes, uint64_t* budget_used, uint64_t budget)
      : d_(d), type_(type), host_(host), block_bytes_(block_bytes), alloc_(alignment(d)), used_(budget_used), budget_(budget) {}
  ~memory_pool();

  /// A range of `size` bytes (a new block when none has room); an out-of-memory error past
  /// the device's memory or the budget.
  expected<allocation> allocate(uint64_t size);
  void release(const allocation& a) { alloc_.release(a.range); }
  uint64_t used_bytes() const { return alloc_.used_bytes(); }

 private:
  static uint64_t alignment(const vk_device& d);
  expected<void> add_block(uint64_t size);

  vk_device& d_;
  uint32_t type_;
  bool host_;
  uint64_t block_bytes_;
  block_allocator alloc_;
  std::vector<block> blocks_;
  uint64_t* used_;
  uint64_t budget_;
};

}  // namespace mesh::gpu
