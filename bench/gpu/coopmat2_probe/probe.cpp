// Probe: a GEMM on VK_NV_cooperative_matrix2 workgroup-scope matrices (f16 or bf16 in, f32
// accumulation, the same type out), C = A B for N x N row-major matrices; prints the device's
// cooperative-matrix properties, the best of 5 timings of 20 back-to-back dispatches, and a check
// of 256 entries against double math on the rounded inputs. Built by build.sh beside it.
// usage: probe SPV WG BM BN BK [N] [bf16]   (spec constants 0-3: workgroup size, tile M, N, K)
#include <vulkan/vulkan.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#define CK(x) do { VkResult r_ = (x); if (r_ != VK_SUCCESS) { std::fprintf(stderr, "%s failed: %d\n", #x, r_); std::exit(1); } } while (0)

static uint16_t to_bf16(float f) { uint32_t u; std::memcpy(&u, &f, 4); return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16); }
static float from_bf16(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }

int main(int argc, char** argv) {
  if (argc < 6) { std::fprintf(stderr, "usage\n"); return 2; }
  std::string spv_path = argv[1];
  uint32_t wg = std::atoi(argv[2]), bm = std::atoi(argv[3]), bn = std::atoi(argv[4]), bk = std::atoi(argv[5]);
  uint32_t n = argc > 6 ? std::atoi(argv[6]) : 4096;
  bool bf16 = argc > 7 && std::string(argv[7]) == "bf16";

  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.apiVersion = VK_API_VERSION_1_3;
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  VkInstance inst;
  CK(vkCreateInstance(&ici, nullptr, &inst));
  uint32_t pc = 0;
  vkEnumeratePhysicalDevices(inst, &pc, nullptr);
  std::vector<VkPhysicalDevice> pds(pc);
  vkEnumeratePhysicalDevices(inst, &pc, pds.data());
  VkPhysicalDevice pd = pds[0];
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(pd, &props);
  std::printf("device %s driver %u api %u.%u\n", props.deviceName, props.driverVersion,
              VK_API_VERSION_MAJOR(props.apiVersion), VK_API_VERSION_MINOR(props.apiVersion));
  uint32_t ec = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ec, nullptr);
  std::vector<VkExtensionProperties> exts(ec);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ec, exts.data());
  for (auto& e : exts)
    if (std::strstr(e.extensionName, "cooperative") || std::strstr(e.extensionName, "bfloat") ||
        std::strstr(e.extensionName, "float8"))
      std::printf("ext %s v%u\n", e.extensionName, e.specVersion);

  {
    auto kp = (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)vkGetInstanceProcAddr(
        inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
    if (kp) {
      uint32_t c = 0;
      kp(pd, &c, nullptr);
      std::vector<VkCooperativeMatrixPropertiesKHR> v(c, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR});
      kp(pd, &c, v.data());
      for (auto& x : v)
        std::printf("khr M%u N%u K%u A%d B%d C%d R%d scope %d\n", x.MSize, x.NSize, x.KSize, x.AType, x.BType,
                    x.CType, x.ResultType, x.scope);
    }
    auto fp = (PFN_vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV)vkGetInstanceProcAddr(
        inst, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
    if (fp) {
      uint32_t c = 0;
      fp(pd, &c, nullptr);
      std::vector<VkCooperativeMatrixFlexibleDimensionsPropertiesNV> v(
          c, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV});
      fp(pd, &c, v.data());
      for (auto& x : v)
        std::printf("flex Mg%u Ng%u Kg%u A%d B%d C%d R%d scope %d invocations %u\n", x.MGranularity,
                    x.NGranularity, x.KGranularity, x.AType, x.BType, x.CType, x.ResultType, x.scope,
                    x.workgroupInvocations);
    }
    VkPhysicalDeviceCooperativeMatrix2PropertiesNV p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV};
    VkPhysicalDeviceProperties2 pp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    pp.pNext = &p2;
    vkGetPhysicalDeviceProperties2(pd, &pp);
    std::printf("cm2 props: wg max %u flexmax %u reserved shared %u\n",
                p2.cooperativeMatrixWorkgroupScopeMaxWorkgroupSize,
                p2.cooperativeMatrixFlexibleDimensionsMaxDimension,
                p2.cooperativeMatrixWorkgroupScopeReservedSharedMemory);
  }

  // Features: query all, enable all that the probe needs.
  VkPhysicalDeviceCooperativeMatrix2FeaturesNV f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV};
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR fk{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
  // VkPhysicalDeviceShaderBfloat16FeaturesKHR: sType 1000141000, 3 bools.
  struct { VkStructureType s; void* next; VkBool32 a, b, c; } fb{(VkStructureType)1000141000, nullptr, 0, 0, 0};
  VkPhysicalDeviceVulkan13Features f13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  bool has_bf16_ext = false;
  for (auto& e : exts) if (!std::strcmp(e.extensionName, "VK_KHR_shader_bfloat16")) has_bf16_ext = true;
  f2.pNext = &fk; fk.pNext = &f13; f13.pNext = &f12; f12.pNext = &f11;
  if (has_bf16_ext) f11.pNext = &fb;
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f2;
  vkGetPhysicalDeviceFeatures2(pd, &feats);
  std::printf("cm2 features: wgscope %u flex %u red %u conv %u perelem %u tensor %u block %u; khr %u; bf16 %u %u %u\n",
              f2.cooperativeMatrixWorkgroupScope, f2.cooperativeMatrixFlexibleDimensions,
              f2.cooperativeMatrixReductions, f2.cooperativeMatrixConversions,
              f2.cooperativeMatrixPerElementOperations, f2.cooperativeMatrixTensorAddressing,
              f2.cooperativeMatrixBlockLoads, fk.cooperativeMatrix, fb.a, fb.b, fb.c);

  std::vector<const char*> dext = {"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2"};
  if (has_bf16_ext) dext.push_back("VK_KHR_shader_bfloat16");
  float prio = 1;
  uint32_t qfc = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qfc, nullptr);
  std::vector<VkQueueFamilyProperties> qfs(qfc);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qfc, qfs.data());
  uint32_t qf = 0;
  for (uint32_t i = 0; i < qfc; ++i) if (qfs[i].queueFlags & VK_QUEUE_COMPUTE_BIT) { qf = i; break; }
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = qf; qci.queueCount = 1; qci.pQueuePriorities = &prio;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &feats;
  dci.queueCreateInfoCount = 1; dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = uint32_t(dext.size()); dci.ppEnabledExtensionNames = dext.data();
  VkDevice dev;
  CK(vkCreateDevice(pd, &dci, nullptr, &dev));
  VkQueue q;
  vkGetDeviceQueue(dev, qf, 0, &q);

  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  auto find_type = [&](uint32_t bits, VkMemoryPropertyFlags want) -> int {
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
      if ((bits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) return int(i);
    return -1;
  };
  struct buf { VkBuffer b; VkDeviceMemory m; void* p; };
  auto make = [&](size_t bytes) {
    buf r{};
    VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = bytes; bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    CK(vkCreateBuffer(dev, &bci, nullptr, &r.b));
    VkMemoryRequirements mr; vkGetBufferMemoryRequirements(dev, r.b, &mr);
    int t = find_type(mr.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (t < 0) { std::fprintf(stderr, "no rebar type\n"); std::exit(1); }
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.allocationSize = mr.size; mai.memoryTypeIndex = uint32_t(t);
    CK(vkAllocateMemory(dev, &mai, nullptr, &r.m));
    CK(vkBindBufferMemory(dev, r.b, r.m, 0));
    CK(vkMapMemory(dev, r.m, 0, VK_WHOLE_SIZE, 0, &r.p));
    return r;
  };
  size_t elems = size_t(n) * n;
  buf A = make(elems * 2), B = make(elems * 2), C = make(elems * 2);
  std::vector<float> af(elems), bf(elems);
  for (size_t i = 0; i < elems; ++i) {
    af[i] = float(int((i * 7 + (i >> 12) * 3) % 17) - 8) / 16.f;
    bf[i] = float(int((i * 5 + (i >> 12) * 11) % 13) - 6) / 8.f;
  }
  auto* ap = static_cast<uint16_t*>(A.p);
  auto* bp = static_cast<uint16_t*>(B.p);
  for (size_t i = 0; i < elems; ++i) {
    if (bf16) { ap[i] = to_bf16(af[i]); bp[i] = to_bf16(bf[i]); }
    else { _Float16 x = _Float16(af[i]), y = _Float16(bf[i]); std::memcpy(&ap[i], &x, 2); std::memcpy(&bp[i], &y, 2); }
  }
  std::memset(C.p, 0, elems * 2);

  std::ifstream f(spv_path, std::ios::binary);
  std::vector<char> code((std::istreambuf_iterator<char>(f)), {});
  VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smci.codeSize = code.size(); smci.pCode = reinterpret_cast<const uint32_t*>(code.data());
  VkShaderModule sm;
  CK(vkCreateShaderModule(dev, &smci, nullptr, &sm));
  VkDescriptorSetLayoutBinding bnd[3];
  for (uint32_t i = 0; i < 3; ++i) bnd[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo dlci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dlci.bindingCount = 3; dlci.pBindings = bnd;
  VkDescriptorSetLayout dsl; CK(vkCreateDescriptorSetLayout(dev, &dlci, nullptr, &dsl));
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 12};
  VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  plci.setLayoutCount = 1; plci.pSetLayouts = &dsl; plci.pushConstantRangeCount = 1; plci.pPushConstantRanges = &pcr;
  VkPipelineLayout pl; CK(vkCreatePipelineLayout(dev, &plci, nullptr, &pl));
  uint32_t spec[4] = {wg, bm, bn, bk};
  VkSpecializationMapEntry sme[4];
  for (uint32_t i = 0; i < 4; ++i) sme[i] = {i, i * 4, 4};
  VkSpecializationInfo si{4, sme, 16, spec};
  VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cpci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, nullptr, 0, VK_SHADER_STAGE_COMPUTE_BIT, sm, "main", &si};
  cpci.layout = pl;
  VkPipeline pipe;
  auto t0 = std::chrono::steady_clock::now();
  CK(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpci, nullptr, &pipe));
  std::printf("pipeline %.1f ms\n", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 3};
  VkDescriptorPoolCreateInfo dpci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dpci.maxSets = 1; dpci.poolSizeCount = 1; dpci.pPoolSizes = &ps;
  VkDescriptorPool dp; CK(vkCreateDescriptorPool(dev, &dpci, nullptr, &dp));
  VkDescriptorSetAllocateInfo dsai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  dsai.descriptorPool = dp; dsai.descriptorSetCount = 1; dsai.pSetLayouts = &dsl;
  VkDescriptorSet ds; CK(vkAllocateDescriptorSets(dev, &dsai, &ds));
  VkDescriptorBufferInfo dbi[3] = {{A.b, 0, VK_WHOLE_SIZE}, {B.b, 0, VK_WHOLE_SIZE}, {C.b, 0, VK_WHOLE_SIZE}};
  VkWriteDescriptorSet w[3];
  for (uint32_t i = 0; i < 3; ++i) {
    w[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    w[i].dstSet = ds; w[i].dstBinding = i; w[i].descriptorCount = 1;
    w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER; w[i].pBufferInfo = &dbi[i];
  }
  vkUpdateDescriptorSets(dev, 3, w, 0, nullptr);
  VkCommandPoolCreateInfo cpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpi.queueFamilyIndex = qf;
  VkCommandPool cp; CK(vkCreateCommandPool(dev, &cpi, nullptr, &cp));
  VkCommandBufferAllocateInfo cbai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cbai.commandPool = cp; cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY; cbai.commandBufferCount = 1;
  VkCommandBuffer cb; CK(vkAllocateCommandBuffers(dev, &cbai, &cb));
  VkQueryPoolCreateInfo qpci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qpci.queryType = VK_QUERY_TYPE_TIMESTAMP; qpci.queryCount = 2;
  VkQueryPool qp; CK(vkCreateQueryPool(dev, &qpci, nullptr, &qp));
  uint32_t pcv[3] = {n, n, n};
  uint32_t groups = (n / bm) * (n / bn);
  auto run = [&](int reps) {
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    CK(vkBeginCommandBuffer(cb, &bi));
    vkCmdResetQueryPool(cb, qp, 0, 2);
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl, 0, 1, &ds, 0, nullptr);
    vkCmdPushConstants(cb, pl, VK_SHADER_STAGE_COMPUTE_BIT, 0, 12, pcv);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
    for (int r = 0; r < reps; ++r) {
      vkCmdDispatch(cb, groups, 1, 1);
      VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
      mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT; mb.dstAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
      vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
    }
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
    CK(vkEndCommandBuffer(cb));
    VkSubmitInfo sub{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    sub.commandBufferCount = 1; sub.pCommandBuffers = &cb;
    CK(vkQueueSubmit(q, 1, &sub, VK_NULL_HANDLE));
    CK(vkQueueWaitIdle(q));
    uint64_t ts[2];
    CK(vkGetQueryPoolResults(dev, qp, 0, 2, sizeof ts, ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    return double(ts[1] - ts[0]) * props.limits.timestampPeriod * 1e-9 / reps;
  };
  run(2);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) best = std::min(best, run(20));
  double flops = 2.0 * n * n * n;
  std::printf("RESULT spv=%s wg=%u tile=%ux%ux%u n=%u %s: %.3f ms, %.1f GFLOP/s\n", spv_path.c_str(), wg, bm, bn, bk, n,
              bf16 ? "bf16" : "f16", best * 1e3, flops / best * 1e-9);
  // Check 256 entries against double math on the rounded inputs.
  int bad = 0;
  double maxerr = 0;
  for (int s = 0; s < 256; ++s) {
    size_t i = (size_t(s) * 2654435761u) % n, j = (size_t(s) * 40503u + 17) % n;
    double ref = 0;
    for (size_t k = 0; k < n; ++k) {
      float a = bf16 ? from_bf16(ap[i * n + k]) : float(reinterpret_cast<_Float16*>(ap)[i * n + k]);
      float b = bf16 ? from_bf16(bp[k * n + j]) : float(reinterpret_cast<_Float16*>(bp)[k * n + j]);
      ref += double(a) * b;
    }
    const uint16_t* cp = static_cast<const uint16_t*>(C.p);
    double got = bf16 ? double(from_bf16(cp[i * n + j])) : double(reinterpret_cast<const _Float16*>(cp)[i * n + j]);
    double err = std::fabs(got - ref) / std::max(1.0, std::fabs(ref));
    maxerr = std::max(maxerr, err);
    // The output's rounding: bf16 keeps 8 bits of mantissa.
    if (err > (bf16 ? 8e-3 : 2e-3)) { if (bad < 5) std::printf("  C[%zu,%zu] = %g, expected %g\n", i, j, got, ref); ++bad; }
  }
  std::printf("CHECK %s: %d of 256 wrong, max rel err %.2e\n", bad ? "FAIL" : "ok", bad, maxerr);
  return bad ? 1 : 0;
}
