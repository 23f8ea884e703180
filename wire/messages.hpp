#pragma once
/// The messages nodes (and clients) exchange: plain structs, each with a fields() overload that
/// gives its layout on the wire (wire/codec.hpp).
///
/// On the wire a message is the protocol version (u16), one kind byte and the struct. Decoding
/// (decode_message) refuses another protocol version, bounds the memory it allocates, and checks
/// every tensor and enum, so a hostile peer gets an error back and the node keeps running.
/// Graphs travel inside as graph_payload (wire/graph_payload.hpp): WireGraph bytes on the wire,
/// decoded and validated against the receiver's graph_limits while the message is decoded, so
/// engines receive checked graphs (or the error to answer with), never bytes.
///
/// The training messages are in wire/messages_training.hpp, those of generation, served models
/// and checkpoint fetches in wire/messages_serving.hpp; this header includes both and holds the
/// rest (membership, jobs, status) and the message set.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"
#include "graph/tensor.hpp"
#include "graph/planner.hpp"
#include "wire/graph_codec.hpp"
#include "wire/graph_payload.hpp"
#include "wire/states.hpp"
#include "wire/takeover_grant.hpp"

namespace mesh::msg {

/// Bumped on any change to these messages or to what peers exchange beside them (20: relayed
/// boxes carry a session and a sequence number; 26: the host all-reduce's shares and sum areas
/// start 64-byte aligned in the shared regions, a layout every member computes alike). Peers of another version are not admitted (the
/// transport's admission compares versions), and every message carries it as well: a message
/// of another version is refused by decode_message.
inline constexpr uint16_t protocol_version = 26;

/// Encoded messages up to this size travel on a peer's control stream; larger ones (tensors,
/// fragments) on a bulk stream of their own (a retransmission of one holds up no other's). The
/// receiver gets both in the order sent (transport/ordered_inbox.hpp).
inline constexpr size_t max_control_message = 64 << 10;

using mesh::named_tensor;

/// First message on a new connection: who I am and what my device can do (measured at start).
struct hello {
  uint64_t incarnation = 0;  ///< start time of this process: a restarted node has a higher one
  std::string device_name;
  device_kind device = device_kind::other;
  double gflops = 0;        ///< measured by a micro-benchmark at start
  double mem_gbps = 0;
  uint64_t memory_bytes = 0;
  bool is_client = false;   ///< a client program or meshctl, not a worker
  /// The sender has not received the receiver's hello (it can be lost when two nodes dial each
  /// other at once and a message went out on the connection that was then dropped as the
  /// duplicate): the receiver answers with its own hello.
  bool answer_me = false;
  bool operator==(const hello&) const = default;
};

struct heartbeat {
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  uint32_t running_stages = 0;  ///< load, shown by meshctl
  /// Device memory the sender has free now (gpu/memory_probe.hpp): split plans share layers by it.
  uint64_t free_memory_bytes = 0;
  bool operator==(const heartbeat&) const = default;
};

/// Client -> any node: run this graph (with its inputs and parameters) over the mesh and send me
/// the outputs.
struct submit_job {
  uint64_t job = 0;  ///< chosen by the client, unique per client
  graph_payload graph;  ///< the graph, its inputs and parameters
  mesh::strategy how = mesh::strategy::pipeline;
  bool operator==(const submit_job&) const = default;
};

/// Node -> client: a job's outcome.
struct job_result {
  uint64_t job = 0;
  bool ok = false;
  std::string error;  ///< a sentence a person can act on, when !ok
  std::vector<named_tensor> outputs;
  uint32_t attempts = 0;  ///< > 1 when the job was re-planned after a node died
  std::vector<node_id> workers;  ///< nodes that ran a stage (last attempt)
  mesh::strategy ran_as = mesh::strategy::pipeline;  ///< the plan of a one-shot job
  /// Trainings: the step the run reached (the client takes it from here, not from its options:
  /// a run resumed on another node may have redone steps).
  uint64_t step = 0;
  error_code code = error_code::internal;  ///< what kind of failure, when !ok
  bool operator==(const job_result&) const = default;
};

/// Node -> client: a stage of a one-shot job finished.
struct job_progress {
  uint64_t job = 0;          ///< the client's job id
  uint32_t attempt = 0;      ///< > 1 after a re-plan (counts restart from 0)
  uint32_t stages_done = 0;
  uint32_t stages = 0;       ///< stages of this attempt
  node_id worker;            ///< the node that ran the stage
  bool operator==(const job_progress&) const = default;
};

/// Where a stage sends one of its cut outputs.
struct route {
  std::string value;  ///< cut name, e.g. "cut.12"
  node_id to;         ///< the consumer's node
  uint32_t stage = 0; ///< the consuming stage (one node may run several stages of a job)
  bool operator==(const route&) const = default;
};

/// A value crossing a cut that a stage waits for, and the node that sends it: the node of the
/// stage that produces it. An activation from any other node is refused.
struct awaited_value {
  std::string name;  ///< cut name, e.g. "cut.12"
  node_id from;
  bool operator==(const awaited_value&) const = default;
};

/// Coordinator -> worker: run one stage of a job (the fragment, with its parameters and any job
/// inputs it reads), waiting for `awaited` activations from other stages. For inference
/// sessions, `cache` names a fragment the worker keeps (parameters resident on its device): the
/// first call carries `fragment`, later calls leave it empty and bring only `inputs`.
struct run_stage {
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  node_id coordinator;
  graph_payload fragment;  ///< with its parameters and inputs; empty for a cached session fragment
  std::vector<awaited_value> awaited;  ///< values that arrive as activations, and from where
  std::vector<route> routes;
  uint64_t cache = 0;                ///< 0: one-shot; else the cached fragment's key
  std::vector<named_tensor> inputs;  ///< job inputs of this stage, when not inside `fragment`
  bool operator==(const run_stage&) const = default;
};

/// Client -> node: load a model (graph + parameters) across a pipeline of
/// peers once, for repeated `infer` calls. Answered by a job_result with job = session.
struct open_session {
  uint64_t session = 0;
  graph_payload model;  ///< the graph and its parameters
  bool operator==(const open_session&) const = default;
};

/// Client -> node: one call of an open session; answered by a job_result with job = call.
struct infer {
  uint64_t session = 0;
  uint64_t call = 0;
  std::vector<named_tensor> inputs;
  bool operator==(const infer&) const = default;
};

struct close_session {
  uint64_t session = 0;
  bool operator==(const close_session&) const = default;
};

/// Node -> newly joined worker: the other members I know and where (discovery's PEX wire form,
/// discovery/peer_exchange.hpp), so meshes converge from one static peer.
struct peer_exchange {
  std::vector<uint8_t> pex;
  bool operator==(const peer_exchange&) const = default;
};

/// Worker -> worker: a value crossing a cut, sent directly to the stage that needs it.
struct activation {
  node_id coordinator;
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;  ///< the stage that consumes it
  named_tensor value;
  bool operator==(const activation&) const = default;
};

/// Worker -> coordinator: a stage finished (its graph outputs included) or failed.
struct stage_done {
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  bool ok = false;
  std::string error;
  std::vector<named_tensor> outputs;
  error_code code = error_code::internal;  ///< what kind of failure, when !ok
  bool operator==(const stage_done&) const = default;
};

/// Coordinator -> worker: the stages of `job` up to `attempt` will not be collected (the job
/// ended without them, or was re-planned): forget what waits for them.
struct cancel_stages {
  uint64_t job = 0;
  uint32_t attempt = 0;
  bool operator==(const cancel_stages&) const = default;
};

/// Consumer -> coordinator: stage `stage` of `job` (this attempt) is set up here and waits for
/// its activations. Producers send activations only after the coordinator relays this as a
/// route_open, so an activation never reaches a node before the stage it feeds: the two senders
/// of a stage (the coordinator and its producers) are ordered through the coordinator.
struct stage_accepted {
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  bool operator==(const stage_accepted&) const = default;
};

/// Coordinator -> producer: the consumer of stage `to_stage` accepted its stage; stage `stage`
/// (run by the receiver) may send it the values routed there.
struct route_open {
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  uint32_t to_stage = 0;
  bool operator==(const route_open&) const = default;
};

struct status_request {
  uint64_t id = 0;
  bool operator==(const status_request&) const = default;
};

struct peer_status {
  node_id node;
  peer_health health = peer_health::unknown;
  std::string address;
  std::string device;
  double gflops = 0;
  uint32_t running_stages = 0;
  uint64_t memory_bytes = 0;       ///< its device memory (its hello)
  uint64_t free_memory_bytes = 0;  ///< of which free at its latest heartbeat
  double rtt_ms = 0;
  uint64_t packets_lost = 0;  ///< by this node's connection to the peer (transport::peer_stats)
  bool relayed = false;       ///< the connection goes through a relay
  /// Messages from the peer this node refused (another protocol version, past the decode budget,
  /// malformed), and why it refused the last one.
  uint64_t refused = 0;
  std::string last_refusal;
  bool operator==(const peer_status&) const = default;
};

struct job_status {
  uint64_t job = 0;
  node_id client;
  job_state state = job_state::planning;
  uint32_t stages = 0;
  uint32_t attempts = 0;
  double seconds = 0;
  job_kind kind = job_kind::pipeline;
  uint64_t step = 0, steps = 0;  ///< trainings: steps done of steps
  bool operator==(const job_status&) const = default;
};

struct status_reply {
  uint64_t id = 0;
  node_id node;
  std::string device;
  double gflops = 0;
  uint64_t memory_bytes = 0;       ///< its device memory
  uint64_t free_memory_bytes = 0;  ///< of which free now
  double uptime_s = 0;
  std::vector<peer_status> peers;
  std::vector<job_status> jobs;
  bool operator==(const status_reply&) const = default;
};

}  // namespace mesh::msg

