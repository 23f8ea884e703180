#pragma once
/// Copies the device makes beside its kernels (executor::read_parameters_async and
/// write_parameters_from_async): each is one submission on the device's copy queue
/// (vk_device::copy_queue: NVIDIA's copy engines) that its caller does not wait for. While a
/// data-parallel step's backward pass goes on, the gradients of the layers it finished leave the
/// device this way, and their sums come back, instead of taking the compute queue's time.
///
/// The lane keeps each copy in flight with the parameters it touches, so that the executor's
/// later work waits for the copies it would race with, and for no others (settle): work that
/// writes a parameter waits for the copies reading or writing it; work that reads one waits for
/// the copies writing it. The caller's host bytes are its own business: it waits (pending_copy)
/// before touching them.
///
/// Threads: everything but pending_copy::wait() runs on the executor's thread. wait() may run on
/// any thread (the node's executor actor hands it to a thread of its own); a fence is only reset
/// or destroyed when no thread waits on it.
#include <vulkan/vulkan.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "gpu/executor.hpp"
#include "gpu/vk_device.hpp"

namespace mesh::gpu {

class vk_copy_lane {
 public:
  explicit vk_copy_lane(vk_device& d);
  /// Waits for every copy in flight and for every thread in wait().
  ~vk_copy_lane();
  vk_copy_lane(const vk_copy_lane&) = delete;
  vk_copy_lane& operator=(const vk_copy_lane&) = delete;

  /// Records the copies `record` makes into a command buffer and submits it on the copy queue.
  /// `params`: the parameters it touches, written when `writes_device`, else read; `keep`: what
  /// must live until it is done (the imports it copies to or from).
  expected<pending_copy> submit(const std::function<void(VkCommandBuffer)>& record, std::vector<std::string> params,
                                bool writes_device, std::vector<std::shared_ptr<void>> keep);
  /// Waits for the copies in flight that work reading `reads` and writing `writes` would race
  /// with; the error of one that failed is returned (a `device` error: lost; `timeout`: no end
  /// in 120 s, which the executor takes as lost too).
  expected<void> settle(const std::set<std::string>& reads, const std::set<std::string>& writes);
  /// Waits for every copy in flight.
  expected<void> settle_all();

  uint64_t copies() const { return copies_; }
  /// How many copies in flight settle() ordered later work after: it waited for each (at once
  /// when the copy was done already).
  uint64_t waits() const { return waits_; }

 private:
  /// Shared by a flight and the pending_copy handed out for it.
  struct fence_state {
    std::mutex m;
    std::condition_variable cv;
    VkDevice device = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    bool done = false;   ///< the fence signalled (or failed): nobody touches it again
    int waiting = 0;     ///< threads inside vkWaitForFences on it
    VkResult result = VK_SUCCESS;
  };
  struct flight {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    bool busy = false;  ///< submitted and not yet recycled
    std::shared_ptr<fence_state> st;
    std::vector<std::string> params;
    bool writes_device = false;
    std::vector<std::shared_ptr<void>> keep;
  };
  /// Blocks until `st`'s fence signals (once per state: later calls return its result).
  static expected<void> wait_for(const std::shared_ptr<fence_state>& st);
  /// A flight whose copy is done: its fence reset, its command buffer free for the next copy.
  void recycle(flight& f);
  /// Waits for `f`'s copy (noting a failure in failed_) and recycles it; how the copy ended.
  expected<void> finish(flight& f);
  /// Recycles the flights whose copies are done (no thread waiting on them).
  void reap();

  vk_device& d_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  std::vector<flight> flights_;
  uint64_t copies_ = 0, waits_ = 0;
  std::optional<error> failed_;  ///< the first copy that failed: submit() refuses from then on
};

}  // namespace mesh::gpu
