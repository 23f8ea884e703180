#pragma once
/// How much memory a node's device has free now, asked again each time: the models this node
/// loads and other processes on the same device change it. Split plans share layers by it
/// (docs/serving.md, "Split over the mesh"), and heartbeats carry it to the peers.
///
/// Where the figure comes from:
/// - a GPU offering VK_EXT_memory_budget: the driver's budget for this process less what the
///   process uses, summed over device-local heaps (NVIDIA offers it);
/// - a CPU device (the CPU back end, or a Vulkan device of CPU type such as lavapipe, whose
///   memory is the host's): the kernel's MemAvailable from /proc/meminfo;
/// - any other GPU: its device-local heaps' size (what it has, not what is free).
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "gpu/executor.hpp"

namespace mesh::gpu {

/// Where a probe's figure comes from (see above).
enum class memory_source { driver_budget, host_available, device_size };

const char* to_string(memory_source s);

/// MemAvailable of a /proc/meminfo text, in bytes; nullopt when the line is missing or malformed.
std::optional<uint64_t> parse_mem_available(std::string_view meminfo);

/// Thread-safe; independent of any executor (it holds its own Vulkan instance when it needs one),
/// so any thread may ask it while executors run.
class memory_probe {
 public:
  virtual ~memory_probe() = default;
  /// Free bytes now (never more than the device's size).
  virtual uint64_t free_bytes() const = 0;
  virtual memory_source source() const = 0;
};

/// A probe for the device `info` describes (a Vulkan device is found again by its UUID).
std::unique_ptr<memory_probe> make_memory_probe(const device_info& info);

}  // namespace mesh::gpu
