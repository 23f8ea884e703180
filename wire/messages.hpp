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

/// Bumped on any change to these messages. Peers of another version are not admitted (the
/// transport's admission compares versions), and every message carries it as well: a message
/// of another version is refused by decode_message.
inline constexpr uint16_t protocol_version = 19;

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


// ---- training (see actors/train_engine.hpp) ----

/// Everything a worker needs to train: the step graphs (no tensors inside),
/// the state (initial values of every parameter they name), the dataset and the schedule.
///
/// Graphs: `grad` maps one micro-batch (inputs named like the dataset's columns, first
/// dimension `micro_batch`) to outputs "loss" (f32 scalar, a mean over the micro-batch) and
/// "grad.<p>" per trained parameter; `apply` takes inputs "grad.<p>" and "scale" (f32
/// scalar: the gradients are sums over micro-batches, scale turns them into a mean) and updates
/// the parameters and optimizer state. DiLoCo adds `delta` (outputs "delta.<p>" = outer copy
/// minus local parameter) and `outer` (inputs "delta.<p>" summed over workers and "scale";
/// Nesterov step on the outer copy, local parameters reset to it).
struct train_spec {
  train_method method = train_method::data_parallel;
  uint64_t start_step = 0;       ///< the step `state` is at (0, or a resumed checkpoint's step)
  uint64_t steps = 0;            ///< train until this step (inner steps for DiLoCo)
  uint32_t micro_batches = 1;    ///< micro-batches per step, over all workers together
  uint32_t micro_batch = 1;      ///< rows per micro-batch
  uint32_t inner_steps = 1;      ///< DiLoCo: local steps between averaging rounds
  wire_format compression = wire_format::f32;  ///< of the all-reduce
  uint64_t seed = 0;             ///< data order
  graph_payload grad, apply, delta, outer;  ///< graphs only (no tensors); delta, outer: DiLoCo
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
  node_id client;             ///< the client that opened the run (may ask a worker to take it over)
  uint64_t client_train = 0;  ///< the client's id of the run
  /// The client's grant for the sender to coordinate the run (wire/takeover_grant.hpp);
  /// generation 0 (no grant) for the run as the client opened it. Its generation counts the
  /// takeovers: a worker holding the run at a higher generation refuses this setup (it comes
  /// from a coordinator that was taken over), and only a setup whose grant the receiver checked
  /// ends the run's lower generations.
  takeover_grant takeover;
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
  std::vector<node_id> ring;
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
  node_id coordinator;
  uint64_t round = 0;
  uint32_t ring_step = 0;
  uint32_t piece = 0;
  std::vector<uint8_t> payload;
  bool operator==(const allreduce_piece&) const = default;
};

/// Ring member -> coordinator: step `step` (this attempt) is set up here, its round ready for
/// the predecessor's pieces.
struct train_ready {
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool operator==(const train_ready&) const = default;
};

