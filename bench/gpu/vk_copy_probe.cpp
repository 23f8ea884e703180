// vk_copy_probe: bandwidth of vkCmdCopyBuffer between a DEVICE_LOCAL buffer and host memory on one
// queue of each queue family with TRANSFER or COMPUTE: is a transfer-only family (NVIDIA's copy
// engines) faster than the universal/compute queue? Host memory: "vk-alloc", a HOST_VISIBLE|
// HOST_COHERENT type from vkAllocateMemory (a staging buffer), and "imported", mmap(MAP_SHARED|
// MAP_ANONYMOUS) pages imported with VK_EXT_external_memory_host. Per family x host memory x
// direction x split (1 copy of everything, or 100 copies of ~1%: a training step's 100 parameters):
// median GB/s (1e9 B/s) over `reps`, each timed from vkQueueSubmit to vkWaitForFences returning
// (recorded before). Each configuration is checked first (pattern host -> device -> other host
// region; "CHECK FAILED" and exit status 2 on a mismatch). With a transfer-only family, a d2h copy
// runs on it while the compute family copies too, to see whether they overlap.
//
// Build: g++ -O2 -std=c++20 -o /tmp/vk_copy_probe bench/gpu/vk_copy_probe.cpp -lvulkan
// Run:   /tmp/vk_copy_probe [MiB=400] [reps=8] [device index=0]   (standalone: not in CMake)
#include <sys/mman.h>
#include <unistd.h>
#include <vulkan/vulkan.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

static void check(VkResult r, const char* call, int line) {
  if (r == VK_SUCCESS) return;
  std::fprintf(stderr, "vk_copy_probe.cpp:%d: %s failed: VkResult %d\n", line, call, static_cast<int>(r));
  std::exit(1);
}
#define VK(call) check((call), #call, __LINE__)

using clk = std::chrono::steady_clock;
using recorder = std::function<void(VkCommandBuffer)>;
static double since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }
static double median(std::vector<double> v) {  // the upper one for an even count
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}
static std::string join_flags(uint32_t f, std::initializer_list<std::pair<uint32_t, const char*>> names) {
  std::string s;
  for (auto& [bit, name] : names)
    if (f & bit) s += (s.empty() ? "" : "|") + std::string(name);
  return s.empty() ? "-" : s;
}
static std::string queue_flags(VkQueueFlags f) {  // 0x20/0x40/0x100: video decode/encode, optical flow
  return join_flags(f, {{VK_QUEUE_GRAPHICS_BIT, "G"}, {VK_QUEUE_COMPUTE_BIT, "C"}, {VK_QUEUE_TRANSFER_BIT, "T"},
                        {VK_QUEUE_SPARSE_BINDING_BIT, "S"}, {VK_QUEUE_PROTECTED_BIT, "P"}, {0x20, "VD"}, {0x40, "VE"}, {0x100, "OF"}});
}
static std::string memory_flags(VkMemoryPropertyFlags f) {
  return join_flags(f, {{VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "DEVICE_LOCAL"}, {VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, "HOST_VISIBLE"},
                        {VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, "HOST_COHERENT"}, {VK_MEMORY_PROPERTY_HOST_CACHED_BIT, "HOST_CACHED"}});
}

struct buffer_memory { VkBuffer buf = VK_NULL_HANDLE; VkDeviceMemory mem = VK_NULL_HANDLE; uint8_t* ptr = nullptr; };

struct probe {
  VkPhysicalDevice pd = VK_NULL_HANDLE;
  VkDevice dev = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties mp{};
  std::vector<uint32_t> families;  // the families tested, one queue each
  struct queue_slot { VkQueue q = VK_NULL_HANDLE; VkCommandPool pool = VK_NULL_HANDLE; std::array<VkCommandBuffer, 2> cb{}; std::array<VkFence, 2> fence{}; };
  std::vector<queue_slot> qs;  // qs[i] on families[i]; 2 command buffers and fences: the concurrency test uses 2 at once

