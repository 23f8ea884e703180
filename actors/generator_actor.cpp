// The generator actor: clients' generate and models requests in; the node's model host
// (serving::local_backend, shared with the HTTP API) does the work on its own threads, so that a
// long generation or a model load never holds up this node's messages (heartbeats, jobs,
// status). Pieces, final messages and models replies go to the client from those threads (the
// endpoint is thread-safe).
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

msg::models_reply models_of(const node_context& ctx, uint64_t id) {
  msg::models_reply r;
  r.id = id;
  r.ok = true;
  r.api_url = ctx.api_url;
  const auto u32 = [](int64_t n) { return static_cast<uint32_t>(std::clamp<int64_t>(n, 0, UINT32_MAX)); };
  for (const auto& m : ctx.models->models())
    r.models.push_back({m.id, m.path, u32(m.context), u32(m.layers), m.chat, m.on_demand});
  return r;
}

msg::models_reply failed_reply(uint64_t id, const error& e) {
  msg::models_reply r;
  r.id = id;
  r.code = e.code;
  r.error = e.message;
  return r;
}

/// A client's models_request: a list is answered at once; a load runs on the host's loader
/// thread and is answered from there; an unload frees the model once its request ends.
void serve_models(const context_ptr& ctx, const node_id& from, const msg::models_request& q) {
  const auto reply = [ctx, from](const msg::models_reply& r) {
    if (!try_send_peer(*ctx, from, r)) spdlog::debug("models: {} left; reply not sent", from.short_string());
  };
  switch (q.action) {
    case models_action::list: reply(models_of(*ctx, q.id)); return;
    case models_action::load: {
      if (q.target.empty() || q.target.size() > 4096 || q.target.find('\0') != std::string::npos)
        return reply(failed_reply(q.id, {error_code::invalid_argument, "models load: the path is empty, too long or has a NUL byte"}));
      serving::local_model_options o;
      o.path = q.target;
      o.chat_template = q.chat_template;
      o.context = q.context;
      spdlog::info("{} asks to load {}", from.short_string(), q.target);
      ctx->models->load_async(std::move(o), [ctx, reply, q](expected<serving::model_info> m) {
        if (!m) {
          spdlog::warn("model {} not loaded: {}", q.target, m.error().message);
          return reply(failed_reply(q.id, m.error()));
        }
        spdlog::info("model {} loaded from {} ({} layers, context {})", m->id, m->path, m->layers, m->context);
        reply(models_of(*ctx, q.id));
      });
      return;
    }
    case models_action::unload: {
      if (auto ok = ctx->models->unload(q.target); !ok) return reply(failed_reply(q.id, ok.error()));
      spdlog::info("model {} unloaded by {}", q.target, from.short_string());
      reply(models_of(*ctx, q.id));
      return;
    }
  }
}

caf::behavior generator_actor(caf::stateful_actor<generator_state>* self, context_ptr ctx) {
  self->state.worker = std::make_unique<generation::worker>(*ctx->models, [ctx](const node_id& to, const msg::message& m) {
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
        } else if (auto* q = std::get_if<msg::models_request>(m.get())) {
          serve_models(ctx, from, *q);
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
