#include "gpu/vk_copy_lane.hpp"

#include <algorithm>
#include <utility>

#include "gpu/vk_transfer.hpp"

namespace mesh::gpu {
namespace {

constexpr uint64_t wait_limit_ns = 120ull * 1000 * 1000 * 1000;

/// After the copies: their writes made available to the host and to the other queue's work
/// (which the fence's wait orders after them). A transfer-only queue takes only transfer and
/// host stages.
void after_lane_copies(VkCommandBuffer cmd) {
  memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_HOST_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
}

/// Whether a copy touching `params` (writing them when `writes_device`) races with work reading
/// `reads` and writing `writes`.
bool conflicts(const std::vector<std::string>& params, bool writes_device, const std::set<std::string>& reads,
               const std::set<std::string>& writes) {
  return std::any_of(params.begin(), params.end(),
                     [&](const std::string& p) { return writes.count(p) || (writes_device && reads.count(p)); });
}

}  // namespace

vk_copy_lane::vk_copy_lane(vk_device& d) : d_(d) {}

vk_copy_lane::~vk_copy_lane() {
  (void)settle_all();
  for (auto& f : flights_) {
    if (f.busy) recycle(f);  // settle_all waited: done, or failed for good
    if (f.fence) vkDestroyFence(d_.device, f.fence, nullptr);
  }
  if (pool_) vkDestroyCommandPool(d_.device, pool_, nullptr);
}

expected<void> vk_copy_lane::wait_for(const std::shared_ptr<fence_state>& st) {
  std::unique_lock lock(st->m);
  if (!st->done) {
    ++st->waiting;
    lock.unlock();
    // Several threads may wait on one fence at once; none resets it while they do.
    const VkResult r = vkWaitForFences(st->device, 1, &st->fence, VK_TRUE, wait_limit_ns);
    lock.lock();
    --st->waiting;
    if (!st->done) {
      st->done = true;
      st->result = r;
    }
    st->cv.notify_all();
  }
  if (st->result == VK_SUCCESS) return {};
  if (st->result == VK_TIMEOUT) return make_error(error_code::timeout, "a copy beside the kernels did not finish in 120 s: the device is considered lost");
  return tl::unexpected(vk_error(st->result, "a copy beside the kernels (vkWaitForFences)"));
}

void vk_copy_lane::recycle(flight& f) {
  {
    // Nobody may be inside vkWaitForFences on the fence when it is reset.
    std::unique_lock lock(f.st->m);
    f.st->cv.wait(lock, [&] { return f.st->waiting == 0; });
    f.st->done = true;
  }
  if (f.st->result == VK_SUCCESS) vkResetFences(d_.device, 1, &f.fence);
  f.busy = false;
  f.st.reset();
  f.params.clear();
  f.keep.clear();  // may free an import no one else holds
}

void vk_copy_lane::reap() {
  for (auto& f : flights_) {
    if (!f.busy) continue;
    bool done = false;
    {
      std::lock_guard lock(f.st->m);
      done = f.st->done && f.st->waiting == 0;
    }
    if (!done && vkGetFenceStatus(d_.device, f.fence) != VK_SUCCESS) continue;
    (void)finish(f);  // done, or signalled: its wait returns at once
  }
}

expected<void> vk_copy_lane::finish(flight& f) {
  auto ended = wait_for(f.st);
  if (!ended && !failed_) failed_ = ended.error();
  recycle(f);
  return ended;
}

expected<pending_copy> vk_copy_lane::submit(const std::function<void(VkCommandBuffer)>& record, std::vector<std::string> params,
                                            bool writes_device, std::vector<std::shared_ptr<void>> keep) {
  if (!pool_) {
    auto cpi = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    cpi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    cpi.queueFamilyIndex = d_.copy_family;
    if (VkResult r = vkCreateCommandPool(d_.device, &cpi, nullptr, &pool_); r != VK_SUCCESS) {
      pool_ = VK_NULL_HANDLE;
      return tl::unexpected(vk_error(r, "vkCreateCommandPool (copy queue)"));
    }
  }
  reap();
  // After a copy that failed (the device lost, or a fence without an end) nothing more goes in:
  // its fence may still signal, so its flight cannot be used again.
  if (failed_) return tl::unexpected(*failed_);
  auto free = std::find_if(flights_.begin(), flights_.end(), [](const flight& f) { return !f.busy; });
  if (free == flights_.end()) {
    flight f;
    auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (VkResult r = vkAllocateCommandBuffers(d_.device, &ai, &f.cmd); r != VK_SUCCESS) return tl::unexpected(vk_error(r, "vkAllocateCommandBuffers"));
    auto fci = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    if (VkResult r = vkCreateFence(d_.device, &fci, nullptr, &f.fence); r != VK_SUCCESS) {
      vkFreeCommandBuffers(d_.device, pool_, 1, &f.cmd);
      return tl::unexpected(vk_error(r, "vkCreateFence"));
    }
    flights_.push_back(std::move(f));
    free = flights_.end() - 1;
  }
  flight& f = *free;
  if (VkResult r = record_and_submit(d_.copy_queue, f.cmd, f.fence,
                                     [&](VkCommandBuffer cmd) {
                                       record(cmd);
                                       after_lane_copies(cmd);
                                     });
      r != VK_SUCCESS)
    return tl::unexpected(vk_error(r, "vkQueueSubmit (copy queue)"));
  f.busy = true;
  f.st = std::make_shared<fence_state>();
  f.st->device = d_.device;
  f.st->fence = f.fence;
  f.params = std::move(params);
  f.writes_device = writes_device;
  f.keep = std::move(keep);
  ++copies_;
  return pending_copy{[st = f.st] { return wait_for(st); }};
}

expected<void> vk_copy_lane::settle(const std::set<std::string>& reads, const std::set<std::string>& writes) {
  expected<void> ok;
  for (auto& f : flights_) {
    if (!f.busy || !conflicts(f.params, f.writes_device, reads, writes)) continue;
    ++waits_;
    if (auto done = finish(f); !done && ok) ok = done;
  }
  return ok;
}

expected<void> vk_copy_lane::settle_all() {
  expected<void> ok;
  for (auto& f : flights_) {
    if (!f.busy) continue;
    if (auto done = finish(f); !done && ok) ok = done;
  }
  return ok;
}

}  // namespace mesh::gpu
