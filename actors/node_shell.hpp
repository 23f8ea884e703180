#pragma once
// Internal to the node's actors (actors/node.cpp, node_shell.cpp and the *_actor.cpp files;
// nobody else: it includes CAF, which actors/node.hpp keeps from the rest of the project). What
// those actors share: the node's context and the handles of its actors, the types and atoms of
// their messages, sending to a peer, and how each actor is spawned.
//
// The node's long-lived actors, one file each:
//
// bridge      endpoint events in: decodes every message and routes it to the actor that owns it
// membership  who is in the mesh (hellos), peer exchange; tells health and jobs who came and went
// health      heartbeats in and out, phi-accrual; a Dead peer is disconnected and reported
// jobs        the job coordinators and workers (job_engine) and training (train_engine); runs
//             stages on the executor
// status      answers status requests from the views of membership, health and jobs
// generator   clients' generate requests: text generation from checkpoints on a thread of its
//             own (generation_worker.hpp)
// executor    owns the device; runs one stage (or training task) at a time
// supervisor  starts them all; restarts the executor and status within a budget
//
// They refer to each other, so the supervisor spawns them all and then sends each the handles.
#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/blob_transfer.hpp"
#include "actors/free_memory.hpp"
#include "actors/health.hpp"
#include "actors/job_engine.hpp"
#include "actors/node.hpp"
#include "actors/refusal_log.hpp"
#include "actors/train_engine.hpp"
#include "gpu/executor.hpp"
#include "serving/local_backend.hpp"
#include "serving/mesh_view.hpp"
#include "transport/endpoint.hpp"
#include "wire/messages.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_id)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::stage_task>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::expected<mesh::tensor_map>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::msg::message>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::train_task>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::expected<mesh::train_work_result>>)

// Types that travel between the node's actors inside this process (never on the wire).
namespace mesh::node_shell {

/// The latest view of the mesh for the HTTP side (dashboard, metrics): the status actor
/// refreshes it every second, HTTP threads read it without touching the actors.
class mesh_board {
 public:
  void put(serving::mesh_snapshot s) {
    std::lock_guard<std::mutex> lock(m_);
    snap_ = std::move(s);
  }
  serving::mesh_snapshot get() const {
    std::lock_guard<std::mutex> lock(m_);
    return snap_;
  }

 private:
  mutable std::mutex m_;
  serving::mesh_snapshot snap_;
};

/// What every actor of the node needs to know about it; fixed for the node's lifetime.
struct node_context {
  transport::endpoint* ep = nullptr;
  node_id self_id;
  msg::hello own;
  node_config cfg;
  mono_time started{};
  std::shared_ptr<refusal_log> refusals = std::make_shared<refusal_log>();
  /// The node's model host (generation for meshctl and the HTTP API); outlives the actors.
  serving::local_backend* models = nullptr;
  std::string api_url;  ///< where the HTTP API listens ("" without one)
  std::shared_ptr<mesh_board> board = std::make_shared<mesh_board>();
  /// Free device memory: this node's (its probe) and each peer's latest heartbeat's. Never null.
  std::shared_ptr<generation::free_memory> memory = std::make_shared<generation::free_memory>(node_id{}, nullptr);
  /// Files this node offers its peers by digest (split models' checkpoints, training data), the
  /// fetches of peers' files, and the cache they land in (null when its directory cannot be
  /// made: then nothing is fetched). The generator answers blob_get and delivers blob_chunk.
  std::shared_ptr<blobs::blob_offers> offers;
  std::shared_ptr<blobs::blob_fetcher> fetcher;
  std::shared_ptr<blobs::blob_store> blobs;
};
using context_ptr = std::shared_ptr<const node_context>;

struct node_actors {
  caf::actor bridge, membership, health, jobs, status, generator;
};
using actors_ptr = std::shared_ptr<const node_actors>;

using member_map = std::map<node_id, msg::hello>;  ///< peers that said hello, clients included
using members_ptr = std::shared_ptr<const member_map>;

struct peer_vitals {
  peer_health health = peer_health::unknown;
  uint32_t running_stages = 0;
};
using vitals_map = std::map<node_id, peer_vitals>;
using vitals_ptr = std::shared_ptr<const vitals_map>;

}  // namespace mesh::node_shell

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::transport::delivery_receipt>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_shell::actors_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_shell::members_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mesh::node_shell::vitals_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const std::vector<mesh::msg::job_status>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const mesh::loss_curves>)

