#pragma once
/// A node's identity on the wire: its Ed25519 public key.
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace mesh::transport {

/// The 32-byte Ed25519 public key of a node; equality is key equality.
struct node_id {
  std::array<uint8_t, 32> key{};

  /// 64 lowercase hex digits.
  std::string to_string() const;
  /// The first 8 hex digits, for logs and humans.
  std::string short_string() const;
  /// Parses the 64-hex-digit form (either case).
  static expected<node_id> parse(std::string_view text);

  friend bool operator==(const node_id&, const node_id&) = default;
  friend auto operator<=>(const node_id&, const node_id&) = default;
};

}  // namespace mesh::transport

template <>
struct std::hash<mesh::transport::node_id> {
  size_t operator()(const mesh::transport::node_id& id) const noexcept {
    // The key is uniformly random already: its first bytes are a fine hash.
    size_t h = 0;
    for (size_t i = 0; i < sizeof(h); ++i) h = (h << 8) | id.key[i];
    return h;
  }
};
