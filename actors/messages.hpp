#pragma once
/// The messages nodes (and clients) exchange, as plain structs with CAF `inspect` overloads.
///
/// On the wire a message is one kind byte followed by the struct in CAF's binary format; decoding
/// goes through mesh::bounded_deserializer and then checks every tensor (see decode_message), so a
/// hostile peer gets an error back and the node keeps running. Graphs travel inside as WireGraph
/// bytes and are decoded (= validated) only by the node that runs them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "graph/error.hpp"
#include "graph/tensor.hpp"
#include "graph/wire_inspect.hpp"

namespace mesh::msg {

/// Bumped on any change to these messages; peers of another version are not admitted.
inline constexpr uint32_t protocol_version = 7;

/// Encoded messages up to this size travel, in order, on a peer's control stream; larger ones
/// (tensors, fragments) on a bulk stream of their own, so they never delay small messages.
inline constexpr size_t max_control_message = 64 << 10;

using mesh::named_tensor;

/// First message on a new connection: who I am and what my device can do (measured at start).
struct hello {
  uint64_t incarnation = 0;  ///< start time of this process: a restarted node has a higher one
  std::string device_name;
  std::string device_kind;  ///< "discrete", "integrated", "virtual", "cpu"
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
  bool operator==(const heartbeat&) const = default;
};

/// Client -> any node: run this graph (WireGraph bytes carrying the graph, inputs and
/// parameters) over the mesh and send me the outputs.
struct submit_job {
  uint64_t job = 0;  ///< chosen by the client, unique per client
  std::vector<char> wire;
  uint8_t strategy = 0;  ///< mesh::strategy
  bool operator==(const submit_job&) const = default;
};

/// Node -> client: a job's outcome.
struct job_result {
  uint64_t job = 0;
  bool ok = false;
  std::string error;  ///< a sentence a person can act on, when !ok
  std::vector<named_tensor> outputs;
  uint32_t attempts = 0;  ///< > 1 when the job was re-planned after a node died
  std::vector<std::string> workers;  ///< node ids that ran a stage (last attempt)
  uint8_t strategy = 0;              ///< mesh::strategy the job ran with (one-shot jobs)
  /// Trainings: the step the run reached (the client takes it from here, not from its options,
  /// nor from the last progress report, which travels on another stream and may come later).
  uint64_t step = 0;
  bool operator==(const job_result&) const = default;
};

/// Node -> client: a stage of a one-shot job finished.
struct job_progress {
  uint64_t job = 0;          ///< the client's job id
  uint32_t attempt = 0;      ///< > 1 after a re-plan (counts restart from 0)
  uint32_t stages_done = 0;
  uint32_t stages = 0;       ///< stages of this attempt
  std::string worker;        ///< node id that ran the stage
  bool operator==(const job_progress&) const = default;
};

/// Where a stage sends one of its cut outputs.
struct route {
  std::string value;  ///< cut name, e.g. "cut.12"
  std::string to;     ///< node id (hex) of the consumer
  uint32_t stage = 0; ///< the consuming stage (one node may run several stages of a job)
  bool operator==(const route&) const = default;
};

/// Coordinator -> worker: run one stage of a job (the fragment, with its parameters and any job
/// inputs it reads, as WireGraph bytes), waiting for `awaited` activations from other stages.
/// For inference sessions, `cache` names a fragment the worker keeps (parameters resident on its
/// device): the first call carries `wire`, later calls leave it empty and bring only `inputs`.
struct run_stage {
  uint64_t job = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  std::string coordinator;  ///< node id (hex)
  std::vector<char> wire;
  std::vector<std::string> awaited;  ///< cut names that arrive as activations
  std::vector<route> routes;
  uint64_t cache = 0;                ///< 0: one-shot; else the cached fragment's key
  std::vector<named_tensor> inputs;  ///< job inputs of this stage, when not inside `wire`
  bool operator==(const run_stage&) const = default;
};

/// Client -> node: load a model (graph + parameters, as WireGraph bytes) across a pipeline of
/// peers once, for repeated `infer` calls. Answered by a job_result with job = session.
struct open_session {
  uint64_t session = 0;
  std::vector<char> wire;
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
  std::string coordinator;
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
  bool operator==(const stage_done&) const = default;
};

/// Coordinator -> worker: the stages of `job` up to `attempt` will not be collected (the job
/// ended without them, or was re-planned): forget what waits for them.
struct cancel_stages {
  uint64_t job = 0;
  uint32_t attempt = 0;
  bool operator==(const cancel_stages&) const = default;
};

struct status_request {
  uint64_t id = 0;
  bool operator==(const status_request&) const = default;
};

struct peer_status {
  std::string node;
  std::string health;  ///< healthy / suspect / dead
  std::string address;
  std::string device;
  double gflops = 0;
  uint32_t running_stages = 0;
  double rtt_ms = 0;
  uint64_t packets_lost = 0;  ///< by this node's connection to the peer (transport::peer_stats)
  bool relayed = false;       ///< the connection goes through a relay
  bool operator==(const peer_status&) const = default;
};

struct job_status {
  uint64_t job = 0;
  std::string client;
  std::string state;  ///< planning / running / done / failed
  uint32_t stages = 0;
  uint32_t attempts = 0;
  double seconds = 0;
  std::string kind;  ///< "pipeline", "data_parallel", "tensor_parallel", "training"
  bool operator==(const job_status&) const = default;
};

struct status_reply {
  uint64_t id = 0;
  std::string node;
  std::string device;
  double gflops = 0;
  double uptime_s = 0;
  std::vector<peer_status> peers;
  std::vector<job_status> jobs;
  bool operator==(const status_reply&) const = default;
};


// ---- training (see actors/train_engine.hpp) ----

/// Everything a worker needs to train: the step graphs (WireGraph bytes, no tensors inside),
/// the state (initial values of every parameter they name), the dataset and the schedule.
///
/// Graphs: `grad_wire` maps one micro-batch (inputs named like the dataset's columns, first
/// dimension `micro_batch`) to outputs "loss" (f32 scalar, a mean over the micro-batch) and
/// "grad.<p>" per trained parameter; `apply_wire` takes inputs "grad.<p>" and "scale" (f32
/// scalar: the gradients are sums over micro-batches, scale turns them into a mean) and updates
/// the parameters and optimizer state. DiLoCo adds `delta_wire` (outputs "delta.<p>" = outer copy
/// minus local parameter) and `outer_wire` (inputs "delta.<p>" summed over workers and "scale";
/// Nesterov step on the outer copy, local parameters reset to it).
struct train_spec {
  uint8_t method = 0;            ///< 0 = data parallel, 1 = DiLoCo
  uint64_t start_step = 0;       ///< the step `state` is at (0, or a resumed checkpoint's step)
  uint64_t steps = 0;            ///< train until this step (inner steps for DiLoCo)
  uint32_t micro_batches = 1;    ///< micro-batches per step, over all workers together
  uint32_t micro_batch = 1;      ///< rows per micro-batch
  uint32_t inner_steps = 1;      ///< DiLoCo: local steps between averaging rounds
  uint8_t compression = 0;       ///< mesh::wire_format of the all-reduce
  uint64_t seed = 0;             ///< data order
  std::vector<char> grad_wire, apply_wire, delta_wire, outer_wire;
  std::vector<named_tensor> state;
  std::vector<named_tensor> dataset;  ///< columns; dimension 0 = examples
  /// Rows of the whole dataset. Set by the coordinator in setups, whose dataset columns carry no
  /// rows (the shards come with the steps: actors/train_data.hpp); 0 in a client's spec.
  uint64_t dataset_rows = 0;
  /// > 0: the coordinator sends the client the state every this many steps (train_checkpoint),
  /// so a run can be resumed from there even if every node and the client stop.
  uint64_t checkpoint_every = 0;
  bool operator==(const train_spec&) const = default;
};

/// Client -> node: train. The node coordinates; progress comes back as train_progress, the end
/// as a job_result (job = train) whose outputs are the final state (parameters and optimizer).
struct open_training {
  uint64_t train = 0;
  train_spec spec;
  bool operator==(const open_training&) const = default;
};

/// Coordinator -> worker: join training `train` (graphs with parameters renamed for this run;
/// `spec.state` is the state after step spec.start_step - 1 was applied).
struct train_setup {
  uint64_t train = 0;
  train_spec spec;
  std::string client;         ///< the client that opened the run (may ask a worker to take it over)
  uint64_t client_train = 0;  ///< the client's id of the run
  bool operator==(const train_setup&) const = default;
};

/// The rows of one dataset shard (actors/train_data.hpp, shard_plan), columns as in the dataset.
struct train_shard {
  uint32_t index = 0;
  std::vector<named_tensor> columns;
  bool operator==(const train_shard&) const = default;
};

/// Coordinator -> worker: first apply the held result of step `commit - 1` (commit = 0: none;
/// a step already applied is not applied again), then compute step `step` over micro-batches
/// `micro` and all-reduce it around `ring` (empty ring: no work). `report_state`: send the state
/// back after the commit; `stop`: the run is over, free it.
struct train_step {
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  std::vector<std::string> ring;
  std::vector<uint64_t> micro;
  uint64_t commit = 0;
  bool report_state = false;
  bool stop = false;
  std::vector<train_shard> shards;  ///< dataset shards `micro` needs that the worker has not got yet
  bool operator==(const train_step&) const = default;
};

/// Worker -> next worker in the ring: one piece of an all-reduce round.
struct allreduce_piece {
  uint64_t train = 0;
  std::string coordinator;
  uint64_t round = 0;
  uint32_t ring_step = 0;
  uint32_t piece = 0;
  std::vector<uint8_t> payload;
  bool operator==(const allreduce_piece&) const = default;
};

/// Worker -> coordinator: step `step` is reduced and held (or failed).
struct train_reduced {
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool ok = false;
  std::string error;
  double loss = 0;          ///< mean loss of the step over all workers
  uint64_t bytes_sent = 0;  ///< by this worker in the round
  bool operator==(const train_reduced&) const = default;
};

/// Worker -> coordinator: the full state after applying step `step - 1`.
struct train_state {
  uint64_t train = 0;
  uint64_t step = 0;
  std::vector<named_tensor> state;
  bool operator==(const train_state&) const = default;
};

/// Node -> client: one finished step.
struct train_progress {
  uint64_t train = 0;
  uint64_t step = 0;  ///< steps done
  uint64_t steps = 0;
  double loss = 0;
  double samples_per_s = 0;
  uint32_t peers = 0;       ///< workers in the ring
  uint64_t bytes_sent = 0;  ///< all-reduce bytes of this step, all workers
  bool operator==(const train_progress&) const = default;
};

/// Client -> a worker of a run whose coordinator died: coordinate it from now on, starting from
/// this worker's state after its last applied step (train_engine.hpp, "coordinator failover").
/// The answer is what open_training gets: progress, then a job_result for `train`.
struct train_resume {
  uint64_t train = 0;       ///< the client's id of the run
  std::string coordinator;  ///< the node that coordinated it
  /// The run's dataset again: workers hold only their shards, the new coordinator needs it all.
  std::vector<named_tensor> dataset;
  bool operator==(const train_resume&) const = default;
};

/// Node -> client: the state (parameters and optimizer) of a running training after step `step`
/// (train_spec::checkpoint_every); what a resumed run starts from (train_spec::start_step = step).
struct train_checkpoint {
  uint64_t train = 0;  ///< the client's training id
  uint64_t step = 0;
  std::vector<named_tensor> state;
  bool operator==(const train_checkpoint&) const = default;
};

/// Any message, as decoded.
using message = std::variant<hello, heartbeat, submit_job, job_result, run_stage, activation, stage_done,
                             status_request, status_reply, open_session, infer, close_session, peer_exchange,
                             open_training, train_setup, train_step, allreduce_piece, train_reduced, train_state,
                             train_progress, job_progress, train_resume, train_checkpoint, cancel_stages>;

/// kind byte + CAF body.
expected<std::vector<uint8_t>> encode_message(const message& m);

/// Parses and checks one message from a peer. Errors name the message kind and the problem; the
/// input size bounds memory use.
expected<message> decode_message(const uint8_t* data, size_t size);

/// "run_stage" etc., for logs.
const char* kind_name(const message& m);

// ---- inspect overloads (CAF 0.17 form) ----
template <class F>
typename F::result_type inspect(F& f, hello& x) {
  return f(caf::meta::type_name("hello"), x.incarnation, x.device_name, x.device_kind, x.gflops, x.mem_gbps,
           x.memory_bytes, x.is_client, x.answer_me);
}
template <class F>
typename F::result_type inspect(F& f, heartbeat& x) {
  return f(caf::meta::type_name("heartbeat"), x.incarnation, x.seq, x.running_stages);
}
template <class F>
typename F::result_type inspect(F& f, submit_job& x) {
  return f(caf::meta::type_name("submit_job"), x.job, x.wire, x.strategy);
}
template <class F>
typename F::result_type inspect(F& f, job_result& x) {
  return f(caf::meta::type_name("job_result"), x.job, x.ok, x.error, x.outputs, x.attempts, x.workers,
           x.strategy, x.step);
}
template <class F>
typename F::result_type inspect(F& f, job_progress& x) {
  return f(caf::meta::type_name("job_progress"), x.job, x.attempt, x.stages_done, x.stages, x.worker);
}
template <class F>
typename F::result_type inspect(F& f, route& x) {
  return f(caf::meta::type_name("route"), x.value, x.to, x.stage);
}
template <class F>
typename F::result_type inspect(F& f, run_stage& x) {
  return f(caf::meta::type_name("run_stage"), x.job, x.attempt, x.stage, x.coordinator, x.wire, x.awaited, x.routes,
           x.cache, x.inputs);
}
template <class F>
typename F::result_type inspect(F& f, activation& x) {
  return f(caf::meta::type_name("activation"), x.coordinator, x.job, x.attempt, x.stage, x.value);
}
template <class F>
typename F::result_type inspect(F& f, stage_done& x) {
  return f(caf::meta::type_name("stage_done"), x.job, x.attempt, x.stage, x.ok, x.error, x.outputs);
}
template <class F>
typename F::result_type inspect(F& f, cancel_stages& x) {
  return f(caf::meta::type_name("cancel_stages"), x.job, x.attempt);
}
template <class F>
typename F::result_type inspect(F& f, status_request& x) {
  return f(caf::meta::type_name("status_request"), x.id);
}
template <class F>
typename F::result_type inspect(F& f, peer_status& x) {
  return f(caf::meta::type_name("peer_status"), x.node, x.health, x.address, x.device, x.gflops, x.running_stages,
           x.rtt_ms, x.packets_lost, x.relayed);
}
template <class F>
typename F::result_type inspect(F& f, job_status& x) {
  return f(caf::meta::type_name("job_status"), x.job, x.client, x.state, x.stages, x.attempts, x.seconds,
           x.kind);
}
template <class F>
typename F::result_type inspect(F& f, status_reply& x) {
  return f(caf::meta::type_name("status_reply"), x.id, x.node, x.device, x.gflops, x.uptime_s, x.peers, x.jobs);
}

template <class F>
typename F::result_type inspect(F& f, open_session& x) {
  return f(caf::meta::type_name("open_session"), x.session, x.wire);
}
template <class F>
typename F::result_type inspect(F& f, infer& x) {
  return f(caf::meta::type_name("infer"), x.session, x.call, x.inputs);
}
template <class F>
typename F::result_type inspect(F& f, close_session& x) {
  return f(caf::meta::type_name("close_session"), x.session);
}

template <class F>
typename F::result_type inspect(F& f, peer_exchange& x) {
  return f(caf::meta::type_name("peer_exchange"), x.pex);
}

template <class F>
typename F::result_type inspect(F& f, train_spec& x) {
  return f(caf::meta::type_name("train_spec"), x.method, x.start_step, x.steps, x.micro_batches, x.micro_batch,
           x.inner_steps, x.compression, x.seed, x.grad_wire, x.apply_wire, x.delta_wire, x.outer_wire, x.state,
           x.dataset, x.dataset_rows, x.checkpoint_every);
}
template <class F>
typename F::result_type inspect(F& f, open_training& x) {
  return f(caf::meta::type_name("open_training"), x.train, x.spec);
}
template <class F>
typename F::result_type inspect(F& f, train_setup& x) {
  return f(caf::meta::type_name("train_setup"), x.train, x.spec, x.client, x.client_train);
}
template <class F>
typename F::result_type inspect(F& f, train_shard& x) {
  return f(caf::meta::type_name("train_shard"), x.index, x.columns);
}
template <class F>
typename F::result_type inspect(F& f, train_step& x) {
  return f(caf::meta::type_name("train_step"), x.train, x.step, x.attempt, x.ring, x.micro, x.commit, x.report_state,
           x.stop, x.shards);
}
template <class F>
typename F::result_type inspect(F& f, allreduce_piece& x) {
  return f(caf::meta::type_name("allreduce_piece"), x.train, x.coordinator, x.round, x.ring_step, x.piece, x.payload);
}
template <class F>
typename F::result_type inspect(F& f, train_reduced& x) {
  return f(caf::meta::type_name("train_reduced"), x.train, x.step, x.attempt, x.ok, x.error, x.loss, x.bytes_sent);
}
template <class F>
typename F::result_type inspect(F& f, train_state& x) {
  return f(caf::meta::type_name("train_state"), x.train, x.step, x.state);
}
template <class F>
typename F::result_type inspect(F& f, train_progress& x) {
  return f(caf::meta::type_name("train_progress"), x.train, x.step, x.steps, x.loss, x.samples_per_s, x.peers,
           x.bytes_sent);
}
template <class F>
typename F::result_type inspect(F& f, train_resume& x) {
  return f(caf::meta::type_name("train_resume"), x.train, x.coordinator, x.dataset);
}
template <class F>
typename F::result_type inspect(F& f, train_checkpoint& x) {
  return f(caf::meta::type_name("train_checkpoint"), x.train, x.step, x.state);
}

}  // namespace mesh::msg
