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

caf::behavior status_actor(caf::stateful_actor<status_state>* self, context_ptr ctx) {
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
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