  VkBuffer buffer(VkDeviceSize size, const void* next) {
    const bool shared = families.size() > 1;  // concurrent over all the families: no ownership transfers
    const VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, next, 0, size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                 shared ? VK_SHARING_MODE_CONCURRENT : VK_SHARING_MODE_EXCLUSIVE,
                                 shared ? static_cast<uint32_t>(families.size()) : 0, shared ? families.data() : nullptr};
    VkBuffer b;
    VK(vkCreateBuffer(dev, &bci, nullptr, &b));
    return b;
  }
  // A type in `bits` with all of `want`; among those, best without `avoid`, then with all of `prefer`.
  int type(uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer, VkMemoryPropertyFlags avoid) const {
    int best = -1, best_score = -1;
    for (uint32_t t = 0; t < mp.memoryTypeCount; ++t) {
      const auto f = mp.memoryTypes[t].propertyFlags;
      if (!(bits & (1u << t)) || (f & want) != want) continue;
      const int score = (f & avoid ? 0 : 2) + ((f & prefer) == prefer ? 1 : 0);
      if (score > best_score) best = static_cast<int>(t), best_score = score;
    }
    return best;
  }
  void describe(const char* what, VkDeviceSize size, int t) const {
    std::printf("%-9s %9.1f MiB in memory type %d (%s, heap %u)\n", what, size / 1048576.0, t, memory_flags(mp.memoryTypes[t].propertyFlags).c_str(),
                mp.memoryTypes[t].heapIndex);
  }
  buffer_memory alloc(const char* what, VkDeviceSize size, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer, VkMemoryPropertyFlags avoid) {
    buffer_memory b{buffer(size, nullptr)};
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, b.buf, &req);
    const int t = type(req.memoryTypeBits, want, prefer, avoid);
    if (t < 0) std::fprintf(stderr, "no memory type for %s (%s)\n", what, memory_flags(want).c_str()), std::exit(1);
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, req.size, static_cast<uint32_t>(t)};
    VK(vkAllocateMemory(dev, &mai, nullptr, &b.mem));
    VK(vkBindBufferMemory(dev, b.buf, b.mem, 0));
    if (want & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) VK(vkMapMemory(dev, b.mem, 0, VK_WHOLE_SIZE, 0, reinterpret_cast<void**>(&b.ptr)));
    describe(what, size, t);
    return b;
  }
  void release(buffer_memory& b) { vkDestroyBuffer(dev, b.buf, nullptr), vkFreeMemory(dev, b.mem, nullptr), b = buffer_memory{}; }  // null handles: no-ops
  void record(size_t q, int slot, const recorder& rec) {
    VkCommandBuffer cb = qs[q].cb[slot];
    const VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, nullptr};
    VK(vkResetCommandBuffer(cb, 0));
    VK(vkBeginCommandBuffer(cb, &bi));
    rec(cb);
    VK(vkEndCommandBuffer(cb));
  }
  void submit(size_t q, int slot) {
    const VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO, nullptr, 0, nullptr, nullptr, 1, &qs[q].cb[slot], 0, nullptr};
    VK(vkQueueSubmit(qs[q].q, 1, &si, qs[q].fence[slot]));
  }
  // `reps` times: seconds from vkQueueSubmit to vkWaitForFences returning.
  std::vector<double> times(size_t q, const recorder& rec, int reps = 1) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      record(q, 0, rec);
      const auto t0 = clk::now();
      submit(q, 0);
      VK(vkWaitForFences(dev, 1, &qs[q].fence[0], VK_TRUE, UINT64_MAX));
      t.push_back(since(t0));
      VK(vkResetFences(dev, 1, &qs[q].fence[0]));
    }
    return t;
  }
};

// `n` bytes from src+so to dst+dO, as `pieces` vkCmdCopyBuffer of ~n/pieces bytes (256-aligned).
static void copy(VkCommandBuffer cb, VkBuffer src, VkDeviceSize so, VkBuffer dst, VkDeviceSize dO, VkDeviceSize n, int pieces) {
  VkDeviceSize chunk = n / pieces / 256 * 256;
  if (chunk == 0) chunk = n, pieces = 1;
  for (int i = 0; i < pieces; ++i) {
    const VkDeviceSize off = i * chunk;
    const VkBufferCopy r{so + off, dO + off, i == pieces - 1 ? n - off : chunk};
    vkCmdCopyBuffer(cb, src, dst, 1, &r);
  }
}
// Makes the transfer writes so far available to `access` at `stage` (HOST: the CPU reads after the fence).
static void barrier(VkCommandBuffer cb, VkAccessFlags access, VkPipelineStageFlags stage) {
  const VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_TRANSFER_WRITE_BIT, access};
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, stage, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

