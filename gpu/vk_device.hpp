#pragma once
/// The Vulkan device shell: instance, device choice, capability probe, validation messenger.
#include <vulkan/vulkan.h>

#include <array>
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

/// VK_KHR_cooperative_matrix and VK_KHR_shader_bfloat16 as the Vulkan registry defines them:
/// Debian 12's headers (1.3.239) predate both. Same layouts and enumerant values as vulkan_core.h.
namespace khr_compat {
struct cooperative_matrix_features {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
};
struct cooperative_matrix_properties {
  VkStructureType sType;
  void* pNext;
  uint32_t MSize, NSize, KSize;
  VkComponentTypeNV AType, BType, CType, ResultType;  // VkComponentTypeKHR: the same values
  VkBool32 saturatingAccumulation;
  VkScopeNV scope;
};
struct bfloat16_features {
  VkStructureType sType;
  void* pNext;
  VkBool32 shaderBFloat16Type, shaderBFloat16DotProduct, shaderBFloat16CooperativeMatrix;
};
constexpr auto cooperative_matrix_features_type = static_cast<VkStructureType>(1000506000);
constexpr auto cooperative_matrix_properties_type = static_cast<VkStructureType>(1000506001);
constexpr auto bfloat16_features_type = static_cast<VkStructureType>(1000141000);
constexpr auto component_bfloat16 = static_cast<VkComponentTypeNV>(1000141000);  // VK_COMPONENT_TYPE_BFLOAT16_KHR
using cooperative_matrix_properties_fn = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*, cooperative_matrix_properties*);
}  // namespace khr_compat

/// "VK_ERROR_DEVICE_LOST", ...
const char* to_string(VkResult r);

/// An error value for a failed Vulkan call: device loss and out-of-memory are `device` errors
/// that say so; the rest are `internal`.
error vk_error(VkResult r, const std::string& what);

/// While one lives, validation messages printed on this thread name `what` (the kernel whose
/// shader module and pipeline are being created): the layer's messages name no kernel.
class validation_context {
 public:
  explicit validation_context(const std::string& what);
  ~validation_context();
  validation_context(const validation_context&) = delete;
  validation_context& operator=(const validation_context&) = delete;

 private:
  const std::string* previous_;
};

struct vk_device {
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  /// The queue of the copies made beside the kernels (vk_copy_lane): a transfer-only family's
  /// (NVIDIA's copy engines) where the device has one, else a second queue of queue_family, else
  /// `queue` itself (lavapipe: one queue; the copies then wait their turn behind the kernels).
  VkQueue copy_queue = VK_NULL_HANDLE;
  uint32_t copy_family = 0;
  std::array<uint32_t, 2> both_families{};  ///< queue_family, copy_family (share_buffer)
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties memory{};
  device_info info;
  device_caps caps;
  bool timestamps = false;
  /// VK_EXT_subgroup_size_control's computeFullSubgroups is enabled: the pipelines of kernels on
  /// cooperative matrices ask for full subgroups.
  bool full_subgroups = false;
  /// MESH_PIPELINE_STATS=1 and VK_KHR_pipeline_executable_properties: each new pipeline's
  /// compiler statistics (registers, shared memory, spills on NVIDIA) are printed to stderr.
  bool pipeline_stats = false;
  uint32_t device_memory_type = 0;  ///< DEVICE_LOCAL
  uint32_t host_memory_type = 0;    ///< HOST_VISIBLE | HOST_COHERENT (cached when offered)
  /// VK_EXT_external_memory_host is enabled: its minImportedHostPointerAlignment (0: not enabled).
  uint64_t host_import_alignment = 0;
  std::atomic<uint64_t> validation_errors{0}, validation_warnings{0};

  /// The queue families a buffer is used on, for its VkBufferCreateInfo: one (EXCLUSIVE) or the
  /// compute and copy families (CONCURRENT: no ownership transfers between the queues).
  void share_buffer(VkBufferCreateInfo& info) const;
  /// Creates the instance and the chosen device.
  static expected<std::unique_ptr<vk_device>> create(const vulkan_options& options);
  ~vk_device();
  /// "llvmpipe (LLVM 15.0.6, 256 bits)/driver 0x..."; keys the caches.
  std::string key() const;
  /// Prints the driver's statistics of `pipeline` (MESH_PIPELINE_STATS=1): one line per kernel.
  void print_pipeline_stats(VkPipeline pipeline, const std::string& name) const;
};

}  // namespace mesh::gpu
