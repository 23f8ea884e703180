// The health actor: heartbeats out to every peer and in from them (each carries the sender's
// running stages and free device memory), phi-accrual suspicion (health_monitor); a peer declared Dead is disconnected
// and reported to membership. It runs detached (a thread of its own) and takes heartbeat
// datagrams straight from the endpoint (node.cpp), so neither waits behind other work.
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

void on_heartbeat(caf::stateful_actor<health_state>* self, const context_ptr& ctx, const node_id& from, const msg::heartbeat& hb) {
  self->state.load[from] = hb.running_stages;
  ctx->memory->reported(from, hb.free_memory_bytes);
  for (auto& tr : self->state.monitor->on_heartbeat(from, hb.incarnation, now_mono())) log_transition(tr);
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
        ctx->memory->forget(id);
      },
      [=](load_atom, uint32_t running) { self->state.own_load = running; },
      [=](inbound_atom, node_id from, message_ptr m) {  // a heartbeat the bridge decoded
        if (auto* hb = std::get_if<msg::heartbeat>(m.get())) on_heartbeat(self, ctx, from, *hb);
      },
      [=](inbound_atom, node_id from, std::vector<uint8_t>& bytes) {  // a datagram, straight from the endpoint
        auto m = msg::decode_message(bytes.data(), bytes.size(), ctx->cfg.decode_budget, &ctx->cfg.limits);
        std::string why;
        if (!m) why = m.error().to_string();
        else if (!std::holds_alternative<msg::heartbeat>(*m)) why = "a message other than a heartbeat came as a datagram";
        if (!why.empty()) {
          spdlog::warn("refused a datagram from {}: {}", from.short_string(), why);
          ctx->refusals->record(from, why);
          return;
        }
        on_heartbeat(self, ctx, from, std::get<msg::heartbeat>(*m));
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
        // Free memory is asked of the device at each beat: this node's models and other
        // processes on the device change it.
        const msg::heartbeat hb{ctx->own.incarnation, ++st.beat_seq, st.own_load, ctx->memory->own()};
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
  // Detached: a thread of its own, so that its heartbeats and its checks keep their time while
  // the two scheduler threads decode large messages or run other actors' work.
  return parent.spawn<caf::monitored + caf::detached>(health_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
