#pragma once
/// Peer exchange (PEX): a node tells a newly connected peer of its mesh which other members it
/// knows, so that meshes spanning networks where multicast does not pass converge from one static
/// peer. This is the codec and the merge; sending it is the actors' job. Both ends have passed
/// mesh admission, so entries carry no mesh id: they are members of the receiver's own mesh.
///
/// Wire form (big endian): "MPX" u8(format=1) u16(count <= 256), then per entry:
/// node id (32 raw bytes), u16 port (> 0), u8 address count (1..8) and per address u8 family
/// (4 or 6) + 4 or 16 bytes, u8 summary length (<= 128) + printable ASCII. Nothing may follow.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "discovery/peer_table.hpp"
#include "discovery/types.hpp"
#include "base/error.hpp"

namespace mesh::discovery {

inline constexpr std::size_t max_pex_entries = 256;
inline constexpr std::size_t max_pex_addresses = 8;

/// Encodes up to max_pex_entries members. Entries without a valid node id or without a usable
/// address (unspecified, multicast, IPv6 link-local: meaningless on another host) are left out.
std::vector<uint8_t> encode_pex(const std::vector<peer_info>& members);

/// Decodes and validates a PEX message from a peer. Entries come back with source "exchange"
/// and no mesh id or protocol version (merge_pex fills them in).
expected<std::vector<peer_info>> decode_pex(std::span<const uint8_t> bytes);

/// Merges what `sender` told us into `table`: ourselves and the sender's own entry (the sender is
/// connected, and knows its addresses less well than we do) are skipped. Returns table events.
std::vector<event> merge_pex(peer_table& table, const std::string& sender_node_id,
                             const std::vector<peer_info>& entries);

}  // namespace mesh::discovery
