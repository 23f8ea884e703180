// The status actor: answers a status request (meshctl, clients) with a snapshot of the node made
// from the views of membership, health and jobs and the endpoint's per-peer statistics.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace mesh::node_shell {
namespace {

struct status_state {
  node_actors a;
};

msg::status_reply make_status(const node_context& ctx, uint64_t id, const member_map& members, const vitals_map& vitals,
                              const std::vector<msg::job_status>& jobs) {
  msg::status_reply r;
  r.id = id;
  r.node = ctx.self_id;
  r.device = ctx.own.device_name + " (" + to_string(ctx.own.device) + ")";
  r.gflops = ctx.own.gflops;
  r.memory_bytes = ctx.own.memory_bytes;
  r.free_memory_bytes = ctx.memory->own();
  r.uptime_s = std::chrono::duration<double>(now_mono() - ctx.started).count();
  for (const auto& [peer, hello] : members) {
    if (hello.is_client) continue;
    msg::peer_status ps;
    ps.node = peer;
    auto v = vitals.find(peer);
    ps.health = v != vitals.end() ? v->second.health : peer_health::unknown;
    ps.running_stages = v != vitals.end() ? v->second.running_stages : 0;
    ps.device = hello.device_name;
    ps.gflops = hello.gflops;
    ps.memory_bytes = hello.memory_bytes;
    ps.free_memory_bytes = ctx.memory->of(peer).value_or(0);
    if (auto s = ctx.ep->stats(peer)) {
      ps.address = s->remote_address;
      ps.rtt_ms = std::chrono::duration<double, std::milli>(s->smoothed_rtt).count();
      ps.packets_lost = s->packets_lost;
      ps.relayed = s->relayed;
    }
    const auto refused = ctx.refusals->of(peer);
    ps.refused = refused.count;
    ps.last_refusal = refused.last;
    r.peers.push_back(ps);
  }
  r.jobs = jobs;
  return r;
}

/// What the dashboard and /metrics show: this node, its peers, the models it serves (where their
/// layers run: all on this node, or a split model's stages), the trainings it knows.
serving::mesh_snapshot make_snapshot(const node_context& ctx, const member_map& members, const vitals_map& vitals,
                                     const std::vector<msg::job_status>& jobs,
                                     const loss_curves& curves) {
  serving::mesh_snapshot s;
  s.uptime_s = std::chrono::duration<double>(now_mono() - ctx.started).count();
  serving::node_view self;
  self.id = ctx.self_id.to_string();
  self.device = ctx.own.device_name + " (" + to_string(ctx.own.device) + ")";
  self.health = "self";
  self.self = true;
  self.gflops = ctx.own.gflops;
  self.memory_bytes = ctx.own.memory_bytes;
  self.free_memory_bytes = ctx.memory->own();
  s.nodes.push_back(std::move(self));
  for (const auto& [peer, hello] : members) {
    if (hello.is_client) continue;
    serving::node_view n;
    n.id = peer.to_string();
    n.device = hello.device_name + " (" + to_string(hello.device) + ")";
    auto v = vitals.find(peer);
    n.health = to_string(v != vitals.end() ? v->second.health : peer_health::unknown);
    n.running_stages = v != vitals.end() ? v->second.running_stages : 0;
    n.gflops = hello.gflops;
    n.memory_bytes = hello.memory_bytes;
    n.free_memory_bytes = ctx.memory->of(peer).value_or(0);
    if (auto st = ctx.ep->stats(peer)) {
      n.address = st->remote_address;
      n.rtt_ms = std::chrono::duration<double, std::milli>(st->smoothed_rtt).count();
      n.bytes_sent = st->bytes_sent;
      n.bytes_received = st->bytes_received;
      n.packets_lost = st->packets_lost;
      n.relayed = st->relayed;
    }
    s.nodes.push_back(std::move(n));
  }
  if (ctx.models)
    for (const auto& m : ctx.models->models()) {
      serving::model_view v{m.id, m.path, m.context, m.layers, {}};
      for (const auto& st : m.stages) v.stages.push_back({st.node, st.first_layer, st.end_layer});
      if (v.stages.empty()) v.stages.push_back({ctx.self_id.to_string(), 0, m.layers});
      s.models.push_back(std::move(v));
    }
  for (const auto& j : jobs)
    if (j.kind == job_kind::training) {
      auto c = curves.find(j.job);
      s.trainings.push_back({j.job, to_string(j.state), j.step, j.steps, c != curves.end() ? c->second : std::vector<double>{}});
    }
  return s;
}

/// How often the board the HTTP side reads is refreshed.
constexpr auto board_interval = std::chrono::seconds(1);

caf::behavior status_actor(caf::stateful_actor<status_state>* self, context_ptr ctx) {
  self->send(self, tick_atom::value);
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](tick_atom) {
        self->delayed_send(self, board_interval, tick_atom::value);
        const auto& a = self->state.a;
        if (!a.membership) return;  // not wired yet
        const auto failed = [](caf::error& e) { spdlog::debug("mesh board: {}", caf::to_string(e)); };
        constexpr auto timeout = std::chrono::seconds(2);
        self->request(a.membership, timeout, view_atom::value).then([=](members_ptr members) {
          self->request(self->state.a.health, timeout, view_atom::value).then([=](vitals_ptr vitals) {
            self->request(self->state.a.jobs, timeout, view_atom::value).then([=](std::shared_ptr<const std::vector<msg::job_status>> jobs) {
              using curves_ptr = std::shared_ptr<const loss_curves>;
              self->request(self->state.a.jobs, timeout, curves_atom::value).then([=](curves_ptr curves) {
                ctx->board->put(make_snapshot(*ctx, *members, *vitals, *jobs, *curves));
              }, failed);
            }, failed);
          }, failed);
        }, failed);
      },
      [=](inbound_atom, node_id from, message_ptr m) {
        auto* rq = std::get_if<msg::status_request>(m.get());
        if (!rq) return;
        const uint64_t id = rq->id;
        const auto& a = self->state.a;
        const auto failed = [from](caf::error& e) { spdlog::warn("status for {}: {}", from.short_string(), caf::to_string(e)); };
        constexpr auto timeout = std::chrono::seconds(2);
        self->request(a.membership, timeout, view_atom::value).then([=](members_ptr members) {
          self->request(self->state.a.health, timeout, view_atom::value).then([=](vitals_ptr vitals) {
            self->request(self->state.a.jobs, timeout, view_atom::value).then([=](std::shared_ptr<const std::vector<msg::job_status>> jobs) {
              send_peer(*ctx, from, make_status(*ctx, id, *members, *vitals, *jobs));
            }, failed);
          }, failed);
        }, failed);
      },
  };
}

}  // namespace

caf::actor spawn_status(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(status_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
