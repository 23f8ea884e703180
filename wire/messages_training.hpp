#pragma once
/// The training messages (actors/train_engine.hpp, docs/training.md): part of the message set of
/// wire/messages.hpp (include that one), each with the fields() overload that gives its layout
/// on the wire.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"
#include "graph/planner.hpp"
#include "graph/tensor.hpp"
#include "wire/graph_codec.hpp"
#include "wire/graph_payload.hpp"
#include "wire/messages_serving.hpp"
#include "wire/states.hpp"
#include "wire/takeover_grant.hpp"

namespace mesh::msg {

/// A tokenizer's vocabulary as it travels (models::vocabulary; actors/train_text.hpp converts).
/// Ids below 0: none.
struct wire_vocabulary {
  uint8_t model = 0;  ///< models::vocabulary::kind
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;
  std::vector<std::string> merge_left, merge_right;  ///< merge i is (left[i], right[i])
  std::string pre_tokenizer;
  std::vector<std::string> pre_tokenizer_patterns;
  bool ignore_merges = false;
  bool add_space_prefix = true;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool operator==(const wire_vocabulary&) const = default;
};

/// Training data the workers read themselves from a text or JSONL file (models/text_shard.hpp):
/// the coordinator offers the file by digest (blob_get, as for split models' checkpoints) and each
/// worker fetches, tokenizes and packs only the shards its micro-batches draw from. The gradient
/// graph's inputs are then "tokens" (i32), "targets" (i32) and "mask" (f32), each
/// [micro_batch, sequence].
struct train_text_data {
  /// A client's spec: the file on the node it sends the run to. Kept in setups for messages.
  std::string path;
  /// The file as the coordinator offers it (filled by the coordinator; a client's is ignored).
  blob_file file;
  uint8_t format = 0;         ///< models::data_format: 0 text, 1 JSONL
  uint32_t sequence = 0;      ///< tokens per row
  uint32_t shuffle_rows = 1024;  ///< the shuffle window (text_shard_options::shuffle_rows)
  wire_vocabulary vocab;
  std::string chat_template;  ///< the model's (Jinja source); empty: none
  bool operator==(const train_text_data&) const = default;
};

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
  /// Empty, or the one file the workers read their data from (train_text_data); `dataset` is
  /// then empty.
  std::vector<train_text_data> text{};
  /// Data parallel: the gradients are all-reduced in buckets of about this many bytes, each as
  /// soon as the backward pass has finished it (actors/train_buckets.hpp); 0: one bucket, after
  /// the whole backward pass.
  uint64_t bucket_bytes = 0;
  /// DiLoCo: the parameters are cut into this many fragments, synchronised in turn (streaming
  /// DiLoCo): each step of `inner_steps` local steps ends with the all-reduce and outer step of
  /// one fragment, fragment (step / inner_steps) mod fragments. 1: every parameter each step.
  uint32_t fragments = 1;
  /// DiLoCo: the last this many inner steps of each round run while its all-reduce travels (the
  /// round's delta is taken before them; the outer graph mixes the local parameters it resets, see
  /// train_options::overlap_steps). 0: the all-reduce follows every inner step of the round.
  uint32_t overlap_steps = 0;
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
  /// Every member of `ring` maps every other's shared region (they share a host, each said so in
  /// its train_ready of the last step with this ring): the gradients are reduced through the
  /// regions (host_reduce_mark), not around the ring.
  bool host_reduce = false;
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

/// Worker -> its ring successor, which may run on the same host: the region this worker puts
/// its all-reduce pieces into (actors/shared_region.hpp). The successor maps it and answers.
struct shared_region_offer {
  uint64_t train = 0;
  node_id coordinator;
  uint32_t pid = 0;
  uint32_t fd = 0;
  uint64_t size = 0;
  std::vector<uint8_t> nonce;  ///< 16 bytes
  bool operator==(const shared_region_offer&) const = default;
};

/// Successor -> worker: whether it mapped the region offered (`pid`, `fd`); if it did, pieces
/// may come as allreduce_piece_shared from now on.
struct shared_region_answer {
  uint64_t train = 0;
  node_id coordinator;
  uint32_t pid = 0;
  uint32_t fd = 0;
  bool ok = false;
  std::string error;  ///< why not (another host, ...)
  bool operator==(const shared_region_answer&) const = default;
};

/// Worker -> next worker in the ring: an allreduce_piece whose payload is not in the message but
/// in the sender's shared region (named as in its offer: the receiver maps it if it has not, e.g.
/// after it was set up again), bytes [offset, offset + length) of its data.
struct allreduce_piece_shared {
  uint64_t train = 0;
  node_id coordinator;
  uint64_t round = 0;
  uint32_t ring_step = 0;
  uint32_t piece = 0;
  uint32_t pid = 0;
  uint32_t fd = 0;
  uint64_t size = 0;
  std::vector<uint8_t> nonce;  ///< 16 bytes
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const allreduce_piece_shared&) const = default;
};