#include "wire/messages_serving.hpp"
#include "wire/messages_training.hpp"

namespace mesh::msg {

/// Any message, as decoded.
using message = std::variant<hello, heartbeat, submit_job, job_result, run_stage, activation, stage_done,
                             status_request, status_reply, open_session, infer, close_session, peer_exchange,
                             open_training, train_setup, train_step, allreduce_piece, train_reduced, train_state,
                             train_progress, job_progress, train_resume, train_checkpoint, cancel_stages,
                             stage_accepted, route_open, train_ready, ring_go, generate_request, generate_piece,
                             generate_done, generate_cancel, models_request, models_reply, stage_open, stage_step,
                             stage_close, stage_reply, blob_get, blob_chunk, shared_region_offer, shared_region_answer,
                             allreduce_piece_shared, host_reduce_mark>;

/// Protocol version, kind byte, body. Fails only for a list longer than 2^32 elements.
expected<std::vector<uint8_t>> encode_message(const message& m);

/// What a decoder may allocate for one message (wire/codec.hpp's decode_budget caps it further by
/// the message's size). A node passes its per-peer receive budget.
inline constexpr size_t default_decode_budget = size_t{4} << 30;

/// Parses and checks one message from a peer. Errors (the message kind and the problem):
/// version_mismatch for another protocol version, limit_exceeded when decoding would allocate
/// more than `budget` or a fixed multiple of the message size, decode_error for malformed bytes
/// or an enum out of range, and tensor::check()'s errors.
/// Graphs inside (graph_payload) are validated against `limits` (null: graph_limits{}).
expected<message> decode_message(const uint8_t* data, size_t size, size_t budget = default_decode_budget,
                                 const graph_limits* limits = nullptr);

/// "run_stage" etc., for logs.
const char* kind_name(const message& m);

// ---- the field order of each message on the wire (wire/codec.hpp) ----

template <class F>
void fields(F& f, hello& x) {
  f(x.incarnation, x.device_name, x.device, x.gflops, x.mem_gbps, x.memory_bytes, x.is_client, x.answer_me);
}

template <class F>
void fields(F& f, heartbeat& x) {
  f(x.incarnation, x.seq, x.running_stages, x.free_memory_bytes);
}

template <class F>
void fields(F& f, submit_job& x) {
  f(x.job, x.graph, x.how);
}

template <class F>
void fields(F& f, job_result& x) {
  f(x.job, x.ok, x.error, x.outputs, x.attempts, x.workers, x.ran_as, x.step, x.code);
}

template <class F>
void fields(F& f, job_progress& x) {
  f(x.job, x.attempt, x.stages_done, x.stages, x.worker);
}

template <class F>
void fields(F& f, route& x) {
  f(x.value, x.to, x.stage);
}

template <class F>
void fields(F& f, awaited_value& x) {
  f(x.name, x.from);
}

template <class F>
void fields(F& f, run_stage& x) {
  f(x.job, x.attempt, x.stage, x.coordinator, x.fragment, x.awaited, x.routes, x.cache, x.inputs);
}

template <class F>
void fields(F& f, activation& x) {
  f(x.coordinator, x.job, x.attempt, x.stage, x.value);
}

template <class F>
void fields(F& f, stage_done& x) {
  f(x.job, x.attempt, x.stage, x.ok, x.error, x.outputs, x.code);
}

template <class F>
void fields(F& f, stage_accepted& x) {
  f(x.job, x.attempt, x.stage);
}

template <class F>
void fields(F& f, route_open& x) {
  f(x.job, x.attempt, x.stage, x.to_stage);
}

template <class F>
void fields(F& f, cancel_stages& x) {
  f(x.job, x.attempt);
}

template <class F>
void fields(F& f, status_request& x) {
  f(x.id);
}

template <class F>
void fields(F& f, peer_status& x) {
  f(x.node, x.health, x.address, x.device, x.gflops, x.running_stages, x.memory_bytes, x.free_memory_bytes, x.rtt_ms, x.packets_lost, x.relayed, x.refused, x.last_refusal);
}

template <class F>
void fields(F& f, job_status& x) {
  f(x.job, x.client, x.state, x.stages, x.attempts, x.seconds, x.kind, x.step, x.steps);
}

template <class F>
void fields(F& f, status_reply& x) {
  f(x.id, x.node, x.device, x.gflops, x.memory_bytes, x.free_memory_bytes, x.uptime_s, x.peers, x.jobs);
}

template <class F>
void fields(F& f, open_session& x) {
  f(x.session, x.model);
}

template <class F>
void fields(F& f, infer& x) {
  f(x.session, x.call, x.inputs);
}

template <class F>
void fields(F& f, close_session& x) {
  f(x.session);
}

template <class F>
void fields(F& f, peer_exchange& x) {
  f(x.pex);
}

}  // namespace mesh::msg