/// Coordinator -> ring members: every member is ready for step `step` (this attempt): send your
/// pieces. A piece thus never reaches a node before the step that owns its round.
struct ring_go {
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool operator==(const ring_go&) const = default;
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
  error_code code = error_code::internal;  ///< what kind of failure, when !ok
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
  node_id coordinator;      ///< the node that coordinated it
  /// The run's dataset again: workers hold only their shards, the new coordinator needs it all.
  std::vector<named_tensor> dataset;
  /// The client's signed grant for the receiver to coordinate the run from now on; it travels
  /// on in the new coordinator's setups.
  takeover_grant takeover;
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

// ---- text generation through a node (actors/generation_worker.hpp, docs/models.md) ----

/// How the next token is chosen (models/sampler.hpp gives the meaning and order of each step).
struct sampling_params {
  float temperature = 0.0f;     ///< <= 0 greedy; negative is refused
  int32_t top_k = 0;            ///< 0: off
  float top_p = 1.0f;           ///< 1: off
  float min_p = 0.0f;           ///< 0: off
  float repeat_penalty = 1.0f;  ///< 1: off
  uint64_t seed = 0;
  bool operator==(const sampling_params&) const = default;
};

/// Client -> node: generate text from a checkpoint on that node. Answered by generate_piece
/// messages as text is decided, then one generate_done.
struct generate_request {
  uint64_t request = 0;     ///< chosen by the client, unique per client
  std::string model;        ///< a checkpoint path on the node: a GGUF file or a Hugging Face directory
  std::string prompt;
  bool chat = false;        ///< render `prompt` as one user message with a chat template
  std::string chat_template;  ///< with chat: a family name (models/chat_template.hpp); empty: the checkpoint's own
  sampling_params sampling;
  std::vector<std::string> stop;  ///< generation ends before the first of these in the text
  uint32_t max_tokens = 256;
  bool operator==(const generate_request&) const = default;
};

/// Node -> client: the next piece of generated text (whole UTF-8 characters).
struct generate_piece {
  uint64_t request = 0;
  std::string text;
  uint32_t tokens = 0;  ///< tokens generated so far (a piece may hold several, or a token none)
  bool operator==(const generate_piece&) const = default;
};

/// Node -> client: the generation ended (ok) or failed (the error, nothing generated after it).
struct generate_done {
  uint64_t request = 0;
  bool ok = false;
  finish_reason finish = finish_reason::length;
  uint32_t prompt_tokens = 0;
  uint32_t tokens = 0;            ///< generated, an ending EOS included
  double load_seconds = 0;        ///< loading the model for this request (0 when it was loaded)
  double prompt_seconds = 0;      ///< prefill of the prompt
  double generate_seconds = 0;    ///< sampling and decoding after the prefill
  error_code code = error_code::internal;  ///< when !ok
  std::string error;                       ///< when !ok: a sentence naming what was wrong
  bool operator==(const generate_done&) const = default;
};

/// Client -> node: withdraw a generate_request (waiting or running); the node ends it with a
/// generate_done of finish `cancelled`.
struct generate_cancel {
  uint64_t request = 0;
  bool operator==(const generate_cancel&) const = default;
};

/// Client -> node: list the models the node serves (its model host, shared with its HTTP API),
/// load a checkpoint (`target` is its path on the node), unload one (`target` is its id), or
/// plan a split model again over `split` nodes while it serves (`target` is its id).
struct models_request {
  uint64_t id = 0;
  models_action action = models_action::list;
  std::string target;
  std::string chat_template;  ///< load: a chat template family name; empty: the checkpoint's own
  uint32_t context = 0;       ///< load: session positions (0: the model's, capped)
  /// load: split the model over this many nodes (this one and its healthy peers with the most
  /// device memory), each loading its layers from its own copy of `target`; 0 or 1: this node
  /// holds it all (docs/serving.md, "Split over the mesh"). replan: the nodes of the new plan.
  uint32_t split = 0;
  bool operator==(const models_request&) const = default;
};

/// Where a range of a served model's layers runs.
struct model_stage {
  node_id node;
  uint32_t first_layer = 0;
  uint32_t end_layer = 0;  ///< one past its last layer
  bool operator==(const model_stage&) const = default;
};

/// A model a node serves.
struct model_entry {
  std::string id;
  std::string path;
  uint32_t context = 0;
  uint32_t layers = 0;
  bool chat = false;       ///< has a chat template
  bool on_demand = false;  ///< loaded for a request that named its path (may be unloaded for another)
  std::vector<model_stage> stages;  ///< in order; one stage (this node, every layer) unless split
  bool operator==(const model_entry&) const = default;
};

/// Node -> client: the answer to a models_request (after a load: once it is loaded or failed):
/// the node's models then, and where its HTTP API listens ("" when it has none).
struct models_reply {
  uint64_t id = 0;
  bool ok = false;
  error_code code = error_code::internal;  ///< when !ok
  std::string error;                       ///< when !ok: a sentence naming what was wrong
  std::vector<model_entry> models;
  std::string api_url;
  bool operator==(const models_reply&) const = default;
};

// ---- a model split over the mesh (serving/split_model.hpp, docs/serving.md) ----

/// Serving node -> peer: load layers [first_layer, end_layer) of the checkpoint at `path` (the
/// peer's own copy) as a pipeline stage holding `slots` sequences of `context` positions each.
/// Only its sender may step or close it. Answered by a stage_reply (empty output) once loaded or
/// failed.
/// Bytes [offset, offset + length) of a file.
struct byte_range {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const byte_range&) const = default;
};

/// A file offered for fetching: its name in the checkpoint (empty for a single-file checkpoint;
/// else a file name in its directory), its BLAKE2b-256 digest and its size in bytes, and for a
/// stage that needs only part of it, the digest of its chunk list (the digests of its 1 MiB
/// chunks, concatenated; blob_get::chunk_list) and the ranges the stage reads (empty: all of it).
struct blob_file {
  std::string name;
  std::array<uint8_t, 32> id{};
  uint64_t size = 0;
  std::array<uint8_t, 32> chunk_list{};
  std::vector<byte_range> ranges{};
  bool operator==(const blob_file&) const = default;
};

