#include "gpu/host_copy.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "gpu/cpu_thread_pool.hpp"

namespace mesh::gpu {

void parallel_copy(void* dst, const void* src, size_t bytes, thread_pool* pool) {
  if (bytes == 0) return;
  const size_t threads = pool ? pool->size() : 1;
  const size_t parts = std::min(threads, bytes / copy_part_bytes);
  if (parts <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Part boundaries 4 KiB apart from the start: on page-aligned buffers (staging memory, large
  // allocations) no two threads write one page.
  const size_t per = (bytes / parts + 4095) & ~size_t{4095};
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  pool->run(static_cast<int64_t>(parts), [&](int64_t p) {
    const size_t from = static_cast<size_t>(p) * per;
    if (from >= bytes) return;
    std::memcpy(d + from, s + from, std::min(per, bytes - from));
  });
}

unsigned copy_threads() {
  if (const char* v = std::getenv("MESH_COPY_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= 1 && n <= 64) return static_cast<unsigned>(n);
  }
  return std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u);
}

}  // namespace mesh::gpu
