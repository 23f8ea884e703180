#pragma once
// Same-host scenarios shared by the Avahi and dns_sd backend tests: each runs discovery_node
// processes against a private avahi-daemon on loopback in its own network namespace (never the
// machine's own daemon). `kind` is "avahi" or "dnssd".
#include <string>

namespace mesh::discovery::test {

/// Two announcers find each other; a clean stop is seen as lost.
void two_announcers_find_each_other(const std::string& kind);
/// A node of another mesh id is reported foreign, never as a member.
void other_mesh_is_foreign(const std::string& kind);
/// Two nodes announcing one service name: the second takes an alternative and both are found.
void name_conflict_is_resolved(const std::string& kind);
/// No daemon at start: backend_down, then announced and found once the daemon starts.
void daemon_absent_then_started(const std::string& kind);
/// The daemon restarted under running nodes: they report down, re-announce and re-discover.
void daemon_restart_reannounces(const std::string& kind);
/// Hostile TXT records (published with avahi-publish) are rejected; a good node is still found.
void hostile_txt_is_rejected(const std::string& kind);
/// A service whose host has no address yet is found once the address appears.
void unresolved_is_retried(const std::string& kind);
/// The daemon stopped while a lookup (a resolution) is open: the node reports down, survives,
/// and comes back up with the daemon.
void daemon_stops_during_lookup(const std::string& kind);

}  // namespace mesh::discovery::test
