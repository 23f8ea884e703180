// The health actor: heartbeats out to every peer and in from them (each carries the sender's
// running stages), phi-accrual suspicion (health_monitor); a peer declared Dead is disconnected
// and reported to membership.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace mesh::node_shell {
namespace {

struct health_state {
  node_actors a;
  std::unique_ptr<health_monitor> monitor;
  std::map<node_id, uint32_t> load;  ///< running stages each peer reported
  uint32_t own_load = 0;
  uint64_t beat_seq = 0;
};

void log_transition(const health_transition& tr) {
  spdlog::info("peer {}: {} -> {}", tr.peer.short_string(), to_string(tr.from), to_string(tr.to));
}

caf::behavior health_actor(caf::stateful_actor<health_state>* self, context_ptr ctx) {
  health_config hc;
  hc.heartbeat_interval = ctx->cfg.heartbeat;
  hc.dead_after = ctx->cfg.dead_after;
  hc.min_suspect_silence = 3 * ctx->cfg.heartbeat;
  self->state.monitor = std::make_unique<health_monitor>(hc);
  self->send(self, tick_atom::value);
  self->send(self, beat_atom::value);
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](add_atom, node_id id, uint64_t incarnation) { self->state.monitor->add_peer(id, incarnation, now_mono()); },
      [=](remove_atom, node_id id) {
        self->state.monitor->remove_peer(id);
        self->state.load.erase(id);
      },
      [=](load_atom, uint32_t running) { self->state.own_load = running; },
      [=](inbound_atom, node_id from, message_ptr m) {
        auto* hb = std::get_if<msg::heartbeat>(m.get());
        if (!hb) return;
        self->state.load[from] = hb->running_stages;
        for (auto& tr : self->state.monitor->on_heartbeat(from, hb->incarnation, now_mono())) log_transition(tr);
      },
      [=](tick_atom) {
        auto& st = self->state;
        for (auto& tr : st.monitor->tick(now_mono())) {
          log_transition(tr);
          if (tr.to != peer_health::dead) continue;
          ctx->ep->disconnect(tr.peer);
          self->send(st.a.membership, down_atom::value, tr.peer, std::string("no heartbeats"), false);
        }
        self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
      },
      [=](beat_atom) {
        auto& st = self->state;
        const msg::heartbeat hb{ctx->own.incarnation, ++st.beat_seq, st.own_load};
        for (const auto& id : st.monitor->peers())
          if (st.monitor->state(id) != peer_health::dead) send_peer(*ctx, id, hb);
        self->delayed_send(self, ctx->cfg.heartbeat, beat_atom::value);
      },
      [=](view_atom) {
        auto& st = self->state;
        auto v = std::make_shared<vitals_map>();
        for (const auto& id : st.monitor->peers()) (*v)[id] = {st.monitor->state(id), st.load.count(id) ? st.load.at(id) : 0};
        return vitals_ptr(std::move(v));
      },
  };
}

}  // namespace

caf::actor spawn_health(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(health_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
