// find_node: a client looks for a node of its mesh on the LAN with mDNS. It browses without
// announcing (discovery's browse-only mode): a client is no member, and an announcement with the
// mesh's id would make every node dial it as a worker.
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>

#include "client/client.hpp"
#include "discovery/backend.hpp"
#include "transport/credential_store.hpp"
#include "transport/mesh_id.hpp"

namespace mesh {
namespace {

/// "NODEID@HOST:PORT" for a found member, preferring an IPv4 address (the client's endpoint
/// binds 0.0.0.0); IPv6 literals go in brackets. Nullopt when it has no address at all.
std::optional<std::string> endpoint_of(const discovery::peer_info& p) {
  const std::string* v6 = nullptr;
  for (const auto& a : p.addresses) {
    if (a.find(':') == std::string::npos) return p.node_id + "@" + a + ":" + std::to_string(p.port);
    if (!v6) v6 = &a;
  }
  if (v6) return p.node_id + "@[" + *v6 + "]:" + std::to_string(p.port);
  return std::nullopt;
}

}  // namespace

expected<client_options> options_for_local_node(const std::filesystem::path& state_dir) {
  auto stored = transport::load_stored_credential(state_dir);
  if (!stored) return tl::unexpected(stored.error());
  client_options o;
  if (*stored) {
    o.mesh_secret = (*stored)->secret;
    o.mesh_id = (*stored)->mesh_id;
  }
  return o;
}

expected<std::string> find_node(const client_options& options, std::chrono::milliseconds timeout) {
  struct shared {
    std::mutex m;
    std::condition_variable cv;
    std::optional<std::string> found;
    std::string last_down;  // why the daemon was unreachable, for the error message
    size_t foreign = 0;     // nodes of another mesh or protocol version seen meanwhile
  };
  auto st = std::make_shared<shared>();
  discovery::mdns_options mo;
  mo.announce = false;
  auto backend = discovery::make_avahi_backend(mo);
  // Only mesh id and protocol version matter when browsing: they decide who is a member.
  discovery::announcement self;
  self.mesh_id = options.mesh_id.empty() ? transport::mesh_id_of(options.mesh_secret) : options.mesh_id;
  self.protocol_version = msg::protocol_version;
  auto started = backend->start(self, [st](discovery::event e) {
    std::lock_guard<std::mutex> lock(st->m);
    switch (e.k) {
      case discovery::event::peer_found:
      case discovery::event::peer_updated:
        if (!st->found) st->found = endpoint_of(e.peer);
        break;
      case discovery::event::foreign_peer: ++st->foreign; break;
      case discovery::event::backend_down: st->last_down = e.detail; break;
      default: break;
    }
    st->cv.notify_all();
  });
  if (!started) return tl::unexpected(started.error());
  std::optional<std::string> found;
  std::string why;
  size_t foreign = 0;
  {
    std::unique_lock<std::mutex> lock(st->m);
    st->cv.wait_for(lock, timeout, [&] { return st->found.has_value(); });
    found = st->found;
    why = st->last_down;
    foreign = st->foreign;
  }
  backend->stop();  // joins the backend's thread: no callback runs after this
  if (found) return *found;
  const double seconds = static_cast<double>(timeout.count()) / 1000.0;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", seconds);
  std::string text = std::string("no meshnode of this mesh answered on mDNS within ") + secs +
                     " s; is avahi-daemon running? pass NODEID@HOST:PORT instead";
  if (!why.empty()) text += " (mDNS: " + why + ")";
  if (foreign > 0) text += " (" + std::to_string(foreign) + " node(s) of another mesh or protocol version seen: check the mesh secret)";
  return make_error(error_code::timeout, text);
}

}  // namespace mesh
