#pragma once
/// Large copies between host buffers, spread over a thread pool. One core's memcpy between
/// buffers larger than its caches moves about 5 GB/s on the GPU hosts here, less than a PCIe 5
/// DMA: a data-parallel step's gradients (hundreds of MB through staging memory, twice a step)
/// were bound by it. Several cores together copy several times faster.
#include <cstddef>

namespace mesh::gpu {

class thread_pool;

/// memcpy(dst, src, bytes), in parts of at least copy_part_bytes spread over `pool`'s threads
/// (the caller's among them). A plain memcpy with no pool, one thread, or fewer bytes.
void parallel_copy(void* dst, const void* src, size_t bytes, thread_pool* pool);

/// The smallest part a thread copies: below it, waking a thread costs more than it saves.
inline constexpr size_t copy_part_bytes = size_t{1} << 20;

/// Threads for host copies, the caller's counted: MESH_COPY_THREADS when it holds 1 to 64, else
/// a quarter of the host's cores, 1 to 4 (a host with a node per GPU runs several of them).
unsigned copy_threads();

}  // namespace mesh::gpu
