#pragma once
/// The messages of text generation through a node, of models served over the mesh and split into
/// stages, and of checkpoint files fetched by stage nodes (docs/models.md, docs/serving.md): part
/// of the message set of wire/messages.hpp (include that one), each with the fields() overload
/// that gives its layout on the wire.
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
#include "wire/states.hpp"
#include "wire/takeover_grant.hpp"

namespace mesh::msg {

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
  /// A PEFT LoRA adapter directory on the node, merged into the model at load; empty: none.
  std::string adapter;
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

template <class F>
void fields(F& f, sampling_params& x) {
  f(x.temperature, x.top_k, x.top_p, x.min_p, x.repeat_penalty, x.seed);
}

template <class F>
void fields(F& f, generate_request& x) {
  f(x.request, x.model, x.prompt, x.chat, x.chat_template, x.sampling, x.stop, x.max_tokens, x.adapter);
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