struct stage_open {
  uint64_t call = 0;   ///< echoed by the reply
  uint64_t stage = 0;  ///< chosen by the sender, unique per sender
  std::string path;
  uint32_t first_layer = 0;
  uint32_t end_layer = 0;
  uint32_t context = 0;
  uint32_t slots = 1;  ///< sequences held at once (the serving node's continuous batching)
  /// Whether a stage that ends at the last layer applies the final norm and the head (false: it
  /// returns hidden rows and the serving node applies the head).
  bool head = true;
  /// The checkpoint's files the sender offers for fetching (blob_get) to a peer without its own
  /// copy at `path`: one with an empty name for a single-file checkpoint (GGUF), else the
  /// directory's files that loading reads (config.json, the safetensors files and their index);
  /// empty: not offered.
  std::vector<blob_file> files{};
  bool operator==(const stage_open&) const = default;
};

/// One row of a batched stage_step: the sequence it extends and the position it fills.
struct step_row {
  uint32_t slot = 0;
  uint32_t position = 0;
  bool operator==(const step_row&) const = default;
};

/// Serving node -> peer: run the stage. `input` is i32 token ids [rows] for a stage that holds
/// layer 0, else f32 hidden rows [rows, hidden_size]. Without `rows`, the input extends the
/// sequence in `slot` over positions [start, start + rows) (start 0 begins a new sequence there);
/// with `rows` (one entry per input row, each slot once), a batched decode step: input row i
/// extends rows[i].slot at rows[i].position. Answered by a stage_reply: f32 hidden rows
/// [rows, hidden_size], or from the last stage logits: [vocab] after the last row of a sequence's
/// run, [rows, vocab] for a batched step.
struct stage_step {
  uint64_t call = 0;
  uint64_t stage = 0;
  uint32_t slot = 0;
  uint32_t start = 0;
  tensor input{dtype::f32, {0}, {}};
  std::vector<step_row> rows;
  bool operator==(const stage_step&) const = default;
};

/// Serving node -> peer: drop the stage (its device memory is freed). Not answered.
struct stage_close {
  uint64_t stage = 0;
  bool operator==(const stage_close&) const = default;
};

/// Peer -> serving node: the outcome of a stage_open or stage_step.
struct stage_reply {
  uint64_t call = 0;
  bool ok = false;
  error_code code = error_code::internal;  ///< when !ok
  std::string error;                       ///< when !ok: a sentence naming the node and what failed
  tensor output{dtype::f32, {0}, {}};      ///< none (no rows) for an open or a failure
  bool operator==(const stage_reply&) const = default;
};

// ---- checkpoint files fetched by a stage node that lacks them (docs/serving.md) ----

/// Stage node -> serving node: send bytes [offset, offset + length) of the file whose digest the
/// serving node offered in a stage_open. Answered by a blob_chunk.
struct blob_get {
  uint64_t call = 0;  ///< echoed by the reply
  std::array<uint8_t, 32> blob{};
  uint64_t offset = 0;
  uint32_t length = 0;
  /// The bytes asked for are of the blob's chunk list (32 bytes a chunk), not of the file.
  bool chunk_list = false;
  bool operator==(const blob_get&) const = default;
};

/// Serving node -> stage node: the bytes asked for (fewer only at the end of the file) and their
/// BLAKE2b-256 digest, or why not.
struct blob_chunk {
  uint64_t call = 0;
  bool ok = false;
  error_code code = error_code::internal;  ///< when !ok
  std::string error;                       ///< when !ok: a sentence naming the node and the blob
  uint64_t offset = 0;
  std::array<uint8_t, 32> digest{};
  std::vector<uint8_t> bytes;
  bool operator==(const blob_chunk&) const = default;
};

/// Any message, as decoded.
using message = std::variant<hello, heartbeat, submit_job, job_result, run_stage, activation, stage_done,
                             status_request, status_reply, open_session, infer, close_session, peer_exchange,
                             open_training, train_setup, train_step, allreduce_piece, train_reduced, train_state,
                             train_progress, job_progress, train_resume, train_checkpoint, cancel_stages,
                             stage_accepted, route_open, train_ready, ring_go, generate_request, generate_piece,
                             generate_done, generate_cancel, models_request, models_reply, stage_open, stage_step,
                             stage_close, stage_reply, blob_get, blob_chunk>;

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
void fields(F& f, train_ready& x) {
  f(x.train, x.step, x.attempt);
}

