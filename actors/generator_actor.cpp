// The generator actor: clients' generate requests in, the generation worker
// (generation_worker.hpp) does the rest on its own thread, so that a long generation never holds
// up this node's messages (heartbeats, jobs, status). The worker sends pieces and final messages
// to the client itself (the endpoint is thread-safe).
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "actors/generation_worker.hpp"

namespace mesh::node_shell {
namespace {

struct generator_state {
  std::unique_ptr<generation::worker> worker;
};

caf::behavior generator_actor(caf::stateful_actor<generator_state>* self, context_ptr ctx) {
  // Each model gets an executor from the node's own device factory (the stage executor is not
  // thread-safe and stays with the executor actor).
  self->state.worker = std::make_unique<generation::worker>(
      [ctx] { return make_device(ctx->cfg.device); },
      [ctx](const node_id& to, const msg::message& m) {
        if (!try_send_peer(*ctx, to, m)) spdlog::debug("generate: {} left; {} not sent", to.short_string(), msg::kind_name(m));
      });
  return {
      [=](wire_atom, actors_ptr) {},
      [=](inbound_atom, node_id from, message_ptr m) {
        auto& w = *self->state.worker;
        if (auto* r = std::get_if<msg::generate_request>(m.get())) {
          spdlog::info("generate request {} from {}: {} (max {} tokens)", r->request, from.short_string(), r->model, r->max_tokens);
          w.submit(from, std::move(*r));
        } else if (auto* c = std::get_if<msg::generate_cancel>(m.get())) {
          spdlog::info("generate request {} from {} withdrawn", c->request, from.short_string());
          w.cancel(from, c->request);
        }
      },
      // The connection to a peer closed: its generations stop.
      [=](down_atom, node_id id) { self->state.worker->client_gone(id); },
  };
}

}  // namespace

caf::actor spawn_generator(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(generator_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