/// Worker -> every other member of a step whose ring reduces through shared memory
/// (train_step::host_reduce, actors/host_reduce.hpp): bucket `round` (the round id of a bucket,
/// as allreduce_piece names it) reached `phase` here, 0: this member's gradients are in its
/// region's input area; 1: its share of the sum is in its region's sum area. The region is named
/// as in its offer (the receiver maps it if it has not).
struct host_reduce_mark {
  uint64_t train = 0;
  node_id coordinator;
  uint64_t round = 0;
  uint32_t phase = 0;
  uint32_t pid = 0;
  uint32_t fd = 0;
  uint64_t size = 0;
  std::vector<uint8_t> nonce;  ///< 16 bytes
  bool operator==(const host_reduce_mark&) const = default;
};

/// Ring member -> coordinator: step `step` (this attempt) is set up here, its round ready for
/// the predecessor's pieces. With `probe`: the answer to a probing ring_go, saying how many
/// pieces its round has taken from its predecessor.
struct train_ready {
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool probe = false;
  uint32_t pieces_taken = 0;
  /// This member maps every other member's shared region of the step's ring, and each of them
  /// maps its own (train_step::host_reduce).
  bool host_local = false;
  bool operator==(const train_ready&) const = default;
};

/// Coordinator -> ring members: every member is ready for step `step` (this attempt): send your
/// pieces. A piece thus never reaches a node before the step that owns its round. With `probe`:
/// the round stalled; answer with the pieces taken (train_ready, probe).
struct ring_go {
  uint64_t train = 0;
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool probe = false;
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

template <class F>
void fields(F& f, train_ready& x) {
  f(x.train, x.step, x.attempt, x.probe, x.pieces_taken, x.host_local);
}

template <class F>
void fields(F& f, ring_go& x) {
  f(x.train, x.step, x.attempt, x.probe);
}

template <class F>
void fields(F& f, shared_region_offer& x) {
  f(x.train, x.coordinator, x.pid, x.fd, x.size, x.nonce);
}

template <class F>
void fields(F& f, shared_region_answer& x) {
  f(x.train, x.coordinator, x.pid, x.fd, x.ok, x.error);
}

template <class F>
void fields(F& f, host_reduce_mark& x) {
  f(x.train, x.coordinator, x.round, x.phase, x.pid, x.fd, x.size, x.nonce);
}

template <class F>
void fields(F& f, allreduce_piece_shared& x) {
  f(x.train, x.coordinator, x.round, x.ring_step, x.piece, x.pid, x.fd, x.size, x.nonce, x.offset, x.length);
}

template <class F>
void fields(F& f, train_spec& x) {
  f(x.method, x.start_step, x.steps, x.micro_batches, x.micro_batch, x.inner_steps, x.compression, x.seed, x.grad, x.apply, x.delta, x.outer, x.state, x.dataset, x.dataset_rows, x.checkpoint_every, x.text, x.bucket_bytes, x.fragments, x.overlap_steps);
}

template <class F>
void fields(F& f, wire_vocabulary& x) {
  f(x.model, x.tokens, x.scores, x.token_types, x.merge_left, x.merge_right, x.pre_tokenizer, x.pre_tokenizer_patterns,
    x.ignore_merges, x.add_space_prefix, x.bos_id, x.eos_id, x.unk_id, x.pad_id, x.add_bos, x.add_eos);
}

template <class F>
void fields(F& f, train_text_data& x) {
  f(x.path, x.file, x.format, x.sequence, x.shuffle_rows, x.vocab, x.chat_template);
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
  f(x.train, x.step, x.attempt, x.ring, x.micro, x.commit, x.report_state, x.stop, x.shards, x.host_reduce);
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

}  // namespace mesh::msg
