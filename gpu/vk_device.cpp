#include "gpu/vk_device.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mesh::gpu {

const char* to_string(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VkResult";
  }
}

error vk_error(VkResult r, const std::string& what) {
  std::string msg = what + " failed: " + to_string(r) + " (" + std::to_string(static_cast<int>(r)) + ")";
  switch (r) {
    case VK_ERROR_DEVICE_LOST:
      return {error_code::device, msg + "; the device was lost (driver reset or hang): create a new executor"};
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      return {error_code::device, msg + "; out of memory: free parameters/programs or use smaller tensors"};
    default: return {error_code::internal, msg};
  }
}

namespace {

thread_local const std::string* validation_subject = nullptr;

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                          VkDebugUtilsMessageTypeFlagsEXT, const VkDebugUtilsMessengerCallbackDataEXT* data,
                                          void* user) {
  auto* d = static_cast<vk_device*>(user);
  const std::string where = validation_subject ? " [while creating " + *validation_subject + "]" : "";
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    ++d->validation_errors;
    std::fprintf(stderr, "[vulkan validation] error:%s %s\n", where.c_str(), data->pMessage);
  } else if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    ++d->validation_warnings;
    std::fprintf(stderr, "[vulkan validation] warning:%s %s\n", where.c_str(), data->pMessage);
  }
  return VK_FALSE;
}

bool has_layer(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  return std::any_of(layers.begin(), layers.end(), [&](const auto& l) { return std::strcmp(l.layerName, name) == 0; });
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
  }
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

bool has_extension(VkPhysicalDevice p, const char* name) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(p, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> ext(n);
  vkEnumerateDeviceExtensionProperties(p, nullptr, &n, ext.data());
  return std::any_of(ext.begin(), ext.end(), [&](const auto& e) { return std::strcmp(e.extensionName, name) == 0; });
}

}  // namespace

vk_device::~vk_device() {
  if (device) vkDestroyDevice(device, nullptr);
  if (messenger) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance, messenger, nullptr);
  }
  if (instance) vkDestroyInstance(instance, nullptr);
}

validation_context::validation_context(const std::string& what) : previous_(validation_subject) {
  validation_subject = &what;
}

validation_context::~validation_context() { validation_subject = previous_; }

std::string vk_device::key() const {
  return info.name + "/" + std::to_string(props.vendorID) + ":" + std::to_string(props.deviceID) + "/driver " +
         std::to_string(props.driverVersion);
}

