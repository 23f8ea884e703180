#pragma once
/// QUIC variable-length integers (RFC 9000 section 16): 1, 2, 4 or 8 bytes, up to 2^62-1.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace mesh::transport {

inline constexpr uint64_t varint_max = (uint64_t{1} << 62) - 1;

/// Bytes needed to encode `v` (v <= varint_max).
size_t varint_size(uint64_t v);
/// Writes `v` to `out` (which must hold varint_size(v) bytes); returns the bytes written.
size_t varint_encode(uint64_t v, uint8_t* out);
/// Length announced by the first byte of an encoding.
inline size_t varint_length_from_first(uint8_t first) { return size_t{1} << (first >> 6); }
/// Decodes a complete encoding; nullopt when `in` is shorter than the announced length.
std::optional<uint64_t> varint_decode(std::span<const uint8_t> in, size_t* used);

}  // namespace mesh::transport
