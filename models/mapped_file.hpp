#pragma once
/// A file mapped read-only into memory: the bytes of a checkpoint as they lie on disk, shared with
/// the page cache, so weights are never copied into the process's own memory.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "base/error.hpp"

namespace mesh::models {

/// How the caller will read a mapping; passed to madvise as a hint, never required.
enum class access_hint {
  normal,      ///< the kernel's default read-ahead
  sequential,  ///< read once front to back (a copy to the device): aggressive read-ahead
  random,      ///< scattered reads (headers, a few rows): no read-ahead
  will_need,   ///< start reading it in now
  /// The bytes were copied to where they are used (a device): drop their pages from this
  /// process's resident memory. Reading them again later reads the file again.
  dont_need,
};

/// madvise for `range`, which must lie inside a live mapping (any mapped_file's bytes()); widened
/// down to its first page. A hint: failures are ignored.
void advise_range(std::span<const uint8_t> range, access_hint hint);

/// A read-only, private mapping of a whole file. Move-only; unmapped when destroyed. The mapping's
/// address does not change when the object moves, so spans into bytes() stay valid while any
/// object owning the mapping lives.
class mapped_file {
 public:
  /// Maps `path`. Errors (io_error) name the path and the system's reason. An empty file maps to
  /// an empty span (mmap cannot map zero bytes).
  static expected<mapped_file> open(const std::filesystem::path& path);

  mapped_file() = default;
  mapped_file(mapped_file&& other) noexcept;
  mapped_file& operator=(mapped_file&& other) noexcept;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

  /// Tells the kernel how `range` (a part of bytes(); all of it when empty) will be read. A hint:
  /// failures are ignored.
  void advise(access_hint hint, std::span<const uint8_t> range = {}) const;

 private:
  void release();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

}  // namespace mesh::models
