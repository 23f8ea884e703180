// The jobs actor: the job coordinators and workers of one-shot jobs and sessions (job_engine) and
// of training (train_engine). It feeds them messages, peers' comings and goings and the
// executor's results, runs the stages they make ready on the executor, and sends what they
// produce, holding messages for peers that are not connected (yet, or again).
#include "actors/node_shell.hpp"

#include <cstdlib>
#include <string_view>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "actors/held_messages.hpp"
#include "gpu/cpu_thread_pool.hpp"
#include "gpu/host_copy.hpp"

namespace mesh::node_shell {
namespace {

struct jobs_state {
  node_actors a;
  std::unique_ptr<job_engine> engine;
  std::unique_ptr<train_engine> trainer;
  /// The ring's passes over all-reduce pieces (train_engine::set_parallel): the host-copy
  /// threads (gpu/host_copy.hpp), the actor's own among them.
  std::shared_ptr<gpu::thread_pool> ring_threads;
  caf::actor executor;
  std::map<const stage_task*, std::shared_ptr<stage_task>> in_flight;
  std::map<const train_task*, std::shared_ptr<train_task>> train_in_flight;
  uint32_t reported_load = 0;
  /// Messages to peers this node is not connected to (yet, or again): held, in order, until the
  /// peer's hello or until it is connected again, dropped when it is reported down or after
  /// held_ttl. A node joining a training ring learns of its neighbours by peer exchange and may
  /// finish its first step before it has dialed them; a node restarted after a crash is back in a
  /// ring (its coordinator saw its hello) before its neighbours have seen it. What is produced for
  /// a peer after its down was handled (a result for a client that left, a stage_done for a dead
  /// coordinator) has nobody to flush it: the age limit frees it, so it cannot fill the store.
  held_messages held{4096, size_t{256} << 20, std::chrono::seconds(30)};  // all-reduce pieces are MiBs
};

using jobs_actor_t = caf::stateful_actor<jobs_state>;

void send_to(jobs_actor_t* self, const node_context& ctx, const node_id& to, const msg::message& m) {
  auto& st = self->state;
  if (to == ctx.self_id) {  // our own stages and results: through the mailbox, like any message
    self->send(self, inbound_atom::value, ctx.self_id, std::make_shared<msg::message>(m));
    return;
  }
  const auto send = [&](const msg::message& x) { return try_send_peer(ctx, to, x); };
  if (st.held.holds(to)) {
    // Connected again without a hello (a client reconnecting): what waits goes first, in order.
    if (ctx.ep->connected(to) && st.held.flush(to, send) && send(m)) return;
  } else if (send(m)) {
    return;
  }
  auto bytes = msg::encode_message(m);  // only for its size: this path is rare
  const size_t size = bytes ? bytes->size() : 0;
  if (!st.held.hold(to, m, size, std::chrono::steady_clock::now()))
    spdlog::warn("send {} to {}: not connected, and {} messages ({} MiB) already wait for peers; dropped",
                 msg::kind_name(m), to.short_string(), st.held.count(), st.held.bytes() >> 20);
}

void dispatch(jobs_actor_t* self, const node_context& ctx, std::vector<outbound> out) {
  for (auto& o : out) send_to(self, ctx, o.to, o.m);
}

/// What the engines refused for their senders' lack of authority (a forged setup, activation or
/// piece): logged, and counted against the sender as the bridge counts undecodable messages
/// (`meshctl peers` shows both). The node goes on.
void report_refused(jobs_actor_t* self, const node_context& ctx) {
  auto refused = self->state.engine->take_refused();
  for (auto& r : self->state.trainer->take_refused()) refused.push_back(std::move(r));
  for (const auto& r : refused) {
    spdlog::warn("refused {} from {}: {}", r.kind, r.from.short_string(), r.why);
    ctx.refusals->record(r.from, r.kind + ": " + r.why);
  }
  for (const auto& n : self->state.trainer->take_notices()) {
    if (n.warning) spdlog::warn("{}", n.text);
    else spdlog::info("{}", n.text);
  }
}

/// Hands ready stages to the executor and tells health our load (heartbeats carry it).
void run_ready(jobs_actor_t* self) {
  auto& st = self->state;
  for (auto& t : st.engine->take_ready()) {
    auto task = std::make_shared<stage_task>(std::move(t));
    st.in_flight[task.get()] = task;
    self->send(st.executor, run_atom::value, task);
  }
  // Session fragments the engine let go: after the stages sent above (the mailbox keeps order).
  for (auto& key : st.engine->take_forgotten()) self->send(st.executor, forget_atom::value, key);
  for (auto& t : st.trainer->take_ready()) {
    auto task = std::make_shared<train_task>(std::move(t));
    st.train_in_flight[task.get()] = task;
    self->send(st.executor, run_atom::value, task);
  }
  const auto load = static_cast<uint32_t>(st.engine->running_stages());
  if (load != st.reported_load && st.a.health) self->send(st.a.health, load_atom::value, load);
  st.reported_load = load;
}

/// A client's run on a data file: the file is offered to the peers by digest (hashing it reads
/// it all once, so on a thread of its own, not the actor's), then the run opens with the offer in
/// its spec (offered_atom). A client's own idea of the digest is not used.
void offer_data(jobs_actor_t* self, const context_ptr& ctx, const node_id& client, const msg::open_training& o) {
  auto m = std::make_shared<msg::message>(o);
  auto& text = std::get<msg::open_training>(*m).spec.text[0];
  text.file = {};
  spdlog::info("training {} of {}: offering its data file {}", o.train, client.short_string(), text.path);
  std::thread([me = caf::actor_cast<caf::actor>(self), offers = ctx->offers, node = ctx->self_id.short_string(), client, m] {
    auto& t = std::get<msg::open_training>(*m).spec.text[0];
    std::string failure;
    std::error_code ec;
    if (t.path.empty() || !std::filesystem::path(t.path).is_absolute()) {
      failure = "the data file must be named by an absolute path on node " + node + ", not \"" + t.path + "\"";
    } else if (std::filesystem::is_directory(t.path, ec)) {
      failure = t.path + " is a directory, not a data file";
    } else if (auto got = offers->offer(t.path); !got) {
      failure = "node " + node + ": " + got.error().message;
    } else {
      t.file.id = got->id;
      t.file.size = got->size;
      t.file.chunk_list = got->chunk_list;
    }
    caf::anon_send(me, offered_atom::value, client, std::move(m), std::move(failure));
  }).detach();
}

caf::behavior jobs_actor(jobs_actor_t* self, context_ptr ctx) {
  auto& st = self->state;
  const auto& own = ctx->own;
  // Job ids start from this start's time in ms (shifted: a session's id is shifted 16 bits more in
  // its fragments' cache keys), so that a restarted node's jobs never reuse ids its peers knew.
  const auto ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  st.engine = std::make_unique<job_engine>(ctx->self_id, device_profile{ctx->self_id.to_string(), own.gflops, own.mem_gbps, 1.0,
                                                                        static_cast<int64_t>(own.memory_bytes)},
                                           (ms & ((uint64_t{1} << 40) - 1)) << 8);
  st.trainer = std::make_unique<train_engine>(ctx->self_id);
  if (ctx->cfg.shared_memory) st.trainer->set_shared_memory(train_engine::host_shared_memory());
  // MESH_HOST_REDUCE=off: members on one host still pass their pieces around the ring through
  // shared memory, never reduce through every member's region (docs/training.md).
  if (const char* v = std::getenv("MESH_HOST_REDUCE"); v && std::string_view(v) == "off") st.trainer->set_host_reduce(false);
  // MESH_HOST_IMPORT=off: the devices do not import those regions (region_import.hpp).
  if (const char* v = std::getenv("MESH_HOST_IMPORT"); v && std::string_view(v) == "off") st.trainer->set_host_import(false);
  if (const char* v = std::getenv("MESH_COPY_OVERLAP"); v && std::string_view(v) == "off") st.trainer->set_copy_overlap(false);
  if (const unsigned threads = gpu::copy_threads(); threads > 1) {
    st.ring_threads = std::make_shared<gpu::thread_pool>(threads);
    st.trainer->set_parallel([pool = st.ring_threads](int64_t parts, const std::function<void(int64_t)>& part) { pool->run(parts, part); });
  }
  // A run's data file: read where it is on the node that offers it, fetched chunk by chunk
  // from that node elsewhere (actors/blob_transfer.hpp, remote_file).
  st.trainer->set_data_opener([ctx](const node_id& holder, const msg::train_text_data& text) -> expected<models::byte_source> {
    if (holder == ctx->self_id) return models::file_source(text.path);
    if (!ctx->blobs || !ctx->fetcher)
      return make_error(error_code::io_error, "node " + ctx->self_id.short_string() + " has no blob cache to fetch the training data into");
    return models::byte_source(blobs::remote_file(ctx->fetcher, ctx->blobs, holder, {text.file.id, text.file.size, text.file.chunk_list}));
  });
  self->send(self, tick_atom::value);
  return {
      [=](wire_atom, actors_ptr a) { self->state.a = *a; },
      [=](tick_atom) {  // time-driven decisions: a lost client's grace time, held messages' age
        const auto now = std::chrono::steady_clock::now();
        if (const size_t n = self->state.held.expire(now))
          spdlog::info("dropped {} messages that waited over {} s for peers that did not connect", n,
                       std::chrono::duration_cast<std::chrono::seconds>(self->state.held.ttl()).count());
        dispatch(self, *ctx, self->state.trainer->tick(now));
        dispatch(self, *ctx, self->state.engine->tick(now));
        run_ready(self);               // a re-plan may have given this node a stage
        report_refused(self, *ctx);  // nodes left out or benched for missing a deadline
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
      },
      [=](executor_atom, caf::actor ex, int restarts) {
        auto& s = self->state;
        s.executor = ex;
        // Work the old executor had in hand is handed to the new one, not lost.
        for (auto& [key, task] : s.in_flight) self->send(ex, run_atom::value, task);
        // Training state lived on the lost device: this node leaves its runs, and the
        // coordinators set it up again from the current state.
        if (restarts > 0) {
          s.trainer->executor_restarted();
          auto lost = std::move(s.train_in_flight);
          s.train_in_flight.clear();
          for (auto& [key, task] : lost)
            dispatch(self, *ctx, s.trainer->on_executed(*task, make_error(error_code::device, "the device was lost during the step"), std::chrono::steady_clock::now()));
        }
      },
      [=](inbound_atom, node_id from, message_ptr m) {
        if (auto* o = std::get_if<msg::open_training>(m.get()); o && o->spec.text.size() == 1) {
          offer_data(self, ctx, from, *o);
          return;
        }
        dispatch(self, *ctx, self->state.engine->on_message(from, *m, std::chrono::steady_clock::now()));
        dispatch(self, *ctx, self->state.trainer->on_message(from, *m, std::chrono::steady_clock::now()));
        report_refused(self, *ctx);
        run_ready(self);
      },
      [=](up_atom, node_id id, message_ptr m) {
        self->state.held.flush(id, [&](const msg::message& x) { return try_send_peer(*ctx, id, x); });
        const auto& h = std::get<msg::hello>(*m);
        self->state.engine->peer_up(id, {id.to_string(), h.gflops, h.mem_gbps, 1.0, static_cast<int64_t>(h.memory_bytes)});
        self->state.trainer->peer_up(id);
      },
      [=](down_atom, node_id id, std::string) {
        self->state.held.take(id);  // it will not come back for them
        dispatch(self, *ctx, self->state.engine->peer_dead(id, std::chrono::steady_clock::now()));
        dispatch(self, *ctx, self->state.trainer->peer_dead(id, std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](done_atom, std::shared_ptr<stage_task> t, std::shared_ptr<expected<tensor_map>> r) {
        if (!self->state.in_flight.erase(t.get())) return;  // already handed to a restarted executor
        dispatch(self, *ctx, self->state.engine->on_executed(*t, *r, std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](done_atom, std::shared_ptr<train_task> t, std::shared_ptr<expected<train_work_result>> r) {
        if (!self->state.train_in_flight.erase(t.get())) return;  // given up when the executor restarted
        dispatch(self, *ctx, self->state.trainer->on_executed(*t, std::move(*r), std::chrono::steady_clock::now()));
        run_ready(self);
      },
      [=](view_atom) {
        const auto now = std::chrono::steady_clock::now();
        auto jobs = self->state.engine->jobs(now);
        for (auto& j : self->state.trainer->jobs(now)) jobs.push_back(std::move(j));
        return std::make_shared<const std::vector<msg::job_status>>(std::move(jobs));
      },
      [=](curves_atom) {
        return std::make_shared<const loss_curves>(self->state.trainer->curves());
      },
      // A run's data file is hashed and offered: the run opens now (or fails, saying why).
      [=](offered_atom, node_id client, message_ptr m, std::string failure) {
        if (!failure.empty()) {
          msg::job_result r;
          r.job = std::get<msg::open_training>(*m).train;
          r.code = error_code::invalid_argument;
          r.error = "training refused: " + failure;
          send_to(self, *ctx, client, r);
          return;
        }
        dispatch(self, *ctx, self->state.trainer->on_message(client, *m, std::chrono::steady_clock::now()));
        report_refused(self, *ctx);
        run_ready(self);
      },
      [=](stop_atom) { self->quit(); },
  };
}

}  // namespace

caf::actor spawn_jobs(caf::local_actor& parent, context_ptr ctx) {
  return parent.spawn<caf::monitored>(jobs_actor, std::move(ctx));
}

}  // namespace mesh::node_shell