expected<std::unique_ptr<vk_device>> vk_device::create(const vulkan_options& options) {
  auto d = std::make_unique<vk_device>();
  const char* env_val = std::getenv("MESH_VK_VALIDATION");
  const bool validation = options.validation || (env_val && std::strcmp(env_val, "1") == 0);
  const char* layer = "VK_LAYER_KHRONOS_validation";
  if (validation && !has_layer(layer))
    return make_error(error_code::unsupported, "validation requested but VK_LAYER_KHRONOS_validation is not installed "
                                               "(Debian: vulkan-validationlayers)");

  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "meshnode";
  app.apiVersion = VK_API_VERSION_1_1;
  auto ici = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ici.pApplicationInfo = &app;
  const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
  auto mci = vk_struct<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
  mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
  mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  mci.pfnUserCallback = on_message;
  mci.pUserData = d.get();
  if (validation) {
    ici.enabledLayerCount = 1;
    ici.ppEnabledLayerNames = &layer;
    ici.enabledExtensionCount = 1;
    ici.ppEnabledExtensionNames = &ext;
    ici.pNext = &mci;
  }
  if (VkResult r = vkCreateInstance(&ici, nullptr, &d->instance); r != VK_SUCCESS) {
    d->instance = VK_NULL_HANDLE;
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
      return make_error(error_code::unsupported, "no Vulkan 1.1 driver found (install mesa-vulkan-drivers for lavapipe)");
    return tl::unexpected(vk_error(r, "vkCreateInstance"));
  }
  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(d->instance, "vkCreateDebugUtilsMessengerEXT"));
    if (create) create(d->instance, &mci, nullptr, &d->messenger);
  }

  uint32_t count = 0;
  vkEnumeratePhysicalDevices(d->instance, &count, nullptr);
  std::vector<VkPhysicalDevice> devices(count);
  vkEnumeratePhysicalDevices(d->instance, &count, devices.data());
  std::string want = options.device;
  if (want.empty())
    if (const char* e = std::getenv("MESH_DEVICE")) want = e;
  int best = -1;
  VkPhysicalDevice chosen = VK_NULL_HANDLE;
  std::string names;
  // "#N": the N-th device in the driver's order (several identical GPUs in one host, one node each).
  const int index = want.size() > 1 && want[0] == '#' ? std::atoi(want.c_str() + 1) : -1;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto p = devices[i];
    VkPhysicalDeviceProperties pr;
    vkGetPhysicalDeviceProperties(p, &pr);
    if (pr.apiVersion < VK_API_VERSION_1_1) continue;
    names += std::string(names.empty() ? "" : ", ") + pr.deviceName;
    int score = type_rank(pr.deviceType);
    if (!want.empty()) {
      const bool match = index >= 0 ? static_cast<size_t>(index) == i
                                    : want == type_name(pr.deviceType) || std::string(pr.deviceName).find(want) != std::string::npos;
      if (!match) continue;
    }
    if (score > best) {
      best = score;
      chosen = p;
    }
  }
  if (!chosen)
    return make_error(error_code::not_found, want.empty() ? "no Vulkan 1.1 device found"
                                                          : "no Vulkan device matches \"" + want + "\" (have: " + names + ")");
  d->physical = chosen;
  vkGetPhysicalDeviceProperties(chosen, &d->props);
  vkGetPhysicalDeviceMemoryProperties(chosen, &d->memory);

  uint32_t qn = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(chosen, &qn, nullptr);
  std::vector<VkQueueFamilyProperties> qf(qn);
  vkGetPhysicalDeviceQueueFamilyProperties(chosen, &qn, qf.data());
  int family = -1;
  for (uint32_t i = 0; i < qn; ++i)
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      // Prefer a compute queue without graphics (async compute families are less contended).
      if (family < 0 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) family = static_cast<int>(i);
      if (!(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) break;
    }
  if (family < 0) return make_error(error_code::unsupported, std::string(d->props.deviceName) + " has no compute queue");
  d->queue_family = static_cast<uint32_t>(family);
  // The copy queue: a transfer-only family's first, else a second queue of the compute family.
  int copy_family = -1;
  for (uint32_t i = 0; i < qn && copy_family < 0; ++i)
    if ((qf[i].queueFlags & VK_QUEUE_TRANSFER_BIT) && !(qf[i].queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_GRAPHICS_BIT)) &&
        qf[i].queueCount > 0)
      copy_family = static_cast<int>(i);
  const bool second_queue = copy_family < 0 && qf[d->queue_family].queueCount > 1;
  d->copy_family = copy_family < 0 ? d->queue_family : static_cast<uint32_t>(copy_family);
  d->both_families = {d->queue_family, d->copy_family};
  d->timestamps = qf[d->queue_family].timestampValidBits > 0 && d->props.limits.timestampPeriod > 0;

  auto sub = vk_struct<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto ids = vk_struct<VkPhysicalDeviceIDProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES);
  sub.pNext = &ids;
  auto p2 = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  p2.pNext = &sub;
  vkGetPhysicalDeviceProperties2(chosen, &p2);
  auto s16 = vk_struct<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
  auto f2 = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  f2.pNext = &s16;
  vkGetPhysicalDeviceFeatures2(chosen, &f2);

  auto& info = d->info;
  info.name = d->props.deviceName;
  info.kind = type_name(d->props.deviceType);
  for (uint32_t h = 0; h < d->memory.memoryHeapCount; ++h)
    if (d->memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) info.memory_bytes += d->memory.memoryHeaps[h].size;
  info.subgroup_size = sub.subgroupSize;
  info.shared_memory_bytes = d->props.limits.maxComputeSharedMemorySize;
  info.fp16 = s16.storageBuffer16BitAccess == VK_TRUE;
  info.bf16_storage = info.fp16;
  info.coopmat = has_extension(chosen, "VK_NV_cooperative_matrix");
  std::copy(std::begin(ids.deviceUUID), std::end(ids.deviceUUID), info.uuid.begin());

  auto& caps = d->caps;
  caps.subgroup_size = sub.subgroupSize;
  caps.shared_memory_bytes = info.shared_memory_bytes;
  for (int i = 0; i < 3; ++i) caps.max_groups[static_cast<size_t>(i)] = d->props.limits.maxComputeWorkGroupCount[i];
  caps.subgroup_arithmetic = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                             (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                             (sub.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
  caps.storage16 = info.fp16;
  caps.unroll_loops = d->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
  if (d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) caps.loop_limit = 65535;
  caps.variants = options.variants;

  // Memory types: device-local for tensors, host-visible coherent (cached if possible) for staging.
  int dev_type = -1, host_type = -1, host_cached = -1;
  for (uint32_t i = 0; i < d->memory.memoryTypeCount; ++i) {
    const auto fl = d->memory.memoryTypes[i].propertyFlags;
    if ((fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && dev_type < 0) dev_type = static_cast<int>(i);
    const auto hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if ((fl & hv) == hv) {
      if (host_type < 0) host_type = static_cast<int>(i);
      if ((fl & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) && host_cached < 0) host_cached = static_cast<int>(i);
    }
  }
  if (host_type < 0) return make_error(error_code::unsupported, info.name + " has no host-visible coherent memory");
  d->device_memory_type = static_cast<uint32_t>(dev_type >= 0 ? dev_type : host_type);
  d->host_memory_type = static_cast<uint32_t>(host_cached >= 0 ? host_cached : host_type);

  // Tensor cores: NV cooperative matrices need the extension, a 16x16x16 f16 x f16 + f32
  // subgroup configuration, shaderFloat16 and the Vulkan memory model (the GLSL extension
  // compiles to it). kernel_variants::coopmat "0" leaves them off.
  auto coop_features = vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  auto f16_features = vk_struct<VkPhysicalDeviceShaderFloat16Int8Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  auto model_features = vk_struct<VkPhysicalDeviceVulkanMemoryModelFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES);
  std::vector<const char*> extensions;
  const bool coop_allowed = options.variants.coopmat != "0";
  if (coop_allowed && info.coopmat && info.fp16 && has_extension(chosen, "VK_KHR_shader_float16_int8") &&
      has_extension(chosen, "VK_KHR_vulkan_memory_model")) {
    coop_features.pNext = &f16_features;
    f16_features.pNext = &model_features;
    auto query = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    query.pNext = &coop_features;
    vkGetPhysicalDeviceFeatures2(chosen, &query);
    bool config = false;
    auto props_fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(d->instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    if (props_fn) {
      uint32_t nprops = 0;
      props_fn(chosen, &nprops, nullptr);
      std::vector<VkCooperativeMatrixPropertiesNV> cps(
          nprops, vk_struct<VkCooperativeMatrixPropertiesNV>(VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV));
      props_fn(chosen, &nprops, cps.data());
      for (const auto& c : cps)
        config = config || (c.MSize == 16 && c.NSize == 16 && c.KSize == 16 && c.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                            c.BType == VK_COMPONENT_TYPE_FLOAT16_NV && c.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                            c.DType == VK_COMPONENT_TYPE_FLOAT32_NV && c.scope == VK_SCOPE_SUBGROUP_NV);
    }
    if (config && coop_features.cooperativeMatrix && f16_features.shaderFloat16 && model_features.vulkanMemoryModel &&
        d->caps.subgroup_size == 32) {  // the kernel lays its 4 subgroups out as 2x2 of 128 threads
      caps.coopmat_f16 = true;
      extensions = {"VK_NV_cooperative_matrix", "VK_KHR_shader_float16_int8", "VK_KHR_vulkan_memory_model"};
      // Enable exactly what the kernels use.
      coop_features.cooperativeMatrixRobustBufferAccess = VK_FALSE;
      f16_features.shaderInt8 = VK_FALSE;
      // Device scope stays as offered: with vulkanMemoryModel on, every kernel's device-scope
      // atomics and barriers (GLSL's default scope) need it (VUID-RuntimeSpirv-vulkanMemoryModel-06265).
      model_features.vulkanMemoryModelAvailabilityVisibilityChains = VK_FALSE;
    }
  }

  // Full subgroups for the tensor-core kernels' pipelines (VK_EXT_subgroup_size_control's
  // computeFullSubgroups): KHR matrices in SPIR-V before 1.6 need them, and the validation layer
  // (1.4.363) asks for them for NV matrices too. The kernels' workgroups are whole subgroups.
  auto size_control = vk_struct<VkPhysicalDeviceSubgroupSizeControlFeaturesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT);
  if (caps.coopmat_f16 && has_extension(chosen, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME)) {
    auto query = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    query.pNext = &size_control;
    vkGetPhysicalDeviceFeatures2(chosen, &query);
    if (size_control.computeFullSubgroups) {
      d->full_subgroups = true;
      extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
      size_control.subgroupSizeControl = VK_FALSE;
    }
  }

  // KHR cooperative matrices, beside the NV ones: the tensor-core kernels rewritten to them
  // (spirv_coopmat.hpp) for f16 where the device has a 16x16x16 f16 x f16 + f32 subgroup
  // configuration, and for bf16 where it has the bf16 one and VK_KHR_shader_bfloat16's
  // shaderBFloat16CooperativeMatrix. Both need full subgroups (above).
  auto khr_coop = vk_struct<khr_compat::cooperative_matrix_features>(khr_compat::cooperative_matrix_features_type);
  auto bf16_features = vk_struct<khr_compat::bfloat16_features>(khr_compat::bfloat16_features_type);
  const bool has_bf16_ext = has_extension(chosen, "VK_KHR_shader_bfloat16");
  if (d->full_subgroups && has_extension(chosen, "VK_KHR_cooperative_matrix")) {
    if (has_bf16_ext) khr_coop.pNext = &bf16_features;
    auto query = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    query.pNext = &khr_coop;
    vkGetPhysicalDeviceFeatures2(chosen, &query);
    bool f16_config = false, bf16_config = false;
    auto props_fn = reinterpret_cast<khr_compat::cooperative_matrix_properties_fn>(
        vkGetInstanceProcAddr(d->instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
    if (props_fn) {
      uint32_t nprops = 0;
      props_fn(chosen, &nprops, nullptr);
      std::vector<khr_compat::cooperative_matrix_properties> cps(
          nprops, vk_struct<khr_compat::cooperative_matrix_properties>(khr_compat::cooperative_matrix_properties_type));
      props_fn(chosen, &nprops, cps.data());
      for (const auto& c : cps) {
        const bool shape = c.MSize == 16 && c.NSize == 16 && c.KSize == 16 && c.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                           c.ResultType == VK_COMPONENT_TYPE_FLOAT32_NV && c.scope == VK_SCOPE_SUBGROUP_NV && c.AType == c.BType;
        f16_config = f16_config || (shape && c.AType == VK_COMPONENT_TYPE_FLOAT16_NV);
        bf16_config = bf16_config || (shape && c.AType == khr_compat::component_bfloat16);
      }
    }
    if (khr_coop.cooperativeMatrix) {
      caps.coopmat_khr = f16_config && options.variants.coopmat_khr != "0";
      caps.coopmat_bf16 = bf16_config && has_bf16_ext && bf16_features.shaderBFloat16Type &&
                          bf16_features.shaderBFloat16CooperativeMatrix && options.variants.coopmat_bf16 != "0";
    }
    if (caps.coopmat_khr || caps.coopmat_bf16) {
      info.coopmat_khr = caps.coopmat_khr;
      info.coopmat_bf16 = caps.coopmat_bf16;
      extensions.push_back("VK_KHR_cooperative_matrix");
      if (caps.coopmat_bf16) extensions.push_back("VK_KHR_shader_bfloat16");
      khr_coop.cooperativeMatrixRobustBufferAccess = VK_FALSE;
      bf16_features.shaderBFloat16DotProduct = VK_FALSE;
    }
  }

  // Packed 8-bit integer dot products (the decode matrix-vector kernels on 8-bit x).
  auto dot_features = vk_struct<VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR);
  if (has_extension(chosen, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) {
    auto query = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    query.pNext = &dot_features;
    vkGetPhysicalDeviceFeatures2(chosen, &query);
    if (dot_features.shaderIntegerDotProduct) {
      auto dot_props = vk_struct<VkPhysicalDeviceShaderIntegerDotProductPropertiesKHR>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES_KHR);
      auto props = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
      props.pNext = &dot_props;
      vkGetPhysicalDeviceProperties2(chosen, &props);
      caps.integer_dot = true;
      caps.integer_dot_fast = dot_props.integerDotProduct4x8BitPackedSignedAccelerated == VK_TRUE;
      info.integer_dot = true, info.integer_dot_fast = caps.integer_dot_fast;
      extensions.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    }
  }

  // Host memory the device copies to and from itself (vk_host_import.hpp): a data-parallel
  // step's gradients and sums, with no staging copy on the host.
  if (has_extension(chosen, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME)) {
    auto host_props = vk_struct<VkPhysicalDeviceExternalMemoryHostPropertiesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT);
    auto props = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props.pNext = &host_props;
    vkGetPhysicalDeviceProperties2(chosen, &props);
    if (host_props.minImportedHostPointerAlignment) {
      d->host_import_alignment = host_props.minImportedHostPointerAlignment;
      extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    }
  }

  // Compiler statistics of each pipeline, for tuning kernels (off by default: capturing them
  // may cost pipeline-creation time).
  auto exec_features = vk_struct<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  if (const char* st = std::getenv("MESH_PIPELINE_STATS");
      st && std::strcmp(st, "1") == 0 && has_extension(chosen, "VK_KHR_pipeline_executable_properties")) {
    exec_features.pipelineExecutableInfo = VK_TRUE;
    extensions.push_back("VK_KHR_pipeline_executable_properties");
    d->pipeline_stats = true;
  }

  const float prio[2] = {1.0f, 1.0f};
  std::array<VkDeviceQueueCreateInfo, 2> qci{};
  qci[0] = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci[0].queueFamilyIndex = d->queue_family;
  qci[0].queueCount = second_queue ? 2 : 1;
  qci[0].pQueuePriorities = prio;
  qci[1] = qci[0];
  qci[1].queueFamilyIndex = d->copy_family;
  qci[1].queueCount = 1;
  auto enable16 = vk_struct<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
  enable16.storageBuffer16BitAccess = s16.storageBuffer16BitAccess;
  auto dci = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.pNext = &enable16;
  if (caps.coopmat_f16) enable16.pNext = &coop_features;  // -> f16_features -> model_features
  if (d->pipeline_stats) {
    exec_features.pNext = enable16.pNext;
    enable16.pNext = &exec_features;
  }
  if (caps.integer_dot) {
    dot_features.pNext = enable16.pNext;
    enable16.pNext = &dot_features;
  }
  if (d->full_subgroups) {
    size_control.pNext = enable16.pNext;
    enable16.pNext = &size_control;
  }
  if (caps.coopmat_khr || caps.coopmat_bf16) {  // -> khr_coop (-> bf16_features)
    if (caps.coopmat_bf16) {
      bf16_features.pNext = enable16.pNext;
      khr_coop.pNext = &bf16_features;
    } else {
      khr_coop.pNext = enable16.pNext;
    }
    enable16.pNext = &khr_coop;
  }
  dci.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  dci.ppEnabledExtensionNames = extensions.empty() ? nullptr : extensions.data();
  dci.queueCreateInfoCount = d->copy_family != d->queue_family ? 2 : 1;
  dci.pQueueCreateInfos = qci.data();
  if (VkResult r = vkCreateDevice(chosen, &dci, nullptr, &d->device); r != VK_SUCCESS) {
    d->device = VK_NULL_HANDLE;
    return tl::unexpected(vk_error(r, "vkCreateDevice(" + info.name + ")"));
  }
  vkGetDeviceQueue(d->device, d->queue_family, 0, &d->queue);
  if (d->copy_family != d->queue_family) vkGetDeviceQueue(d->device, d->copy_family, 0, &d->copy_queue);
  else if (second_queue) vkGetDeviceQueue(d->device, d->queue_family, 1, &d->copy_queue);
  else d->copy_queue = d->queue;
  return d;
}

void vk_device::share_buffer(VkBufferCreateInfo& info) const {
  if (copy_family == queue_family) {
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    return;
  }
  info.sharingMode = VK_SHARING_MODE_CONCURRENT;
  info.queueFamilyIndexCount = 2;
  info.pQueueFamilyIndices = both_families.data();
}

void vk_device::print_pipeline_stats(VkPipeline pipeline, const std::string& name) const {
  auto props_fn = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto stats_fn = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  if (!props_fn || !stats_fn) return;
  auto pi = vk_struct<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
  pi.pipeline = pipeline;
  uint32_t count = 0;
  props_fn(device, &pi, &count, nullptr);
  for (uint32_t e = 0; e < count; ++e) {
    auto ei = vk_struct<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
    ei.pipeline = pipeline;
    ei.executableIndex = e;
    uint32_t n = 0;
    stats_fn(device, &ei, &n, nullptr);
    std::vector<VkPipelineExecutableStatisticKHR> st(n, vk_struct<VkPipelineExecutableStatisticKHR>(
                                                            VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR));
    stats_fn(device, &ei, &n, st.data());
    std::string line = "[pipeline stats] " + name + ":";
    for (const auto& x : st) {
      line += std::string(" ") + x.name + "=";
      switch (x.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: line += x.value.b32 ? "yes" : "no"; break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: line += std::to_string(x.value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: line += std::to_string(x.value.u64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: line += std::to_string(x.value.f64); break;
        default: break;
      }
      line += ";";
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace mesh::gpu