struct host_memory {  // 2 regions of `size` bytes: [0, size) the source of h2d, [off1, off1 + size) the target of d2h
  const char* name; buffer_memory b; VkDeviceSize off1; void* map = nullptr; size_t map_len = 0;  // map: imported's mmap
};

// Imports 2 regions of mmap'd memory; false with `why` when it can't.
static bool import_host(probe& p, VkDeviceSize size, VkDeviceSize align, host_memory& h, std::string& why) {
  const VkDeviceSize page = static_cast<VkDeviceSize>(sysconf(_SC_PAGESIZE)), a = std::max(align, page), region = (size + a - 1) / a * a,
                     total = 2 * region;
  const auto handle = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  const VkPhysicalDeviceExternalBufferInfo ebi{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO, nullptr, 0,
                                               VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, handle};
  VkExternalBufferProperties ebp{VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES, nullptr, {}};
  vkGetPhysicalDeviceExternalBufferProperties(p.pd, &ebi, &ebp);
  if (!(ebp.externalMemoryProperties.externalMemoryFeatures & VK_EXTERNAL_MEMORY_FEATURE_IMPORTABLE_BIT))
    return why = "HOST_ALLOCATION is not importable for transfer buffers", false;
  h.map_len = total + (a > page ? a : 0);
  h.map = mmap(nullptr, h.map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (h.map == MAP_FAILED) return h.map = nullptr, why = std::string("mmap: ") + std::strerror(errno), false;
  uint8_t* ptr = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(h.map) + a - 1) / a * a);
  std::memset(ptr, 0, total);  // fault the pages in before the driver pins them
  auto props_fn = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(vkGetDeviceProcAddr(p.dev, "vkGetMemoryHostPointerPropertiesEXT"));
  VkMemoryHostPointerPropertiesEXT hp{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT, nullptr, 0};
  if (!props_fn) return why = "no vkGetMemoryHostPointerPropertiesEXT", false;
  if (VkResult r = props_fn(p.dev, handle, ptr, &hp); r != VK_SUCCESS)
    return why = "vkGetMemoryHostPointerPropertiesEXT: VkResult " + std::to_string(r), false;
  const VkExternalMemoryBufferCreateInfo ext{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, nullptr, handle};
  h.b.buf = p.buffer(total, &ext);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(p.dev, h.b.buf, &req);
  const int t = p.type(hp.memoryTypeBits & req.memoryTypeBits, 0, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
  if (t < 0) return why = "no memory type both the pointer and the buffer allow", false;
  if (req.size > total) return why = "the buffer needs " + std::to_string(req.size) + " bytes, more than imported", false;
  const VkImportMemoryHostPointerInfoEXT imp{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, nullptr, handle, ptr};
  const VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &imp, total, static_cast<uint32_t>(t)};
  if (VkResult r = vkAllocateMemory(p.dev, &mai, nullptr, &h.b.mem); r != VK_SUCCESS)
    return h.b.mem = VK_NULL_HANDLE, why = "vkAllocateMemory (import): VkResult " + std::to_string(r), false;
  VK(vkBindBufferMemory(p.dev, h.b.buf, h.b.mem, 0));
  h.b.ptr = ptr, h.off1 = region;
  p.describe(h.name, total, t);
  return true;
}

