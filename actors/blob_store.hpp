#pragma once
/// A content-addressed store of blobs (checkpoint files fetched from peers) in a node's state
/// directory, `<state-dir>/blobs/<BLAKE2b-256 hex>`: written durably (temp file, fsync, rename,
/// fsync the directory), verified against its name on every read (a corrupt blob is dropped),
/// bounded in bytes, least recently used evicted first, never a blob in use (pinned).
/// No CAF, no network: the stage host uses it from its thread; thread-safe all the same.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "actors/blob_digest.hpp"
#include "base/error.hpp"

namespace mesh::blobs {

/// The default bound of a node's blob cache (--blob-cache-bytes): room for a few 7-8B
/// checkpoints at 4-8 bits a weight.
inline constexpr uint64_t default_cache_bytes = uint64_t{32} << 30;

class blob_store : public std::enable_shared_from_this<blob_store> {
 public:
  /// While a pin lives, its blob is not evicted (a loaded stage memory-maps it).
  using pin = std::shared_ptr<void>;
  struct held {
    std::filesystem::path path;
    pin in_use;
  };

  /// Opens (creating, mode 0700) the store in `dir`, bounded at `max_bytes`. Blobs already there
  /// are taken in, their last use from their modification times; leftovers of interrupted writes
  /// (`*.part`, `*.tmp`) and files that are not blobs' names are removed. Errors: io_error naming
  /// the directory.
  static expected<std::shared_ptr<blob_store>> open(const std::filesystem::path& dir, uint64_t max_bytes);

  /// The blob, verified: its content hashes to its name. Counts as a use (LRU). Errors:
  /// not_found (no such blob), decode_error naming both digests when the content does not match
  /// (the blob is removed: fetch it again), io_error.
  expected<held> get(const digest& d);
  bool contains(const digest& d) const;

  /// Stores `bytes` under their digest (room made first). Errors: limit_exceeded when the bound
  /// cannot make room (blobs in use), io_error.
  expected<held> put(std::span<const uint8_t> bytes);

  /// For a blob streamed in pieces: makes room for `size` bytes (evicting) and reserves it, and
  /// returns the path of a fresh staging file to write; then commit() or discard().
  expected<std::filesystem::path> stage(const digest& d, uint64_t size);
  /// The staged file (its content already checked against `d` by the writer) becomes the blob:
  /// fsync, rename, fsync the directory. Errors: io_error, invalid_argument when its size differs.
  expected<void> commit(const digest& d);
  /// Drops a staged file and its reservation.
  void discard(const digest& d);

  /// Partial blobs: of a large file, only the chunks (of chunk_bytes) a node's stages read,
  /// fetched as they need them. The data is a sparse file of the whole size,
  /// `<dir>/<digest>.sparse`, beside `<digest>.chunks`: the digests of all its chunks (checked
  /// by the caller against what the serving node named) and which of them are here. Both
  /// survive restarts; a blob counts the chunks it holds against the bound.
  ///
  /// Makes the partial blob `d` of `size` bytes whose chunks hash to `list`, or finds it (with
  /// the same list: invalid_argument otherwise). Errors: io_error.
  expected<void> open_partial(const digest& d, uint64_t size, std::vector<digest> list);
  /// The chunk list of the partial blob `d`; empty when there is none.
  std::vector<digest> chunk_list_of(const digest& d) const;
  /// The chunks of `wanted` that the partial blob `d` lacks.
  std::vector<uint64_t> missing(const digest& d, const std::vector<uint64_t>& wanted) const;
  /// Makes room for `bytes` more (evicting) and reserves it until unreserve(). Errors as stage().
  expected<void> reserve(uint64_t bytes);
  void unreserve(uint64_t bytes);
  /// Writes chunk `index` of the partial blob `d`: its bytes must hash to the list's digest
  /// (decode_error naming both otherwise). Not durable until sync_partial().
  expected<void> put_chunk(const digest& d, uint64_t index, std::span<const uint8_t> bytes);
  /// Flushes the partial blob's data and writes which chunks it holds, durably.
  expected<void> sync_partial(const digest& d);
  /// The partial blob's file, with the chunks `wanted` present and verified (each hashed again
  /// against its digest: a corrupt one is dropped from the blob and the error, decode_error,
  /// names it). Counts as a use; pinned while the result lives. not_found when a chunk is missing.
  expected<held> get_chunks(const digest& d, const std::vector<uint64_t>& wanted);

  /// A directory checkpoint made of held blobs: `<dir>/views/<digest of the listing>/NAME`, a
  /// symbolic link to each blob under its file name, pinning them all while the result lives.
  /// Views are made again on demand (open() removes them with everything else that is no blob).
  /// Errors: invalid_argument for a name that is not a plain file name, io_error.
  expected<held> view(const std::vector<std::pair<std::string, held>>& files);

  const std::filesystem::path& dir() const { return dir_; }
  uint64_t max_bytes() const { return max_bytes_; }
  /// Bytes of the blobs held (not counting reservations).
  uint64_t bytes() const;
  /// The blobs, least recently used first.
  std::vector<digest> by_last_use() const;

 private:
  struct entry {
    uint64_t size = 0;  ///< bytes held (a partial blob: its chunks here)
    uint64_t last_use = 0;
    int pins = 0;
    bool partial = false;
    uint64_t file_size = 0;     ///< a partial blob: the whole file's
    std::vector<digest> list{};  ///< a partial blob: every chunk's digest
    std::vector<bool> have{};    ///< a partial blob: the chunks here
  };
  blob_store(std::filesystem::path dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  std::filesystem::path path_of(const digest& d) const;
  std::filesystem::path sparse_of(const digest& d) const;  ///< a partial blob's data
  std::filesystem::path record_of(const digest& d) const;  ///< a partial blob's chunk record
  /// Reads a partial blob's record (open()); false when it is not one.
  bool load_partial(const digest& d, entry& e) const;
  expected<void> write_record(const digest& d, const entry& e) const;
  /// Evicts the least recently used unpinned blobs until `need` more bytes fit (mutex_ held).
  expected<void> make_room(uint64_t need);
  pin pin_of(const digest& d);  ///< mutex_ held
  void drop(const digest& d);   ///< mutex_ held

  std::filesystem::path dir_;
  uint64_t max_bytes_ = 0;
  mutable std::mutex mutex_;
  std::map<digest, entry> blobs_;
  std::map<digest, uint64_t> staged_;  ///< reservations of blobs being written
  uint64_t bytes_ = 0, reserved_ = 0, clock_ = 0;
};

}  // namespace mesh::blobs
