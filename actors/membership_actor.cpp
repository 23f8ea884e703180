// The membership actor: who is in the mesh. It keeps the hellos of peers and clients, asks again
// for a hello that does not come, tells a newcomer where the other members are (peer exchange)
// and dials those a member tells it of; health and jobs hear who came and went.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "discovery/peer_exchange.hpp"

namespace mesh::node_shell {
namespace {

struct membership_state {
  node_actors a;
  member_map peers;
};

/// Tells the newcomer `to` where the other members are (peer exchange).
void send_peer_exchange(const node_context& ctx, const member_map& peers, const node_id& to) {
  std::vector<discovery::peer_info> members;
  for (const auto& [id, hello] : peers) {
    if (id == to || hello.is_client) continue;
    auto stats = ctx.ep->stats(id);
    if (!stats) continue;
    const auto colon = stats->remote_address.rfind(':');
    if (colon == std::string::npos) continue;
    std::string host = stats->remote_address.substr(0, colon);
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    discovery::peer_info info;
    info.node_id = id.to_string();
    info.addresses = {host};
    info.port = static_cast<uint16_t>(std::atoi(stats->remote_address.c_str() + colon + 1));
    members.push_back(std::move(info));
  }
  if (!members.empty()) send_peer(ctx, to, msg::peer_exchange{discovery::encode_pex(members)});
}

caf::behavior membership_actor(caf::stateful_actor<membership_state>* self, context_ptr ctx) {
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](inbound_atom, node_id from, message_ptr m) {
        auto& st = self->state;
        if (auto* h = std::get_if<msg::hello>(m.get())) {
          if (h->answer_me) send_peer(*ctx, from, ctx->own);
          auto known = st.peers.find(from);
          if (known != st.peers.end() && known->second.incarnation == h->incarnation) return;  // a repeat
          st.peers[from] = *h;
          if (h->is_client) return;
          self->send(st.a.health, add_atom::value, from, h->incarnation);
          self->send(st.a.jobs, up_atom::value, from, m);
          self->send(st.a.generator, up_atom::value, from, m);
          spdlog::info("peer {} joined: {} ({:.1f} GFLOP/s)", from.short_string(), h->device_name, h->gflops);
          send_peer_exchange(*ctx, st.peers, from);
        } else if (auto* px = std::get_if<msg::peer_exchange>(m.get())) {
          // Only members (workers that said hello) tell us where others are: a client, or a
          // connection that has not introduced itself, cannot make this node dial addresses of
          // its choosing. The endpoint bounds the dials under way as well.
          auto sender = st.peers.find(from);
          if (sender == st.peers.end() || sender->second.is_client) {
            spdlog::warn("ignored a peer exchange from {}: not a member of this mesh", from.short_string());
            return;
          }
          auto entries = discovery::decode_pex(px->pex);
          if (!entries) {
            spdlog::warn("bad peer exchange from {}: {}", from.short_string(), entries.error().message);
            return;
          }
          for (const auto& e : *entries) {
            auto nid = node_id::parse(e.node_id);
            if (!nid || *nid == ctx->self_id || st.peers.count(*nid)) continue;
            auto addrs = reachable(*ctx->ep, e.addresses, e.port);
            if (addrs.empty()) continue;  // only addresses of a family our socket cannot use
            spdlog::info("peer exchange: {} told us of {}", from.short_string(), nid->short_string());
            ctx->ep->dial(*nid, addrs);
          }
        }
      },
      // A peer came up `tries` seconds ago and its hello has not arrived: ask for it, once a
      // second, for as long as the connection lasts (at most 30 times).
      [=](greet_atom, node_id id, int tries) {
        if (self->state.peers.count(id) || tries > 30) return;
        if (!ctx->ep->connected(id)) return;  // gone: its next connection starts over
        if (tries > 1) {
          msg::hello again = ctx->own;
          again.answer_me = true;
          send_peer(*ctx, id, again);
          spdlog::info("no hello from {} yet: asked again", id.short_string());
        }
        self->delayed_send(self, std::chrono::seconds(1), greet_atom::value, id, tries + 1);
      },
      // The connection closed, or health declared the peer Dead.
      [=](down_atom, node_id id, std::string why, bool orderly) {
        auto& st = self->state;
        auto it = st.peers.find(id);
        if (it == st.peers.end()) return;
        const bool worker = !it->second.is_client;
        st.peers.erase(it);
        if (worker) {
          // A peer that was stopped (or closed the connection on purpose) is no surprise; one
          // that failed is. The transport tells them apart by the close code.
          if (orderly)
            spdlog::info("peer {} left ({})", id.short_string(), why);
          else
            spdlog::warn("peer {} is gone ({}); re-planning its work", id.short_string(), why);
          self->send(st.a.health, remove_atom::value, id);
        }
        self->send(st.a.jobs, down_atom::value, id, why);
        // Health's Dead comes here, not through the bridge: stage calls to it fail at once.
        if (worker) self->send(st.a.generator, down_atom::value, id);
      },
      [=](view_atom) { return std::make_shared<const member_map>(self->state.peers); },
  };
}

}  // namespace

caf::actor spawn_membership(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(membership_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
