#pragma once
/// The values discovery hands to the rest of the node: what we announce, what we learn about a
/// peer, and the events that carry it. Plain data, no I/O.
#include <cstdint>
#include <string>
#include <vector>

namespace mesh::discovery {

/// DNS-SD service type every node announces and browses.
inline constexpr const char* service_type = "_meshnode._udp";

/// What a node announces about itself. Every field is validated before it goes on the wire.
struct announcement {
  std::string node_id;            ///< 64 lowercase hex chars (Ed25519 public key)
  std::string mesh_id;            ///< printable hash of the mesh secret (never the secret)
  uint32_t protocol_version = 0;  ///< wire protocol version of the node
  uint16_t port = 0;              ///< UDP port of the node's QUIC endpoint
  std::string device_summary;     ///< short printable text, e.g. "NVIDIA H100 80GB"
};

/// What discovery knows about another node: a hint where it may be, never proof it is alive.
struct peer_info {
  std::string node_id;
  std::string mesh_id;
  uint32_t protocol_version = 0;
  std::vector<std::string> addresses;  ///< IP literals; IPv6 link-local ones carry "%ifname"
  uint16_t port = 0;
  std::string device_summary;
  std::string source;  ///< "avahi", "dnssd", "static" or "exchange"
};

/// One thing a backend or the peer table observed.
struct event {
  enum kind {
    peer_found,     ///< a member of our mesh (same mesh id and protocol version) appeared
    peer_updated,   ///< a known member's addresses or port changed
    peer_lost,      ///< a member is no longer announced (a hint: it may still be alive)
    foreign_peer,   ///< a node of another mesh id or protocol version: never dial it by default
    peer_rejected,  ///< an announcement that failed validation; `detail` says why
    peer_hint,      ///< a static address to dial; node id unknown until the handshake
    backend_down,   ///< the backend lost its daemon/service; it retries with back-off
    backend_up,     ///< the backend is (again) announcing and browsing
    /// A member is still announced (every mdns_options::remind_every): a consumer that lost its
    /// connection to it (a partition, a peer declared Dead) dials it again.
    peer_still_announced,
  };
  kind k = peer_found;
  peer_info peer;
  std::string detail;
};

/// Stable lowercase name of an event kind, for logs and tests.
const char* to_string(event::kind k);

/// True when `peer` may join our mesh: same mesh id and the same protocol version.
bool is_member(const announcement& self, const peer_info& peer);

}  // namespace mesh::discovery
