#include "gpu/memory_probe.hpp"

#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unistd.h>
#include <string>
#include <vector>

#include "gpu/vk_device.hpp"

namespace mesh::gpu {

const char* to_string(memory_source s) {
  switch (s) {
    case memory_source::driver_budget: return "the driver's memory budget";
    case memory_source::host_available: return "the host's available memory";
    case memory_source::device_size: return "the device's size";
  }
  return "?";
}

std::optional<uint64_t> parse_mem_available(std::string_view meminfo) {
  constexpr std::string_view key = "MemAvailable:";
  for (size_t at = 0; at < meminfo.size();) {
    const size_t end = std::min(meminfo.find('\n', at), meminfo.size());
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (!line.starts_with(key)) continue;
    line.remove_prefix(key.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    uint64_t kb = 0;
    size_t digits = 0;
    for (; digits < line.size() && line[digits] >= '0' && line[digits] <= '9'; ++digits) {
      if (kb > (UINT64_MAX >> 10) / 10) return std::nullopt;  // would overflow as bytes
      kb = kb * 10 + static_cast<uint64_t>(line[digits] - '0');
    }
    if (digits == 0 || line.substr(digits) != " kB") return std::nullopt;
    return kb << 10;
  }
  return std::nullopt;
}

namespace {

class host_probe final : public memory_probe {
 public:
  explicit host_probe(uint64_t size) : size_(size) {}
  uint64_t free_bytes() const override {
    std::ifstream in("/proc/meminfo");
    std::stringstream text;
    text << in.rdbuf();
    const auto available = parse_mem_available(text.str());
    return std::min(available.value_or(size_), size_);
  }
  memory_source source() const override { return memory_source::host_available; }

 private:
  uint64_t size_;
};

class size_probe final : public memory_probe {
 public:
  explicit size_probe(uint64_t size) : size_(size) {}
  uint64_t free_bytes() const override { return size_; }
  memory_source source() const override { return memory_source::device_size; }

 private:
  uint64_t size_;
};

/// Its own instance: the executors' instances stay theirs, and this one is only ever asked for
/// the physical device's memory properties.
class budget_probe final : public memory_probe {
 public:
  budget_probe(VkInstance instance, VkPhysicalDevice physical, uint64_t size) : instance_(instance), physical_(physical), size_(size) {}
  ~budget_probe() override { vkDestroyInstance(instance_, nullptr); }
  budget_probe(const budget_probe&) = delete;
  budget_probe& operator=(const budget_probe&) = delete;

  uint64_t free_bytes() const override {
    auto budget = vk_struct<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
    auto props = vk_struct<VkPhysicalDeviceMemoryProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
    props.pNext = &budget;
    {
      std::lock_guard<std::mutex> lock(m_);
      vkGetPhysicalDeviceMemoryProperties2(physical_, &props);
    }
    uint64_t free = 0;
    for (uint32_t h = 0; h < props.memoryProperties.memoryHeapCount; ++h)
      if (props.memoryProperties.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        free += budget.heapBudget[h] > budget.heapUsage[h] ? budget.heapBudget[h] - budget.heapUsage[h] : 0;
    return std::min(free, size_);
  }
  memory_source source() const override { return memory_source::driver_budget; }

 private:
  VkInstance instance_;
  VkPhysicalDevice physical_;
  uint64_t size_;
  mutable std::mutex m_;
};

bool offers_budget(VkPhysicalDevice p) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(p, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> ext(n);
  vkEnumerateDeviceExtensionProperties(p, nullptr, &n, ext.data());
  return std::any_of(ext.begin(), ext.end(), [](const auto& e) { return std::strcmp(e.extensionName, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME) == 0; });
}

/// The physical device with `uuid` offering the budget extension, on a new instance; nullptr
/// (and nothing left open) otherwise.
std::unique_ptr<memory_probe> budget_probe_for(const device_info& info) {
  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "meshnode memory probe";
  app.apiVersion = VK_API_VERSION_1_1;
  auto ici = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ici.pApplicationInfo = &app;
  VkInstance instance = VK_NULL_HANDLE;
  if (vkCreateInstance(&ici, nullptr, &instance) != VK_SUCCESS) return nullptr;
  uint32_t count = 0;
  vkEnumeratePhysicalDevices(instance, &count, nullptr);
  std::vector<VkPhysicalDevice> devices(count);
  vkEnumeratePhysicalDevices(instance, &count, devices.data());
  for (auto p : devices) {
    auto ids = vk_struct<VkPhysicalDeviceIDProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES);
    auto p2 = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    p2.pNext = &ids;
    vkGetPhysicalDeviceProperties2(p, &p2);
    if (p2.properties.apiVersion < VK_API_VERSION_1_1 || !std::equal(info.uuid.begin(), info.uuid.end(), std::begin(ids.deviceUUID))) continue;
    if (!offers_budget(p)) break;
    return std::make_unique<budget_probe>(instance, p, info.memory_bytes);
  }
  vkDestroyInstance(instance, nullptr);
  return nullptr;
}

uint64_t host_size() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace

std::unique_ptr<memory_probe> make_memory_probe(const device_info& info) {
  if (info.kind == "cpu") return std::make_unique<host_probe>(info.memory_bytes > 0 ? info.memory_bytes : host_size());
  const bool has_uuid = std::any_of(info.uuid.begin(), info.uuid.end(), [](uint8_t b) { return b != 0; });
  if (has_uuid)
    if (auto p = budget_probe_for(info)) return p;
  return std::make_unique<size_probe>(info.memory_bytes);
}

}  // namespace mesh::gpu
