#pragma once
/// The node's merged view of discovered peers: events from every backend (Avahi, dns_sd, static
/// peers, peer exchange) go in, one event stream per node id comes out. A member is found when
/// its first source reports it and lost when its last source forgets it; addresses are the union
/// over sources. Pure: no I/O, no threads (the owner serialises calls, e.g. an actor).
#include <map>
#include <string>
#include <vector>

#include "discovery/types.hpp"

namespace mesh::discovery {

class peer_table {
 public:
  explicit peer_table(announcement self);

  /// Applies one backend event; returns what the mesh should see. Member events are merged
  /// across sources; foreign, rejected, hint and backend events pass through unchanged.
  std::vector<event> apply(const event& e);

  /// Drops every source of `node_id` (e.g. the health monitor declared it dead); returns the
  /// peer_lost event if it was a member.
  std::vector<event> forget(const std::string& node_id, const std::string& detail);

  /// Current members, merged over sources.
  std::vector<peer_info> members() const;

  /// A member by node id, or nullptr.
  const peer_info* find(const std::string& node_id) const;

  /// Our own announcement (for classification and peer exchange).
  const announcement& self() const { return self_; }

 private:
  std::vector<event> refresh(const std::string& node_id, const std::string& detail);

  announcement self_;
  std::map<std::string, std::map<std::string, peer_info>> sources_;  // node id -> source -> info
  std::map<std::string, peer_info> reported_;                         // members reported found
};

}  // namespace mesh::discovery
