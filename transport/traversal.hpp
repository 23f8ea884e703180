#pragma once
/// Payloads of the NAT traversal frames (observed address, introduce, punch, relay) and the
/// end-to-end sealing of relayed messages. Pure: no I/O.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "transport/address.hpp"
#include "transport/identity.hpp"
#include "base/node_id.hpp"

namespace mesh::transport {

/// `family:u8 (4|6) | ip (4|16 bytes) | port:u16 big-endian`.
std::vector<uint8_t> encode_address(const socket_address& a);
expected<socket_address> decode_address(std::span<const uint8_t> bytes);

/// `node id (32) | address` (punch) or just the node id (introduce).
struct peer_address {
  node_id id;
  socket_address address;
};
std::vector<uint8_t> encode_peer_address(const peer_address& p);
expected<peer_address> decode_peer_address(std::span<const uint8_t> bytes);
expected<node_id> decode_node_id(std::span<const uint8_t> bytes);

/// `node id (32) | sealed box`: relay_send names the destination, relay_deliver the source.
struct relay_envelope {
  node_id peer;
  std::vector<uint8_t> box;
};
std::vector<uint8_t> encode_relay(const relay_envelope& e);
expected<relay_envelope> decode_relay(std::span<const uint8_t> bytes);

/// What a sealed box carries: `kind:u8 | channel:u8 | session (16) | seq:u64 LE | payload`.
/// The session and sequence number (relay_sessions.hpp) make a recorded box useless to replay.
enum class relay_kind : uint8_t { hello = 1, hello_ack = 2, message = 3 };
using relay_nonce = std::array<uint8_t, 16>;
struct relay_plain {
  relay_kind kind = relay_kind::message;
  uint8_t channel = 0;
  relay_nonce session{};  ///< hello: the opener's nonce; hello_ack: echoes it; message: the session id
  uint64_t seq = 0;       ///< message: 1, 2, ... per direction of a session
  std::vector<uint8_t> payload;
};

/// crypto_box (X25519 + XSalsa20-Poly1305) from `from` to `to`, keys derived from the Ed25519
/// node keys: `nonce (24) | ciphertext`. Only `to` can open it, and opening proves `from` made it;
/// the relay in between reads nothing.
std::vector<uint8_t> seal_for(const identity& from, const node_id& to, const relay_plain& plain);
expected<relay_plain> open_from(const identity& to, const node_id& from, std::span<const uint8_t> box);

}  // namespace mesh::transport
