#pragma once
/// GLSL -> SPIR-V through shaderc, behind a two-level cache (memory, then disk).
///
/// The key is a hash of the kernel source and of the device (name + driver version), so a cache
/// directory can be shared by devices and survives driver updates safely. The 64-bit key only
/// finds an entry: beside the SPIR-V each entry keeps a 256-bit BLAKE2b digest of what it was
/// compiled from (device key, optimize flag, source), and a hit counts only when it matches, so
/// a colliding or planted entry is recompiled, never run. Entries on disk (digest, then SPIR-V)
/// are written atomically (temp file + rename) and checked (digest, SPIR-V magic) when read back.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/error.hpp"

namespace mesh::gpu {

/// 64-bit FNV-1a.
uint64_t fnv1a(std::string_view s, uint64_t h = 14695981039346656037ull);

/// Directory for kernel and pipeline caches: $MESH_KERNEL_CACHE, else
/// $XDG_CACHE_HOME/meshnode/kernels, else $HOME/.cache/meshnode/kernels ("" if none can be found).
std::string default_cache_dir();

/// Counters of one shader_cache.
struct compile_counters {
  uint64_t compiles = 0;     ///< shaderc invocations (excluding the warm-up)
  uint64_t memory_hits = 0;
  uint64_t disk_hits = 0;
  double compile_ms = 0;     ///< time spent in shaderc
};

/// BLAKE2b-256 of what a cache entry was compiled from.
using shader_digest = std::array<uint8_t, 32>;

class shader_cache {
 public:
  /// `dir` empty: memory only. `device_key` separates devices sharing a directory.
  /// `optimize` false skips spirv-opt: for tests that only check that kernels compile (the
  /// optimiser is most of shaderc's time on large tiled kernels). Executors always optimise.
  shader_cache(std::string dir, std::string device_key, bool optimize = true);
  ~shader_cache();
  shader_cache(const shader_cache&) = delete;
  shader_cache& operator=(const shader_cache&) = delete;

  /// Initialises shaderc on a background thread, so the first real compile does not pay for it.
  void warm_up();

  /// SPIR-V words for `glsl` (compiled, or from the cache).
  expected<std::vector<uint32_t>> get(const std::string& name, const std::string& glsl);

  compile_counters counters() const;
  const std::string& dir() const { return dir_; }

 private:
  expected<std::vector<uint32_t>> compile_locked(const std::string& name, const std::string& glsl);
  shader_digest digest(const std::string& glsl) const;

  struct entry {
    shader_digest digest{};
    std::vector<uint32_t> words;
  };

  std::string dir_, device_key_;
  bool optimize_ = true;
  mutable std::mutex mutex_;
  std::map<uint64_t, entry> memory_;
  compile_counters counters_;
  void* compiler_ = nullptr;  // shaderc_compiler_t, kept out of this header
  std::thread warm_;
};

}  // namespace mesh::gpu
