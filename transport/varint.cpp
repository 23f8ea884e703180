#include "transport/varint.hpp"

#include <cassert>

namespace mesh::transport {

size_t varint_size(uint64_t v) {
  if (v < (1u << 6)) return 1;
  if (v < (1u << 14)) return 2;
  if (v < (1u << 30)) return 4;
  return 8;
}

size_t varint_encode(uint64_t v, uint8_t* out) {
  assert(v <= varint_max);
  size_t n = varint_size(v);
  static constexpr uint8_t prefix[] = {0, 0x40, 0, 0x80, 0, 0, 0, 0xc0};
  for (size_t i = 0; i < n; ++i) out[n - 1 - i] = static_cast<uint8_t>(v >> (8 * i));
  out[0] |= prefix[n - 1];
  return n;
}

std::optional<uint64_t> varint_decode(std::span<const uint8_t> in, size_t* used) {
  if (in.empty()) return std::nullopt;
  size_t n = varint_length_from_first(in[0]);
  if (in.size() < n) return std::nullopt;
  uint64_t v = in[0] & 0x3f;
  for (size_t i = 1; i < n; ++i) v = (v << 8) | in[i];
  if (used) *used = n;
  return v;
}

}  // namespace mesh::transport
