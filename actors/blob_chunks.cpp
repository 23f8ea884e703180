#include "actors/blob_chunks.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace mesh::blobs {

std::vector<byte_range> plan_chunks(uint64_t size, uint32_t chunk) {
  std::vector<byte_range> out;
  if (chunk == 0) return out;
  for (uint64_t at = 0; at < size; at += chunk) out.push_back({at, std::min<uint64_t>(chunk, size - at)});
  return out;
}

expected<void> check_get(const msg::blob_get& g, uint64_t size) {
  const auto bad = [&](std::string what) { return make_error(error_code::invalid_argument, "blob_get of blob " + to_hex(g.blob) + ": " + what); };
  if (is_zero(g.blob)) return bad("no blob named");
  if (g.length == 0 || g.length > max_chunk_bytes) return bad(fmt::format("{} bytes asked for (1 to {})", g.length, max_chunk_bytes));
  if (g.offset >= size || g.length > size - g.offset)
    return bad(fmt::format("bytes [{}, {}) are past the end of its {} bytes", g.offset, g.offset + g.length, size));
  return {};
}

expected<void> check_chunk(const msg::blob_chunk& c) {
  if (!c.ok) return {};
  if (c.bytes.empty() || c.bytes.size() > max_chunk_bytes)
    return make_error(error_code::decode_error, fmt::format("blob_chunk at offset {}: {} bytes (1 to {})", c.offset, c.bytes.size(), max_chunk_bytes));
  return {};
}

expected<void> assembly::accept(uint64_t offset, std::span<const uint8_t> bytes, const digest& chunk_digest) {
  const auto bad = [&](std::string what) {
    return make_error(error_code::decode_error, fmt::format("blob {}: the chunk at offset {}: {}", to_hex(whole_), offset, what));
  };
  if (offset != received_) return bad(fmt::format("the next chunk was to start at {}", received_));
  if (bytes.empty() || bytes.size() > size_ - received_) return bad(fmt::format("{} bytes, with {} left of the blob", bytes.size(), size_ - received_));
  if (const auto got = hash_bytes(bytes); got != chunk_digest)
    return bad(fmt::format("its bytes hash to {}, not the {} it came with", to_hex(got), to_hex(chunk_digest)));
  hasher_.update(bytes);
  received_ += bytes.size();
  return {};
}

expected<void> assembly::finish() {
  if (!complete())
    return make_error(error_code::decode_error, fmt::format("blob {}: {} of {} bytes arrived", to_hex(whole_), received_, size_));
  if (const auto got = hasher_.finish(); got != whole_)
    return make_error(error_code::decode_error,
                      fmt::format("the fetched file hashes to {}, not the {} the serving node announced", to_hex(got), to_hex(whole_)));
  return {};
}

}  // namespace mesh::blobs