namespace mesh::node_shell {

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using up_atom = caf::atom_constant<caf::atom("up")>;
using down_atom = caf::atom_constant<caf::atom("down")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using executor_atom = caf::atom_constant<caf::atom("executor")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using add_atom = caf::atom_constant<caf::atom("add")>;
using remove_atom = caf::atom_constant<caf::atom("remove")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using view_atom = caf::atom_constant<caf::atom("view")>;
using greet_atom = caf::atom_constant<caf::atom("greet")>;
using forget_atom = caf::atom_constant<caf::atom("forget")>;
using curves_atom = caf::atom_constant<caf::atom("curves")>;  ///< jobs: the loss curves of its runs
using offered_atom = caf::atom_constant<caf::atom("offered")>;  ///< jobs: a run's data file is hashed

/// A decoded message from a peer, as the bridge hands it to the actor that owns it. It keeps its
/// delivery receipt (transport/delivery_receipt.hpp): the bytes it came in count against its
/// sender's receive budget until the owning actor has handled it and the last copy of the
/// pointer is gone, so a member cannot fill the actors' mailboxes past that budget.
using message_ptr = std::shared_ptr<msg::message>;
/// The receipt of a message on its way from the endpoint to the bridge.
using receipt_ptr = std::shared_ptr<transport::delivery_receipt>;

/// The device measured at start, handed to the first executor so the node opens it once; a
/// restarted executor opens a fresh one (the slot is empty by then).
using device_slot = std::shared_ptr<std::unique_ptr<gpu::executor>>;

/// Endpoint events that came before the bridge existed, replayed to it once it does (run_node).
using early_events = std::shared_ptr<std::vector<std::function<void(const caf::actor&)>>>;

inline mono_time now_mono() { return std::chrono::steady_clock::now().time_since_epoch(); }

/// The announced addresses (mDNS, peer exchange) as "host:port", those the endpoint's socket can
/// reach only: mDNS also reports a peer's IPv6 addresses to an IPv4-only node, and each dial of
/// one was a failure and a warning on every start.
std::vector<std::string> reachable(const transport::endpoint& ep, const std::vector<std::string>& addresses, uint16_t port);

/// Sends `m` to a peer (not to this node). The endpoint is thread-safe: any actor may send.
/// False when the peer is not connected (nothing was sent); other failures are logged.
bool try_send_peer(const node_context& ctx, const node_id& to, const msg::message& m);

/// try_send_peer, with a warning when the peer is not connected.
void send_peer(const node_context& ctx, const node_id& to, const msg::message& m);

/// The device this node offers, made once at start (the executor actor re-creates it on restart).
expected<std::unique_ptr<gpu::executor>> make_device(const std::string& choice);

// Spawning the node's actors. Each actor's state and behaviour stay in its own file; the
// children are spawned by `parent` (the supervisor), which monitors them.

/// executor_actor.cpp: detached (device work blocks its thread); reports to `jobs`.
caf::actor spawn_executor(caf::local_actor& parent, std::string choice, caf::actor jobs, device_slot first);
caf::actor spawn_bridge(caf::local_actor& parent, context_ptr ctx);      ///< bridge_actor.cpp
caf::actor spawn_membership(caf::local_actor& parent, context_ptr ctx);  ///< membership_actor.cpp
caf::actor spawn_health(caf::local_actor& parent, context_ptr ctx);      ///< health_actor.cpp
caf::actor spawn_jobs(caf::local_actor& parent, context_ptr ctx);        ///< jobs_actor.cpp
caf::actor spawn_status(caf::local_actor& parent, context_ptr ctx);      ///< status_actor.cpp
caf::actor spawn_generator(caf::local_actor& parent, context_ptr ctx);   ///< generator_actor.cpp

/// Where the endpoint's I/O thread posts its events (under the bridge mutex): every event to the
/// bridge, except heartbeat datagrams, which go straight to the health actor, so that they never
/// wait in the bridge's mailbox behind the decoding of a large message.
struct inbound_slots {
  caf::actor bridge;
  caf::actor health;
};

/// supervisor_actor.cpp: the node's root actor. It installs the bridge and the health actor in
/// `slots` (under `bridge_mutex`) and replays `early` to the bridge.
caf::actor spawn_supervisor(caf::actor_system& sys, context_ptr ctx, std::shared_ptr<std::mutex> bridge_mutex,
                            std::shared_ptr<inbound_slots> slots, early_events early, device_slot first_device);

}  // namespace mesh::node_shell
