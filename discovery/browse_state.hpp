#pragma once
/// What one mDNS backend has resolved, as a pure state machine shared by the Avahi and dns_sd
/// shells. A node may be seen as several service instances (one per interface and IP protocol,
/// or under an alternative name after a conflict); this folds them into one peer per node id and
/// turns "instance resolved/removed" into peer events. No I/O, no threads.
#include <map>
#include <string>
#include <vector>

#include "discovery/types.hpp"

namespace mesh::discovery {

class browse_state {
 public:
  /// `self` filters out our own announcement and classifies others; `source` tags peer_info.
  browse_state(announcement self, std::string source);

  /// An instance (`instance_key` unique per name, interface and protocol) resolved to these TXT
  /// entries, addresses and SRV port. Returns the events it causes (possibly none). A member
  /// whose last instance of our mesh now announces another mesh or protocol version gives
  /// peer_lost, then foreign_peer.
  std::vector<event> resolved(const std::string& instance_key, const std::vector<std::string>& txt,
                              const std::vector<std::string>& addresses, uint16_t port);

  /// An instance disappeared (goodbye or expiry). Returns peer_lost when it was the node's last.
  std::vector<event> removed(const std::string& instance_key);

  /// The backend lost its daemon: every member it knew is reported lost (with `detail`), since
  /// nothing keeps those records fresh any more. Returns the events.
  std::vector<event> clear(const std::string& detail);

  /// Members currently known through this backend.
  std::vector<peer_info> members() const;

 private:
  struct instance {
    std::string node_id;
    bool member = false;
    peer_info info;  // as resolved for this instance only
  };
  peer_info merged(const std::string& node_id) const;
  std::vector<event> refresh(const std::string& node_id, const std::string& detail);

  announcement self_;
  std::string source_;
  std::map<std::string, instance> instances_;      // by instance key
  std::map<std::string, peer_info> reported_;      // members we reported found, by node id
  std::map<std::string, std::string> foreign_;     // node id -> "mesh/version" already reported
};

}  // namespace mesh::discovery
