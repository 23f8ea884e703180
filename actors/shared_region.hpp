#pragma once
/// Memory that meshnode processes on one host share, so that bulk data between them need not
/// cross the transport (all-reduce pieces: docs/training.md, "Peers on one host"). A node writes
/// into a region of its own, a sealed memfd; a peer that was told where it is (the writer's pid,
/// the fd number, the size and a random nonce, sent over the authenticated connection) maps it
/// and reads from it: through this class with const access only, the mapping itself read-write
/// where the file allows (a device imports only pages it may pin for writing, and a training's
/// device copies the sums out of the members' regions: region_import.hpp). A peer on another
/// host cannot open it (its /proc is another host's), so an open that succeeds also shows that
/// the two share a host.
///
/// The peer names the file, so the reader checks it before mapping anything: the link
/// /proc/<pid>/fd/<fd> names a memfd called "meshnode-region", the file is regular, owned by this
/// user, sealed against shrinking (a writer cannot truncate it under the reader, whose reads
/// would then fault), of the size named, and its header holds the magic and the nonce named.
/// Linux only (memfd_create, file seals).
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace mesh {

/// Where a region is, as its writer tells a peer.
struct region_locator {
  uint32_t pid = 0;
  uint32_t fd = 0;
  uint64_t size = 0;  ///< of the whole file, header included
  std::array<uint8_t, 16> nonce{};
  bool operator==(const region_locator&) const = default;
};

class shared_region {
 public:
  /// Bytes before the data: magic and nonce.
  static constexpr uint64_t header_bytes = 64;
  /// The largest region a reader maps.
  static constexpr uint64_t max_bytes = uint64_t{1} << 40;

  /// A region of `data_bytes` this process writes (its pages are taken as they are written).
  static expected<shared_region> create(uint64_t data_bytes);
  /// Maps a peer's region for reading (const access only; see above), after the checks above.
  /// Errors: not_found (no such file here: the peer is on another host, or gone),
  /// invalid_argument (a file that is not such a region, or not the one named), io_error.
  static expected<shared_region> open(const region_locator& where);

  shared_region(shared_region&& o) noexcept;
  shared_region& operator=(shared_region&& o) noexcept;
  shared_region(const shared_region&) = delete;
  shared_region& operator=(const shared_region&) = delete;
  ~shared_region();

  const region_locator& locator() const { return where_; }
  /// The data (after the header); writable only in the region's writer.
  uint8_t* data() { return writable_ ? map_ + header_bytes : nullptr; }
  const uint8_t* data() const { return map_ + header_bytes; }
  uint64_t data_bytes() const { return where_.size - header_bytes; }

  /// Keeps `value` under `key` until the region is unmapped, and lets it go before the unmap:
  /// a device's import of the region's pages (gpu::executor::import_host_memory, key: the
  /// executor), which must not outlive the mapping. An empty value records a refused import.
  /// One thread at a time (the node's executor tasks, while they hold the region).
  void attach(const void* key, std::shared_ptr<void> value) { attached_.emplace_back(key, std::move(value)); }
  /// What was attached under `key`, or null when nothing was.
  const std::shared_ptr<void>* attached(const void* key) const {
    for (const auto& [k, v] : attached_)
      if (k == key) return &v;
    return nullptr;
  }

 private:
  shared_region() = default;
  void release();

  int fd_ = -1;  ///< the writer keeps its memfd open: readers open it through /proc
  uint8_t* map_ = nullptr;
  bool writable_ = false;
  region_locator where_;
  std::vector<std::pair<const void*, std::shared_ptr<void>>> attached_;
};

}  // namespace mesh
