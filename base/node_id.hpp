#pragma once
/// A node's identity: its Ed25519 public key. Every layer names peers with it; logs and tables
/// show short_string().
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace mesh {

/// The 32-byte Ed25519 public key of a node; equality is key equality.
struct node_id {
  std::array<uint8_t, 32> key{};

  /// The all-zero id stands for "no node" (a stage nobody runs, a field not set). No node has
  /// it: keys come from libsodium's Ed25519 key generation, and the transport refuses a peer whose
  /// key is not a valid point (the all-zero key is of small order) during the TLS handshake.
  bool empty() const { return *this == node_id{}; }

  /// 64 lowercase hex digits.
  std::string to_string() const;
  /// The first 8 hex digits, for logs and humans.
  std::string short_string() const;
  /// Parses the 64-hex-digit form (either case).
  static expected<node_id> parse(std::string_view text);

  friend bool operator==(const node_id&, const node_id&) = default;
  friend auto operator<=>(const node_id&, const node_id&) = default;
};

}  // namespace mesh

template <>
struct std::hash<mesh::node_id> {
  size_t operator()(const mesh::node_id& id) const noexcept {
    // The key is uniformly random already: its first bytes are a fine hash.
    size_t h = 0;
    for (size_t i = 0; i < sizeof(h); ++i) h = (h << 8) | id.key[i];
    return h;
  }
};
