#pragma once
/// The Vulkan device shell: instance, device choice, capability probe, validation messenger.
#include <vulkan/vulkan.h>

#include <atomic>
#include <memory>
#include <string>

#include "gpu/executor.hpp"
#include "gpu/glsl.hpp"

namespace mesh::gpu {

/// A zeroed Vulkan struct with its sType set.
template <class T>
T vk_struct(VkStructureType type) {
  T x{};
  x.sType = type;
  return x;
}

/// "VK_ERROR_DEVICE_LOST", ...
const char* to_string(VkResult r);

/// An error value for a failed Vulkan call: device loss and out-of-memory are `device` errors
/// that say so; the rest are `internal`.
error vk_error(VkResult r, const std::string& what);

struct vk_device {
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties memory{};
  device_info info;
  device_caps caps;
  bool timestamps = false;
  /// MESH_PIPELINE_STATS=1 and VK_KHR_pipeline_executable_properties: each new pipeline's
  /// compiler statistics (registers, shared memory, spills on NVIDIA) are printed to stderr.
  bool pipeline_stats = false;
  uint32_t device_memory_type = 0;  ///< DEVICE_LOCAL
  uint32_t host_memory_type = 0;    ///< HOST_VISIBLE | HOST_COHERENT (cached when offered)
  std::atomic<uint64_t> validation_errors{0}, validation_warnings{0};

  /// Creates the instance and the chosen device.
  static expected<std::unique_ptr<vk_device>> create(const vulkan_options& options);
  ~vk_device();
  /// "llvmpipe (LLVM 15.0.6, 256 bits)/driver 0x..."; keys the caches.
  std::string key() const;
  /// Prints the driver's statistics of `pipeline` (MESH_PIPELINE_STATS=1): one line per kernel.
  void print_pipeline_stats(VkPipeline pipeline, const std::string& name) const;
};

}  // namespace mesh::gpu
