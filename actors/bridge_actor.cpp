// The bridge actor: endpoint events in. It greets a peer that came up, decodes every message
// (refusing, logging and counting what fails to decode) and routes it to the actor that owns it.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace mesh::node_shell {
namespace {

struct bridge_state {
  node_actors a;
};

caf::behavior bridge_actor(caf::stateful_actor<bridge_state>* self, context_ptr ctx) {
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](up_atom, node_id id) {
        send_peer(*ctx, id, ctx->own);  // our hello comes first
        self->send(self->state.a.membership, greet_atom::value, id, 1);  // and is repeated if theirs does not come
      },
      [=](down_atom, node_id id, std::string why, bool orderly) {
        self->send(self->state.a.membership, down_atom::value, id, why, orderly);
        self->send(self->state.a.generator, down_atom::value, id);  // its generations stop
      },
      [=](inbound_atom, node_id from, std::vector<uint8_t>& bytes, receipt_ptr receipt) {
        // Graphs inside are validated here, once, against this node's limits (wire/graph_payload.hpp).
        auto m = msg::decode_message(bytes.data(), bytes.size(), ctx->cfg.decode_budget, &ctx->cfg.limits);
        // The decoded message owns copies of everything: the buffer goes back to the endpoint,
        // which receives the next large message into it (no fresh pages for the kernel to zero).
        ctx->ep->recycle(std::move(bytes));
        if (!m) {
          // Another protocol version, past the budget, malformed: refused, logged and counted
          // (meshctl peers shows the count and the last reason); the connection stays.
          spdlog::warn("refused a message from {}: {}", from.short_string(), m.error().to_string());
          ctx->refusals->record(from, m.error().to_string());
          return;
        }
        const auto& a = self->state.a;
        const caf::actor& owner = std::holds_alternative<msg::hello>(*m) || std::holds_alternative<msg::peer_exchange>(*m) ? a.membership
                                  : std::holds_alternative<msg::heartbeat>(*m)                                             ? a.health
                                  : std::holds_alternative<msg::status_request>(*m)                                        ? a.status
                                  : std::holds_alternative<msg::generate_request>(*m) ||
                                          std::holds_alternative<msg::generate_cancel>(*m) ||
                                          std::holds_alternative<msg::models_request>(*m) ||
                                          std::holds_alternative<msg::stage_open>(*m) || std::holds_alternative<msg::stage_step>(*m) ||
                                          std::holds_alternative<msg::stage_close>(*m) || std::holds_alternative<msg::stage_reply>(*m) ||
                                          std::holds_alternative<msg::blob_get>(*m) || std::holds_alternative<msg::blob_chunk>(*m) ? a.generator
                                                                                                                           : a.jobs;
        // The receipt lives as long as the decoded message: released when its owner is done.
        message_ptr decoded(new msg::message(std::move(*m)), [receipt](msg::message* p) { delete p; });
        self->send(owner, inbound_atom::value, from, std::move(decoded));
      },
  };
}

}  // namespace

caf::actor spawn_bridge(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(bridge_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
