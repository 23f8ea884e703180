// memory_pool: device and host memory in large blocks, tensors sub-allocated from them
// (vk_memory.hpp).
#include "gpu/vk_memory.hpp"

#include <algorithm>
#include <string>

namespace mesh::gpu {

memory_pool::~memory_pool() {
  for (auto& b : blocks_) {
    vkDestroyBuffer(d_.device, b.buffer, nullptr);
    vkFreeMemory(d_.device, b.memory, nullptr);
  }
}

expected<memory_pool::allocation> memory_pool::allocate(uint64_t size) {
  // Large tensors start on 2 MiB boundaries (the GPU's large pages) so that where a tensor lands
  // does not depend on what was allocated before it.
  const uint64_t align = size >= (1u << 20) ? (2u << 20) : 0;
  auto r = alloc_.allocate(size, align);
  if (!r) {
    const uint64_t granule = align ? align : 256;
    const uint64_t want = std::max(block_bytes_, (std::max<uint64_t>(size, 1) + granule - 1) & ~(granule - 1));
    if (auto ok = add_block(want); !ok) return tl::unexpected(ok.error());
    r = alloc_.allocate(size, align);
    if (!r) return make_error(error_code::internal, "allocator: new block has no room");
  }
  const block& b = blocks_[r->block];
  return allocation{*r, b.buffer, b.mapped ? b.mapped + r->offset : nullptr};
}

uint64_t memory_pool::alignment(const vk_device& d) {
  return std::max<uint64_t>({d.props.limits.minStorageBufferOffsetAlignment, 16, d.props.limits.nonCoherentAtomSize});
}

expected<void> memory_pool::add_block(uint64_t size) {
  if (budget_ && *used_ + size > budget_)
    return make_error(error_code::device, "out of device memory: " + std::to_string(size) +
                                              " more bytes would exceed this executor's limit of " +
                                              std::to_string(budget_) + " bytes");
  block b;
  auto bci = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  d_.share_buffer(bci);
  if (VkResult r = vkCreateBuffer(d_.device, &bci, nullptr, &b.buffer); r != VK_SUCCESS)
    return tl::unexpected(vk_error(r, "vkCreateBuffer(" + std::to_string(size) + " bytes)"));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(d_.device, b.buffer, &req);
  uint32_t type = type_;
  if (!(req.memoryTypeBits & (1u << type))) {
    vkDestroyBuffer(d_.device, b.buffer, nullptr);
    return make_error(error_code::unsupported, "storage buffers cannot live in the chosen memory type");
  }
  auto mai = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  if (VkResult r = vkAllocateMemory(d_.device, &mai, nullptr, &b.memory); r != VK_SUCCESS) {
    vkDestroyBuffer(d_.device, b.buffer, nullptr);
    return tl::unexpected(vk_error(r, "vkAllocateMemory(" + std::to_string(req.size) + " bytes)"));
  }
  vkBindBufferMemory(d_.device, b.buffer, b.memory, 0);
  if (host_) {
    void* p = nullptr;
    if (VkResult r = vkMapMemory(d_.device, b.memory, 0, VK_WHOLE_SIZE, 0, &p); r != VK_SUCCESS) {
      vkDestroyBuffer(d_.device, b.buffer, nullptr);
      vkFreeMemory(d_.device, b.memory, nullptr);
      return tl::unexpected(vk_error(r, "vkMapMemory"));
    }
    b.mapped = static_cast<uint8_t*>(p);
  }
  blocks_.push_back(b);
  alloc_.add_block(size);
  *used_ += size;
  return {};
}

}  // namespace mesh::gpu
