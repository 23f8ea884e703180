#include "discovery/types.hpp"

namespace mesh::discovery {

const char* to_string(event::kind k) {
  switch (k) {
    case event::peer_found: return "peer_found";
    case event::peer_updated: return "peer_updated";
    case event::peer_lost: return "peer_lost";
    case event::foreign_peer: return "foreign_peer";
    case event::peer_rejected: return "peer_rejected";
    case event::peer_hint: return "peer_hint";
    case event::backend_down: return "backend_down";
    case event::backend_up: return "backend_up";
    case event::peer_still_announced: return "peer_still_announced";
  }
  return "unknown";
}

bool is_member(const announcement& self, const peer_info& peer) {
  return peer.mesh_id == self.mesh_id && peer.protocol_version == self.protocol_version;
}

}  // namespace mesh::discovery
