#pragma once
/// Content digests of blobs (checkpoint files fetched between nodes): BLAKE2b-256 (libsodium's
/// crypto_generichash), one-shot, streaming and of a whole file. Pure apart from hash_file.
#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace mesh::blobs {

/// A BLAKE2b-256 digest; the blob's name in a store and on the wire.
using digest = std::array<uint8_t, 32>;

/// Lower-case hex, 64 characters.
std::string to_hex(const digest& d);
/// The digest of 64 hex characters, or an invalid_argument error quoting the text.
expected<digest> parse_digest(std::string_view hex);
/// All zero: "no blob" on the wire (stage_open::blob).
bool is_zero(const digest& d);

/// The digest of `bytes`.
digest hash_bytes(std::span<const uint8_t> bytes);

/// A digest computed over bytes handed in piece by piece, in order.
class hasher {
 public:
  hasher();
  void update(std::span<const uint8_t> bytes);
  /// The digest of everything updated; the hasher starts over.
  digest finish();

 private:
  alignas(64) unsigned char state_[384];  ///< crypto_generichash_state (checked in the .cpp)
};

/// The digest of a file's content, read in pieces (never all in memory); io_error naming the file.
expected<digest> hash_file(const std::filesystem::path& path);

/// A file's digest and the digests of its consecutive chunks of `chunk` bytes (the last one may
/// be shorter), from one read of the file.
struct file_digests {
  digest whole{};
  std::vector<digest> chunks;
};
expected<file_digests> hash_file_chunks(const std::filesystem::path& path, uint32_t chunk);

/// The digest of a chunk list: of its chunks' digests, concatenated (what stage_open names it by).
digest hash_chunk_list(std::span<const digest> chunks);

}  // namespace mesh::blobs
