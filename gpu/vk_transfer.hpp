#pragma once
/// Bytes between host memory and the Vulkan executor's device buffers: straight through the
/// mapping where device memory is host-visible (lavapipe, integrated GPUs, ReBAR), else through
/// staging memory and copy commands. The host side of every copy is spread over a few threads
/// (host_copy.hpp): a data-parallel step moves hundreds of MB of gradients this way.
#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "gpu/cpu_thread_pool.hpp"
#include "gpu/vk_device.hpp"
#include "gpu/vk_host_import.hpp"
#include "gpu/vk_memory.hpp"

namespace mesh::gpu {

/// A memory barrier in `cmd` from (src, src_access) to (dst, dst_access).
void memory_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                    VkAccessFlags dst_access);
/// After copy commands: their writes visible to the host, to shaders and to later copies.
void after_transfer_barrier(VkCommandBuffer cmd);

/// Records `record`'s commands into `cmd` (reset first, for one submission) and submits it on `q`
/// with `fence` (unsignalled, or VK_NULL_HANDLE); the submission's result.
VkResult record_and_submit(VkQueue q, VkCommandBuffer cmd, VkFence fence, const std::function<void(VkCommandBuffer)>& record);

/// Where each piece of `host` lies in a live import (an empty piece: nowhere), or nullopt when a
/// piece lies outside them.
std::optional<std::vector<vk_host_imports::place>> imported_places(const vk_host_imports& imports, std::span<const std::span<uint8_t>> host);
/// Records into `cmd` the copies between `list` (each a buffer and its byte count, end to end) and
/// the pieces of `host` at `places` (as many bytes in all), to the buffers when `to_device`;
/// returns the bytes they move.
uint64_t record_imported_copies(VkCommandBuffer cmd, const std::vector<std::pair<const memory_pool::allocation*, uint64_t>>& list,
                                std::span<const std::span<uint8_t>> host, const std::vector<vk_host_imports::place>& places,
                                bool to_device);

/// The buffers of the parameters `names` and their byte counts, end to end, as `find(name)` gives
/// them (nullopt: no such parameter), checked to hold `size` bytes together; errors name the
/// parameter missing, or both sizes, after `what`.
template <class Find>
expected<std::vector<std::pair<const memory_pool::allocation*, uint64_t>>> parameter_buffers(const std::vector<std::string>& names, size_t size,
                                                                                            const char* what, Find find) {
  std::vector<std::pair<const memory_pool::allocation*, uint64_t>> list;
  uint64_t total = 0;
  for (const auto& name : names) {
    auto at = find(name);
    if (!at) return make_error(error_code::not_found, std::string(what) + ": no parameter \"" + name + "\" on the device");
    list.push_back(*at);
    total += at->second;
  }
  if (total != size)
    return make_error(error_code::invalid_argument,
                      std::string(what) + ": the parameters hold " + std::to_string(total) + " bytes, the buffer " + std::to_string(size));
  return list;
}

class vk_transfers {
 public:
  using allocation = memory_pool::allocation;
  /// Staging memory from `host_pool`, command buffers from `cmd_pool` (which must outlive this),
  /// submissions on d's queue; host memory in `imports` (when given, outliving this) is copied
  /// to and from by the device itself.
  vk_transfers(vk_device& d, memory_pool& host_pool, VkCommandPool cmd_pool, const vk_host_imports* imports = nullptr);
  ~vk_transfers();
  vk_transfers(const vk_transfers&) = delete;
  vk_transfers& operator=(const vk_transfers&) = delete;

  /// Copies `bytes` into `dst`, through staging chunks of at most upload_chunk.
  expected<void> upload(const allocation& dst, std::span<const uint8_t> bytes);
  /// Copies `src` into `bytes` (its size: the bytes to copy).
  expected<void> download(const allocation& src, std::vector<uint8_t>& bytes);
  /// Moves `buffers` (each a buffer and its byte count, end to end in `host`) to the device from
  /// `host` when `to_device`, else into `host`: through two staging halves of transfer_chunk / 2
  /// bytes in turn, each fill of one a submission with a copy per buffer piece. While the device
  /// copies one half the host copies the other.
  /// `host` may be in pieces (their bytes end to end: a sum whose shares lie in several regions,
  /// host_reduce.hpp), each copied from or into where it is. When every piece lies in imported
  /// host memory, one submission of copy commands between the buffers and the imports does it
  /// all, without staging.
  expected<void> move(const std::vector<std::pair<const allocation*, uint64_t>>& buffers, std::span<const std::span<uint8_t>> host,
                      bool to_device);
  /// A wait timed out or the device was lost: the executor takes the device as lost.
  bool lost() const { return lost_; }
  /// Bytes move() copied between buffers and imported host memory directly, so far.
  uint64_t imported_bytes() const { return imported_bytes_; }

  /// Staging chunk for uploads from a caller's bytes: host memory stays bounded by this.
  static constexpr uint64_t upload_chunk = 16ull << 20;
  /// Staging for move(): two halves of this, in turn.
  static constexpr uint64_t transfer_chunk = 32ull << 20;

 private:
  /// A half in flight: a command buffer and a fence, made once.
  struct flight {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    bool busy = false;  ///< submitted and not yet waited for
  };
  expected<void> make_flights();
  /// Records flight `h`'s commands (with after_transfer_barrier after them) and submits them
  /// without waiting.
  template <class F>
  expected<void> submit(size_t h, F record);
  /// Waits for flight `h` when it is in flight.
  expected<void> wait(size_t h);
  /// move() where every piece of `host` lies in an import: true when done that way.
  expected<bool> move_imported(const std::vector<std::pair<const allocation*, uint64_t>>& buffers, std::span<const std::span<uint8_t>> host,
                               bool to_device);

  vk_device& d_;
  memory_pool& host_pool_;
  VkCommandPool cmd_pool_;
  std::array<flight, 2> flights_;
  thread_pool copy_pool_;  ///< the host side of the copies (host_copy.hpp)
  const vk_host_imports* imports_;
  uint64_t imported_bytes_ = 0;
  bool lost_ = false;
};

}  // namespace mesh::gpu
