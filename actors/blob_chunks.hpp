#pragma once
/// The pure parts of fetching a checkpoint file from a peer in chunks (docs/serving.md, "Split
/// over the mesh"): which chunks to ask for, what a blob_get or blob_chunk may hold, and the
/// assembly that checks each chunk (its offset, size and digest) and the whole (against the
/// digest the serving node announced). No files, no network: the fuzzer runs the checks.
#include <cstdint>
#include <span>
#include <vector>

#include "actors/blob_digest.hpp"
#include "base/error.hpp"
#include "wire/messages.hpp"

namespace mesh::blobs {

/// Bytes per chunk: big enough that a message's overhead is nothing, small enough that one
/// chunk in flight is a short time on the link (the bulk stream scheduler interleaves others).
inline constexpr uint32_t chunk_bytes = 1u << 20;
/// The most a blob_get may ask for (a peer's bound, also the fuzzer's).
inline constexpr uint32_t max_chunk_bytes = 4u << 20;

using byte_range = msg::byte_range;

/// [0, size) cut into consecutive chunks of `chunk` bytes (the last may be shorter).
std::vector<byte_range> plan_chunks(uint64_t size, uint32_t chunk = chunk_bytes);

/// A blob_get a serving node may answer: a non-zero digest, 1 to max_chunk_bytes bytes, within
/// a file of `size` bytes. invalid_argument naming what is wrong.
expected<void> check_get(const msg::blob_get& g, uint64_t size);
/// A blob_chunk's shape before its bytes are used: ok with 1 to max_chunk_bytes bytes. (Whether
/// they are the ones asked for is the assembly's business.)
expected<void> check_chunk(const msg::blob_chunk& c);

/// Takes a blob's chunks in order and checks them; the caller writes what it accepts.
class assembly {
 public:
  assembly(const digest& whole, uint64_t size) : whole_(whole), size_(size) {}
  /// Checks a chunk: it starts where the last ended, is not past the end, and its bytes hash to
  /// its digest. Errors (decode_error) name the offset and the blob.
  expected<void> accept(uint64_t offset, std::span<const uint8_t> bytes, const digest& chunk_digest);
  bool complete() const { return received_ == size_; }
  uint64_t received() const { return received_; }
  /// Once complete: the whole content's digest against the announced one (decode_error naming
  /// both when they differ).
  expected<void> finish();

 private:
  digest whole_;
  uint64_t size_ = 0, received_ = 0;
  hasher hasher_;
};

}  // namespace mesh::blobs
