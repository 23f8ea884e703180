#include "gpu/vk_host_import.hpp"

#include <unistd.h>

namespace mesh::gpu {

vk_host_imports::vk_host_imports(vk_device& d) : d_(d), s_(std::make_shared<state>()) {
  s_->device = d.device;
  if (d.host_import_alignment)
    properties_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(d.device, "vkGetMemoryHostPointerPropertiesEXT"));
}

vk_host_imports::~vk_host_imports() {
  std::lock_guard lock(s_->m);
  for (const auto& [id, e] : s_->entries) free_entry(s_->device, e);
  s_->entries.clear();
  s_->alive = false;
}

void vk_host_imports::free_entry(VkDevice device, const entry& e) {
  vkDestroyBuffer(device, e.buffer, nullptr);
  vkFreeMemory(device, e.memory, nullptr);
}

expected<std::shared_ptr<void>> vk_host_imports::import(std::span<const uint8_t> bytes) {
  const uint64_t align = d_.host_import_alignment;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (!align || !properties_)
    return make_error(error_code::unsupported, "importing host memory: " + d_.info.name + " lacks VK_EXT_external_memory_host");
  // Rounding out to the alignment stays inside the mapping only when the alignment is a page's
  // divisor: a mapping holds whole pages.
  if (align > page || page % align)
    return make_error(error_code::unsupported, "importing host memory: " + d_.info.name + " aligns imports to " + std::to_string(align) +
                                                   " bytes, more than a page (" + std::to_string(page) + ")");
  if (bytes.empty()) return make_error(error_code::invalid_argument, "importing host memory: no bytes");
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data()) / align * align;
  const auto end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size() + align - 1) / align * align;
  const uint64_t size = end - begin;
  void* host = reinterpret_cast<void*>(begin);
  const auto what = "importing " + std::to_string(size) + " bytes of host memory";

  auto props = vk_struct<VkMemoryHostPointerPropertiesEXT>(VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT);
  if (VkResult r = properties_(d_.device, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host, &props); r != VK_SUCCESS)
    return tl::unexpected(vk_error(r, what + ": vkGetMemoryHostPointerPropertiesEXT"));
  auto external = vk_struct<VkExternalMemoryBufferCreateInfo>(VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO);
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  auto bci = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.pNext = &external;
  bci.size = size;
  bci.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  d_.share_buffer(bci);
  entry e{begin, end, VK_NULL_HANDLE, VK_NULL_HANDLE, {}};
  if (VkResult r = vkCreateBuffer(d_.device, &bci, nullptr, &e.buffer); r != VK_SUCCESS)
    return tl::unexpected(vk_error(r, what + ": vkCreateBuffer"));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(d_.device, e.buffer, &req);
  // A type both allow, host-visible and coherent first (what the host writes is seen without flushes).
  const uint32_t allowed = props.memoryTypeBits & req.memoryTypeBits;
  int type = -1;
  for (uint32_t t = 0; t < d_.memory.memoryTypeCount; ++t) {
    if (!(allowed & (1u << t))) continue;
    const auto flags = d_.memory.memoryTypes[t].propertyFlags;
    const bool coherent = (flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (type < 0 || coherent) type = static_cast<int>(t);
    if (coherent) break;
  }
  if (type < 0) {
    vkDestroyBuffer(d_.device, e.buffer, nullptr);
    return make_error(error_code::unsupported, what + ": no memory type of the device takes this pointer for a buffer");
  }
  auto import = vk_struct<VkImportMemoryHostPointerInfoEXT>(VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT);
  import.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  import.pHostPointer = host;
  auto mai = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.pNext = &import;
  mai.allocationSize = size;
  mai.memoryTypeIndex = static_cast<uint32_t>(type);
  if (VkResult r = vkAllocateMemory(d_.device, &mai, nullptr, &e.memory); r != VK_SUCCESS) {
    vkDestroyBuffer(d_.device, e.buffer, nullptr);
    return tl::unexpected(vk_error(r, what + ": vkAllocateMemory"));
  }
  if (VkResult r = vkBindBufferMemory(d_.device, e.buffer, e.memory, 0); r != VK_SUCCESS) {
    free_entry(d_.device, e);
    return tl::unexpected(vk_error(r, what + ": vkBindBufferMemory"));
  }
  std::lock_guard lock(s_->m);
  const uint64_t id = s_->next++;
  // The handle frees the import when its last holder lets go, unless this object went first.
  std::shared_ptr<void> handle(reinterpret_cast<void*>(begin), [s = s_, id](void*) {
    std::lock_guard lock(s->m);
    auto it = s->entries.find(id);
    if (it == s->entries.end()) return;
    if (s->alive) free_entry(s->device, it->second);
    s->entries.erase(it);
  });
  e.handle = handle;
  s_->entries.emplace(id, e);
  return handle;
}

std::optional<vk_host_imports::place> vk_host_imports::find(const uint8_t* p, uint64_t n) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(s_->m);
  for (const auto& [id, e] : s_->entries)
    if (at >= e.begin && at + n <= e.end)
      if (auto keep = e.handle.lock()) return place{e.buffer, at - e.begin, std::move(keep)};
  return std::nullopt;
}

}  // namespace mesh::gpu
