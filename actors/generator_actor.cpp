// The generator actor: clients' generate and models requests in; the node's model host
// (serving::local_backend, shared with the HTTP API) does the work on its own threads, so that a
// long generation or a model load never holds up this node's messages (heartbeats, jobs,
// status). Pieces, final messages and models replies go to the client from those threads (the
// endpoint is thread-safe). Split models (docs/serving.md): the stages this node holds for peers
// run on the stage host's thread; replies from stages on peers wake the host thread that waits.
#include "actors/node_shell.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "actors/blob_transfer.hpp"
#include "actors/generation_worker.hpp"
#include "actors/remote_stage.hpp"
#include "actors/split_model.hpp"
#include "actors/split_roster.hpp"
#include "actors/stage_host.hpp"

namespace mesh::node_shell {
namespace {

struct generator_state {
  std::unique_ptr<generation::worker> worker;
  /// Calls to the stages of this node's split models on peers (the host's threads wait on them).
  std::shared_ptr<generation::stage_calls> calls;
  /// The stages this node holds for its peers' split models.
  std::unique_ptr<generation::stage_host> stages;
  /// This node's checkpoint files offered to the stage nodes of its split models (blob_get).
  std::shared_ptr<blobs::blob_offers> offers;
  /// Fetches of files this node's stages need and lacks (the stage host's thread waits on them).
  std::shared_ptr<blobs::blob_fetcher> fetcher;
  /// The peers this node's split models re-plan over, from membership (hellos) and the
  /// connection's and health's departures.
  std::shared_ptr<generation::split_roster> roster;
  node_actors a;
  ~generator_state() {
    // The model host outlives the actors: its split models' links must not send through an
    // endpoint that is stopping, nor wait for answers that will not be read, nor re-plan.
    if (calls) calls->close();
    if (fetcher) fetcher->close();
    if (roster) roster->close();
  }
};

msg::models_reply models_of(const node_context& ctx, uint64_t id) {
  msg::models_reply r;
  r.id = id;
  r.ok = true;
  r.api_url = ctx.api_url;
  const auto u32 = [](int64_t n) { return static_cast<uint32_t>(std::clamp<int64_t>(n, 0, UINT32_MAX)); };
  for (const auto& m : ctx.models->models()) {
    msg::model_entry e{m.id, m.path, u32(m.context), u32(m.layers), m.chat, m.on_demand, {}};
    for (const auto& s : m.stages)
      if (auto id = node_id::parse(s.node)) e.stages.push_back({*id, u32(s.first_layer), u32(s.end_layer)});
    if (m.stages.empty()) e.stages.push_back({ctx.self_id, 0, u32(m.layers)});
    r.models.push_back(std::move(e));
  }
  return r;
}

msg::models_reply failed_reply(uint64_t id, const error& e) {
  msg::models_reply r;
  r.id = id;
  r.code = e.code;
  r.error = e.message;
  return r;
}

using generator_actor_ptr = caf::stateful_actor<generator_state>*;

/// The candidates of a split: this node and its healthy peers (clients are none), as their
/// hellos describe them.
expected<std::vector<generation::split_candidate>> split_candidates(const node_context& ctx, const member_map& members,
                                                                      const vitals_map& vitals, uint32_t n) {
  std::vector<generation::split_candidate> peers;
  for (const auto& [peer, hello] : members) {
    auto v = vitals.find(peer);
    if (hello.is_client || v == vitals.end() || v->second.health != peer_health::healthy) continue;
    // Free memory from the peer's latest heartbeat; its device's size until one came.
    peers.push_back({peer, ctx.memory->of(peer).value_or(hello.memory_bytes), hello.mem_gbps});
  }
  return generation::pick_split_nodes({ctx.self_id, ctx.memory->own(), ctx.own.mem_gbps}, std::move(peers), n);
}

/// A client's models_request: a list is answered at once; a load runs on the host's loader
/// thread and is answered from there; an unload frees the model once its request ends. A load
/// with split > 1 first asks membership and health for the peers to plan over.
void serve_models(generator_actor_ptr self, const context_ptr& ctx, const node_id& from, const msg::models_request& q) {
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
      spdlog::info("{} asks to load {}{}", from.short_string(), q.target, q.split > 1 ? fmt::format(" split over {} nodes", q.split) : "");
      const auto load = [ctx, reply, q](serving::local_model_options o) {
        ctx->models->load_async(std::move(o), [ctx, reply, q](expected<serving::model_info> m) {
          if (!m) {
            spdlog::warn("model {} not loaded: {}", q.target, m.error().message);
            return reply(failed_reply(q.id, m.error()));
          }
          spdlog::info("model {} loaded from {} ({} layers, context {}, {} stages)", m->id, m->path, m->layers, m->context,
                       std::max<size_t>(m->stages.size(), 1));
          reply(models_of(*ctx, q.id));
        });
      };
      if (q.split <= 1) return load(std::move(o));
      // A split plans over the peers healthy now, as membership and health see them.
      constexpr auto timeout = std::chrono::seconds(2);
      const auto view_failed = [reply, q](caf::error& e) {
        reply(failed_reply(q.id, {error_code::unavailable, "models load --split: the node's view of its peers: " + caf::to_string(e)}));
      };
      self->request(self->state.a.membership, timeout, view_atom::value).then([=](members_ptr members) mutable {
        self->request(self->state.a.health, timeout, view_atom::value).then([=](vitals_ptr vitals) mutable {
          auto nodes = split_candidates(*ctx, *members, *vitals, q.split);
          if (!nodes) return reply(failed_reply(q.id, {nodes.error().code, q.target + ": " + nodes.error().message}));
          const std::string target = q.target;
          o.split = generation::make_split_builder(self->state.calls, ctx->self_id, std::move(*nodes), q.target, {}, self->state.roster,
                                                   [target](const std::string& line) { spdlog::info("split model {}: {}", target, line); },
                                                   self->state.offers);
          load(std::move(o));
        }, view_failed);
      }, view_failed);
      return;
    }
    case models_action::replan: {
      if (q.split < 1 || q.split > 64)
        return reply(failed_reply(q.id, {error_code::invalid_argument, fmt::format("models replan: --split {} (1 to 64 nodes)", q.split)}));
      spdlog::info("{} asks to re-plan model {} over {} nodes", from.short_string(), q.target, q.split);
      // Opening the new stages waits for peers' answers, which come through this actor: off it.
      ctx->models->replan_async(q.target, q.split, [ctx, reply, q](expected<std::vector<serving::model_stage_info>> r) {
        if (!r) {
          spdlog::warn("model {} not re-planned: {}", q.target, r.error().message);
          return reply(failed_reply(q.id, r.error()));
        }
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
  self->state.roster = std::make_shared<generation::split_roster>(ctx->memory);
  self->state.worker = std::make_unique<generation::worker>(*ctx->models, [ctx](const node_id& to, const msg::message& m) {
    if (!try_send_peer(*ctx, to, m)) spdlog::debug("generate: {} left; {} not sent", to.short_string(), msg::kind_name(m));
  });
  self->state.calls = std::make_shared<generation::stage_calls>(
      [ctx](const node_id& to, const msg::message& m) { return try_send_peer(*ctx, to, m); });
  self->state.offers = ctx->offers;
  self->state.fetcher = ctx->fetcher;
  generation::stage_host_options so;
  so.make_executor = [device = ctx->cfg.device] { return make_device(device); };
  so.self = ctx->self_id.short_string();
  so.blobs = ctx->blobs;
  so.fetcher = self->state.fetcher;
  so.log = [](const std::string& line) { spdlog::info("stages: {}", line); };
  self->state.stages = std::make_unique<generation::stage_host>(so, [ctx](const node_id& to, const msg::message& m) {
    if (!try_send_peer(*ctx, to, m)) spdlog::debug("stages: {} left; {} not sent", to.short_string(), msg::kind_name(m));
  });
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](inbound_atom, node_id from, message_ptr m) {
        auto& w = *self->state.worker;
        auto& stages = *self->state.stages;
        if (auto* o = std::get_if<msg::stage_open>(m.get())) {
          spdlog::info("{} opens stage {}: layers [{}, {}) of {}", from.short_string(), o->stage, o->first_layer, o->end_layer, o->path);
          return stages.open(from, std::move(*o));
        }
        if (auto* s = std::get_if<msg::stage_step>(m.get())) return stages.step(from, std::move(*s));
        if (auto* c = std::get_if<msg::stage_close>(m.get())) {
          spdlog::info("{} closes stage {}", from.short_string(), c->stage);
          return stages.close(from, *c);
        }
        if (auto* r = std::get_if<msg::stage_reply>(m.get())) return self->state.calls->deliver(from, *r);
        // A chunk of at most 4 MiB read and hashed here (about a millisecond): the next message
        // waits that long, and the peer paces its gets (blob_fetcher::window).
        if (auto* g = std::get_if<msg::blob_get>(m.get())) {
          if (!try_send_peer(*ctx, from, self->state.offers->serve(*g))) spdlog::debug("blobs: {} left; chunk not sent", from.short_string());
          return;
        }
        if (auto* c = std::get_if<msg::blob_chunk>(m.get())) return self->state.fetcher->deliver(from, std::move(*c));
        if (auto* r = std::get_if<msg::generate_request>(m.get())) {
          spdlog::info("generate request {} from {}: {} (max {} tokens)", r->request, from.short_string(), r->model, r->max_tokens);
          w.submit(from, std::move(*r));
        } else if (auto* c = std::get_if<msg::generate_cancel>(m.get())) {
          spdlog::info("generate request {} from {} withdrawn", c->request, from.short_string());
          w.cancel(from, c->request);
        } else if (auto* q = std::get_if<msg::models_request>(m.get())) {
          serve_models(self, ctx, from, *q);
        }
      },
      // The connection to a peer closed: its generations stop, the stages it held for this node's
      // split models fail their calls (naming it), the stages this node held for it go.
      [=](down_atom, node_id id) {
        self->state.worker->client_gone(id);
        self->state.calls->peer_gone(id);
        self->state.fetcher->peer_gone(id);
        self->state.stages->owner_gone(id);
        self->state.roster->left(id);  // split models holding a stage there re-plan
      },
      // A worker peer said hello (membership): split models may re-plan over it.
      [=](up_atom, node_id id, message_ptr m) {
        if (auto* h = std::get_if<msg::hello>(m.get()); h && !h->is_client) self->state.roster->joined({id, h->memory_bytes, h->mem_gbps});
      },
  };
}

}  // namespace

caf::actor spawn_generator(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(generator_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
