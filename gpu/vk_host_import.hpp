#pragma once
/// Host memory imported into the Vulkan device (VK_EXT_external_memory_host): the device copies
/// parameters straight to and from it with copy commands, no staging memory and no host copy in
/// between (executor::import_host_memory; a data-parallel step's gradients and their sums move
/// this way between the GPU and the shared regions of the host all-reduce, docs/training.md).
///
/// An import lives while the handle import() returns does; the caller keeps the memory mapped
/// at least that long, and keeps the handle through every transfer that uses the memory.
/// Handles may be released on any thread (vkFreeMemory on an idle import needs no other sync);
/// after this object is gone, releasing one does nothing.
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "base/error.hpp"
#include "gpu/vk_device.hpp"

namespace mesh::gpu {

class vk_host_imports {
 public:
  explicit vk_host_imports(vk_device& d);
  /// Frees the imports still held (the device is idle by then).
  ~vk_host_imports();
  vk_host_imports(const vk_host_imports&) = delete;
  vk_host_imports& operator=(const vk_host_imports&) = delete;

  /// Imports the pages that hold `bytes`: from the page boundary at or before their start to the
  /// one at or after their end (minImportedHostPointerAlignment). Errors: unsupported (the device
  /// lacks the extension, or its alignment is larger than a page) and what the driver says (a
  /// mapping it cannot pin, as a read-only one may be).
  expected<std::shared_ptr<void>> import(std::span<const uint8_t> bytes);

  /// Where [p, p + n) lies in a live import: its buffer and the offset there, and the import's
  /// handle, which keeps it while a copy that uses it is in flight (vk_copy_lane).
  struct place {
    VkBuffer buffer = VK_NULL_HANDLE;
    uint64_t offset = 0;
    std::shared_ptr<void> keep;
  };
  std::optional<place> find(const uint8_t* p, uint64_t n) const;

 private:
  struct entry {
    uintptr_t begin = 0, end = 0;
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    std::weak_ptr<void> handle;  ///< what import() returned
  };
  /// Shared with the handles, which outlive this object when their holders let them.
  struct state {
    mutable std::mutex m;
    VkDevice device = VK_NULL_HANDLE;
    bool alive = true;
    std::map<uint64_t, entry> entries;
    uint64_t next = 1;
  };
  static void free_entry(VkDevice device, const entry& e);

  vk_device& d_;
  std::shared_ptr<state> s_;
  PFN_vkGetMemoryHostPointerPropertiesEXT properties_ = nullptr;
};

}  // namespace mesh::gpu