int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 400;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 8, devi = argc > 3 ? std::atoi(argv[3]) : 0;
  if (mib < 1 || reps < 1 || devi < 0) return std::fprintf(stderr, "usage: %s [MiB=400] [reps=8] [device index=0]\n", argv[0]), 1;
  const VkDeviceSize size = static_cast<VkDeviceSize>(mib) << 20;

  const VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO, nullptr, "vk_copy_probe", 1, nullptr, 0, VK_API_VERSION_1_1};
  const VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, nullptr, 0, &app, 0, nullptr, 0, nullptr};
  VkInstance inst;
  VK(vkCreateInstance(&ici, nullptr, &inst));
  uint32_t n = 0;
  VK(vkEnumeratePhysicalDevices(inst, &n, nullptr));
  std::vector<VkPhysicalDevice> pds(n);
  VK(vkEnumeratePhysicalDevices(inst, &n, pds.data()));
  if (static_cast<uint32_t>(devi) >= n) return std::fprintf(stderr, "device index %d: there are %u devices\n", devi, n), 1;
  probe p;
  p.pd = pds[devi];
  VK(vkEnumerateDeviceExtensionProperties(p.pd, nullptr, &n, nullptr));
  std::vector<VkExtensionProperties> exts(n);
  VK(vkEnumerateDeviceExtensionProperties(p.pd, nullptr, &n, exts.data()));
  auto has = [&](const char* name) { return std::any_of(exts.begin(), exts.end(), [&](auto& e) { return !std::strcmp(e.extensionName, name); }); };
  const bool host_ext = has(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME), drv_ext = has(VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME);
  VkPhysicalDeviceExternalMemoryHostPropertiesEXT hostp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT, nullptr, 0};
  VkPhysicalDeviceDriverPropertiesKHR drv{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES_KHR, nullptr, {}, {}, {}, {}};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, nullptr, {}};
  void** tail = &p2.pNext;
  if (host_ext) *tail = &hostp, tail = &hostp.pNext;
  if (drv_ext) *tail = &drv;
  vkGetPhysicalDeviceProperties2(p.pd, &p2);
  vkGetPhysicalDeviceMemoryProperties(p.pd, &p.mp);
  const auto& props = p2.properties;
  const uint32_t dv = props.driverVersion;
  const bool nv = props.vendorID == 0x10DE;  // NVIDIA packs its driver version as 10.8.8.6 bits
  char version[64];
  std::snprintf(version, sizeof version, "%u.%u.%u", nv ? dv >> 22 : VK_API_VERSION_MAJOR(dv), nv ? (dv >> 14) & 0xff : VK_API_VERSION_MINOR(dv),
                nv ? (dv >> 6) & 0xff : VK_API_VERSION_PATCH(dv));
  std::printf("device %d: %s (vendor 0x%04x, device 0x%04x), Vulkan %u.%u.%u, driver version %s (0x%08x)%s%s%s%s\n", devi,
              props.deviceName, props.vendorID, props.deviceID, VK_API_VERSION_MAJOR(props.apiVersion), VK_API_VERSION_MINOR(props.apiVersion),
              VK_API_VERSION_PATCH(props.apiVersion), version, dv, drv_ext ? ", " : "", drv_ext ? drv.driverName : "",
              drv_ext ? " " : "", drv_ext ? drv.driverInfo : "");
  std::printf("copy size %ld MiB, %d reps, VK_EXT_external_memory_host: %s (minImportedHostPointerAlignment %llu)\n", mib, reps,
              host_ext ? "yes" : "no", static_cast<unsigned long long>(hostp.minImportedHostPointerAlignment));

  // queue_slot families: one queue from each with TRANSFER or COMPUTE.
  vkGetPhysicalDeviceQueueFamilyProperties(p.pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> qf(n);
  vkGetPhysicalDeviceQueueFamilyProperties(p.pd, &n, qf.data());
  const float priority = 1.0f;
  std::vector<VkDeviceQueueCreateInfo> qcis;
  for (uint32_t i = 0; i < n; ++i) {
    const bool tested = qf[i].queueFlags & (VK_QUEUE_TRANSFER_BIT | VK_QUEUE_COMPUTE_BIT);
    std::printf("queue family %u: %-14s x%-2u%s\n", i, queue_flags(qf[i].queueFlags).c_str(), qf[i].queueCount, tested ? "" : "  (not tested)");
    if (!tested) continue;
    p.families.push_back(i);
    qcis.push_back({VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, nullptr, 0, i, 1, &priority});
  }
  const char* ext_names[] = {VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME};
  const VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, nullptr, 0, static_cast<uint32_t>(qcis.size()), qcis.data(), 0, nullptr,
                               host_ext ? 1u : 0u, ext_names, nullptr};
  VK(vkCreateDevice(p.pd, &dci, nullptr, &p.dev));
  for (uint32_t f : p.families) {
    probe::queue_slot q;
    vkGetDeviceQueue(p.dev, f, 0, &q.q);
    const VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, nullptr, VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, f};
    VK(vkCreateCommandPool(p.dev, &pci, nullptr, &q.pool));
    const VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, nullptr, q.pool, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 2};
    VK(vkAllocateCommandBuffers(p.dev, &cai, q.cb.data()));
    const VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, nullptr, 0};
    for (VkFence& fence : q.fence) VK(vkCreateFence(p.dev, &fci, nullptr, &fence));
    p.qs.push_back(q);
  }

  const auto DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, HC = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  buffer_memory dev_a = p.alloc("device", size, DL, 0, HV);        // the copies' device side
  buffer_memory dev_b = p.alloc("device 2", 2 * size, DL, 0, HV);  // the concurrency test's device->device copies
  std::vector<host_memory> hosts;
  hosts.push_back({"vk-alloc", p.alloc("vk-alloc", 2 * size, HV | HC, VK_MEMORY_PROPERTY_HOST_CACHED_BIT, DL), size});
  host_memory imported{"imported", {}, 0};
  std::string why = "VK_EXT_external_memory_host is not supported";
  if (host_ext && import_host(p, size, hostp.minImportedHostPointerAlignment, imported, why)) hosts.push_back(imported);
  else std::printf("imported: skipped: %s\n", why.c_str()), p.release(imported.b);

  int failed = 0;
  uint32_t seed = 1;
  std::printf("\n%-7s %-12s %-9s %-4s %-6s %9s %10s %21s\n", "family", "flags", "host", "dir", "copies", "GB/s", "median ms", "min..max ms");
  for (size_t qi = 0; qi < p.qs.size(); ++qi)
    for (host_memory& h : hosts)
      for (int pieces : {1, 100}) {
        // Check: a pattern through the device into the other region.
        uint32_t* src = reinterpret_cast<uint32_t*>(h.b.ptr);
        const uint32_t* dst = reinterpret_cast<const uint32_t*>(h.b.ptr + h.off1);
        seed = seed * 0x9E3779B9u + 0x7F4A7C15u;
        for (VkDeviceSize i = 0; i < size / 4; ++i) src[i] = static_cast<uint32_t>(i * 2654435761u) ^ seed;
        std::memset(h.b.ptr + h.off1, 0, size);
        p.times(qi, [&](VkCommandBuffer cb) {
          copy(cb, h.b.buf, 0, dev_a.buf, 0, size, pieces);
          barrier(cb, VK_ACCESS_TRANSFER_READ_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT);
          copy(cb, dev_a.buf, 0, h.b.buf, h.off1, size, pieces);
          barrier(cb, VK_ACCESS_HOST_READ_BIT, VK_PIPELINE_STAGE_HOST_BIT);
        });
        if (std::memcmp(src, dst, size)) {
          VkDeviceSize i = 0;
          while (src[i] == dst[i]) ++i;  // the first mismatch
          std::printf("CHECK FAILED: family %u, %s, %d copies: word %llu is 0x%08x, wrote 0x%08x\n", p.families[qi], h.name, pieces,
                      static_cast<unsigned long long>(i), dst[i], src[i]);
          ++failed;
        }
        for (bool h2d : {true, false}) {
          const recorder rec = [&](VkCommandBuffer cb) {
            if (h2d) return copy(cb, h.b.buf, 0, dev_a.buf, 0, size, pieces);
            copy(cb, dev_a.buf, 0, h.b.buf, h.off1, size, pieces);
            barrier(cb, VK_ACCESS_HOST_READ_BIT, VK_PIPELINE_STAGE_HOST_BIT);
          };
          const auto t = p.times(qi, rec, reps);
          const double med = median(t);
          std::printf("%-7u %-12s %-9s %-4s %-6d %9.2f %10.3f %10.3f..%-10.3f\n", p.families[qi], queue_flags(qf[p.families[qi]].queueFlags).c_str(),
                      h.name, h2d ? "h2d" : "d2h", pieces, size / med / 1e9, med * 1e3, *std::min_element(t.begin(), t.end()) * 1e3,
                      *std::max_element(t.begin(), t.end()) * 1e3);
        }
      }

  // Concurrency: a d2h copy on the transfer-only queue while the compute queue copies.
  int tq = -1, cq = -1;
  for (size_t qi = 0; qi < p.qs.size(); ++qi) {
    const auto f = qf[p.families[qi]].queueFlags;
    if (tq < 0 && !(f & (VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT))) tq = static_cast<int>(qi);
    if ((f & VK_QUEUE_COMPUTE_BIT) && (cq < 0 || (qf[p.families[cq]].queueFlags & VK_QUEUE_GRAPHICS_BIT))) cq = static_cast<int>(qi);
  }
  if (tq < 0 || cq < 0) std::printf("\nconcurrency: skipped: no %s queue family\n", tq < 0 ? "transfer-only" : "compute");
  else {
    host_memory& vk = hosts[0];
    const recorder d2h = [&](VkCommandBuffer cb) {
      copy(cb, dev_a.buf, 0, vk.b.buf, vk.off1, size, 1);
      barrier(cb, VK_ACCESS_HOST_READ_BIT, VK_PIPELINE_STAGE_HOST_BIT);
    };
    const recorder h2d = [&](VkCommandBuffer cb) { copy(cb, vk.b.buf, 0, dev_b.buf, 0, size, 1); };
    auto d2d = [&](int k) -> recorder {  // k times the first half of dev_b into its second half
      return [&, k](VkCommandBuffer cb) {
        for (int i = 0; i < k; ++i) {
          if (i) barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT);
          copy(cb, dev_b.buf, 0, dev_b.buf, size, size, 1);
        }
      };
    };
    auto alone = [&](int q, const recorder& rec) { return median(p.times(q, rec, reps)); };
    // Medians of: the transfer queue's time, the compute queue's, both (from the first submit).
    auto together = [&](const recorder& on_t, const recorder& on_c) {
      std::vector<double> ta, tc, tb;
      for (int r = 0; r < reps; ++r) {
        p.record(tq, 0, on_t), p.record(cq, 1, on_c);
        const auto t0 = clk::now();
        p.submit(tq, 0), p.submit(cq, 1);
        VkFence f[2] = {p.qs[tq].fence[0], p.qs[cq].fence[1]}, left[2];
        double done[2] = {-1, -1};
        for (uint32_t nl = 2; nl;) {  // wait for either, note which it was, then for the other
          VK(vkWaitForFences(p.dev, nl, nl == 2 ? f : left, VK_FALSE, UINT64_MAX));
          const double t = since(t0);
          nl = 0;
          for (int i = 0; i < 2; ++i)
            if (done[i] < 0 && vkGetFenceStatus(p.dev, f[i]) == VK_SUCCESS) done[i] = t;
            else if (done[i] < 0) left[nl++] = f[i];
        }
        VK(vkResetFences(p.dev, 2, f));
        ta.push_back(done[0]), tc.push_back(done[1]), tb.push_back(std::max(done[0], done[1]));
      }
      return std::array<double, 3>{median(ta), median(tc), median(tb)};
    };
    const double t_d2h = alone(tq, d2h), t_d2d1 = alone(cq, d2d(1));
    const int k = static_cast<int>(std::clamp(t_d2h / t_d2d1 + 0.5, 1.0, 256.0));  // compute-side work about as long as the d2h
    std::printf("\nconcurrency: family %u (transfer) d2h of %ld MiB to vk-alloc || family %u (compute); median ms; "
                "overlap = (a + b - both) / min(a, b): 1 concurrent, 0 serialized\n", p.families[tq], mib, p.families[cq]);
    const std::pair<std::string, recorder> others[] = {{"d2d x" + std::to_string(k), d2d(k)}, {"h2d", h2d}};
    for (auto& [name, rec] : others) {
      const double a = t_d2h, b = alone(cq, rec);
      const auto [ta, tc, tb] = together(d2h, rec);
      std::printf("  T d2h || C %-8s: alone %.3f + %.3f ms, together %.3f and %.3f ms, both done %.3f ms, overlap %.2f\n", name.c_str(),
                  a * 1e3, b * 1e3, ta * 1e3, tc * 1e3, tb * 1e3, (a + b - tb) / std::min(a, b));
    }
  }

  VK(vkDeviceWaitIdle(p.dev));
  for (host_memory& h : hosts) p.release(h.b);
  if (imported.map) munmap(imported.map, imported.map_len);
  p.release(dev_a), p.release(dev_b);
  for (auto& q : p.qs) {
    for (VkFence f : q.fence) vkDestroyFence(p.dev, f, nullptr);
    vkDestroyCommandPool(p.dev, q.pool, nullptr);  // frees its command buffers
  }
  vkDestroyDevice(p.dev, nullptr);
  vkDestroyInstance(inst, nullptr);
  if (failed) std::printf("%d CHECK FAILED\n", failed);
  return failed ? 2 : 0;
}
