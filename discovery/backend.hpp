#pragma once
/// One interface for every way of finding peers: mDNS through Avahi's native API, mDNS through
/// Bonjour's dns_sd.h API (macOS; avahi-compat on Linux), and static peers. A backend announces
/// us and reports what it finds as events, from its own thread: the callback must be quick and
/// thread-safe (hand the event to an actor, a queue, a peer_table behind a lock).
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "discovery/types.hpp"
#include "base/error.hpp"

namespace mesh::discovery {

/// Called from a backend's thread (or from within its start()), never concurrently for one
/// backend; it must not call start() or stop() of that backend.
using event_callback = std::function<void(event)>;

class backend {
 public:
  virtual ~backend();
  /// Starts announcing `self` and browsing. A daemon that is absent is not an error: the backend
  /// reports backend_down and retries with back-off. Errors: invalid announcement, no resources.
  virtual expected<void> start(const announcement& self, event_callback on_event) = 0;
  /// Withdraws the announcement (peers see us leave) and stops; no callback runs after it returns.
  virtual void stop() = 0;
};

/// Options of the mDNS backends. The avahi-daemon used is the one on the process's D-Bus system
/// bus (DBUS_SYSTEM_BUS_ADDRESS, else /run/dbus/system_bus_socket); libdbus reads that address
/// once per process, so one process talks to one daemon.
struct mdns_options {
  /// Service instance name; empty: "meshnode-<first 12 chars of the node id>". A conflicting
  /// name is replaced by an alternative ("... #2"), never fatal.
  std::string service_name;
  /// Reconnect back-off while the daemon is gone.
  std::chrono::milliseconds retry_initial{250};
  std::chrono::milliseconds retry_max{8000};
  /// false: browse only, publish nothing. For a client looking for a node: it is no member, so
  /// nodes must not find (and dial) it. `self` then needs only node_id (may be empty), mesh_id and
  /// protocol_version, which classify what is found. Avahi backend only.
  bool announce = true;
  /// How often every member still announced is reported again (peer_still_announced): mDNS says
  /// nothing new while a record stands, so without it a member lost to a partition that healed
  /// would never be dialed again. 0: never.
  std::chrono::milliseconds remind_every{5000};
};

/// Avahi native client API with AvahiThreadedPoll (Linux).
std::unique_ptr<backend> make_avahi_backend(mdns_options options = {});

/// Bonjour dns_sd.h API (macOS; on Linux through avahi-compat-libdns_sd).
std::unique_ptr<backend> make_dnssd_backend(mdns_options options = {});

/// Static peers from `--peer` values (see static_peer.hpp). Names are resolved on the backend's
/// thread (retried with back-off while resolution fails); each address found is reported once:
/// peer_found for "<id>@host:port" entries, peer_hint for plain addresses. Errors: a bad value.
expected<std::unique_ptr<backend>> make_static_backend(const std::vector<std::string>& peers);

}  // namespace mesh::discovery