template <class F>
void fields(F& f, ring_go& x) {
  f(x.train, x.step, x.attempt);
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

template <class F>
void fields(F& f, train_spec& x) {
  f(x.method, x.start_step, x.steps, x.micro_batches, x.micro_batch, x.inner_steps, x.compression, x.seed, x.grad, x.apply, x.delta, x.outer, x.state, x.dataset, x.dataset_rows, x.checkpoint_every);
}

template <class F>
void fields(F& f, open_training& x) {
  f(x.train, x.spec);
}

template <class F>
void fields(F& f, train_setup& x) {
  f(x.train, x.spec, x.client, x.client_train, x.takeover);
}

template <class F>
void fields(F& f, train_shard& x) {
  f(x.index, x.columns);
}

template <class F>
void fields(F& f, train_step& x) {
  f(x.train, x.step, x.attempt, x.ring, x.micro, x.commit, x.report_state, x.stop, x.shards);
}

template <class F>
void fields(F& f, allreduce_piece& x) {
  f(x.train, x.coordinator, x.round, x.ring_step, x.piece, x.payload);
}

template <class F>
void fields(F& f, train_reduced& x) {
  f(x.train, x.step, x.attempt, x.ok, x.error, x.loss, x.bytes_sent, x.code);
}

template <class F>
void fields(F& f, train_state& x) {
  f(x.train, x.step, x.state);
}

template <class F>
void fields(F& f, train_progress& x) {
  f(x.train, x.step, x.steps, x.loss, x.samples_per_s, x.peers, x.bytes_sent);
}

template <class F>
void fields(F& f, train_resume& x) {
  f(x.train, x.coordinator, x.dataset, x.takeover);
}

template <class F>
void fields(F& f, train_checkpoint& x) {
  f(x.train, x.step, x.state);
}

template <class F>
void fields(F& f, sampling_params& x) {
  f(x.temperature, x.top_k, x.top_p, x.min_p, x.repeat_penalty, x.seed);
}

template <class F>
void fields(F& f, generate_request& x) {
  f(x.request, x.model, x.prompt, x.chat, x.chat_template, x.sampling, x.stop, x.max_tokens);
}

template <class F>
void fields(F& f, generate_piece& x) {
  f(x.request, x.text, x.tokens);
}

template <class F>
void fields(F& f, generate_done& x) {
  f(x.request, x.ok, x.finish, x.prompt_tokens, x.tokens, x.load_seconds, x.prompt_seconds, x.generate_seconds, x.code, x.error);
}

template <class F>
void fields(F& f, generate_cancel& x) {
  f(x.request);
}

template <class F>
void fields(F& f, models_request& x) {
  f(x.id, x.action, x.target, x.chat_template, x.context, x.split);
}

template <class F>
void fields(F& f, model_stage& x) {
  f(x.node, x.first_layer, x.end_layer);
}

template <class F>
void fields(F& f, model_entry& x) {
  f(x.id, x.path, x.context, x.layers, x.chat, x.on_demand, x.stages);
}

template <class F>
void fields(F& f, models_reply& x) {
  f(x.id, x.ok, x.code, x.error, x.models, x.api_url);
}

template <class F>
void fields(F& f, stage_open& x) {
  f(x.call, x.stage, x.path, x.first_layer, x.end_layer, x.context, x.slots, x.head, x.files);
}

template <class F>
void fields(F& f, byte_range& x) {
  f(x.offset, x.length);
}

template <class F>
void fields(F& f, blob_file& x) {
  f(x.name, x.id, x.size, x.chunk_list, x.ranges);
}

template <class F>
void fields(F& f, step_row& x) {
  f(x.slot, x.position);
}

template <class F>
void fields(F& f, stage_step& x) {
  f(x.call, x.stage, x.slot, x.start, x.input, x.rows);
}

template <class F>
void fields(F& f, stage_close& x) {
  f(x.stage);
}

template <class F>
void fields(F& f, stage_reply& x) {
  f(x.call, x.ok, x.code, x.error, x.output);
}

template <class F>
void fields(F& f, blob_get& x) {
  f(x.call, x.blob, x.offset, x.length, x.chunk_list);
}

template <class F>
void fields(F& f, blob_chunk& x) {
  f(x.call, x.ok, x.code, x.error, x.offset, x.digest, x.bytes);
}

}  // namespace mesh::msg
