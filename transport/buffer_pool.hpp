#pragma once
/// Large message buffers handed back by the application once read, reused for the next large
/// incoming message of about the same size.
///
/// Why: a fresh multi-MiB buffer is fresh memory (glibc maps anything above 32 MiB anew each
/// time), and the kernel zeroes every page of it on the first write. For 64 MiB messages on
/// loopback that zeroing was a third of the receiving I/O thread's time. A buffer that comes
/// back is written over instead: no fault, no zeroing.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace mesh::transport {

class buffer_pool {
 public:
  /// Keeps at most `max_buffers` buffers of together at most `max_bytes` capacity; buffers
  /// smaller than `min_capacity` are not worth keeping (malloc reuses small blocks itself).
  buffer_pool(size_t max_buffers = 8, uint64_t max_bytes = uint64_t{256} << 20, size_t min_capacity = size_t{1} << 20)
      : max_buffers_(max_buffers), max_bytes_(max_bytes), min_capacity_(min_capacity) {}

  /// Keeps `b` (its contents are dropped) if it is large enough and there is room; when full,
  /// the smallest kept buffer makes way for a larger one. Thread-safe.
  void give(std::vector<uint8_t> b);

  /// An empty buffer with capacity for `n` bytes, at most twice that (a buffer much larger than
  /// asked for would pin memory the message does not need); empty with no capacity when none
  /// fits. Thread-safe.
  std::vector<uint8_t> take(size_t n);

  /// Frees the buffers given back before `cutoff` (steady_clock): memory the pool holds after a
  /// burst of large messages is returned once the burst is over. Thread-safe.
  void release_older_than(std::chrono::steady_clock::time_point cutoff);

  size_t buffers() const;
  uint64_t bytes() const;

 private:
  const size_t max_buffers_;
  const uint64_t max_bytes_;
  const size_t min_capacity_;
  mutable std::mutex mu_;
  struct kept {
    std::vector<uint8_t> buffer;
    std::chrono::steady_clock::time_point given;
  };
  std::vector<kept> kept_;
  uint64_t kept_bytes_ = 0;
};

}  // namespace mesh::transport
