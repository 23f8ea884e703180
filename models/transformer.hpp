#pragma once
/// Architectures as graph builders: one function from (model_config, model_weights) to the graph
/// of one inference step, for the Llama family (Llama 2/3, Mistral, Qwen2, Qwen3: RMSNorm, rope,
/// SwiGLU, grouped-query attention, optional q/k/v biases and q/k norms) and GPT-2 (learned
/// positions, LayerNorm, GELU, a fused qkv projection).
///
/// A step takes a batch of `tokens` rows at consecutive positions start, start+1, ... of which the
/// first `count` are real (the rest pad the batch up to its bucket and change nothing), writes
/// their keys and values into the KV cache, attends over the first `attended` cache rows, and
/// returns logits. Prefill (a whole prompt) and decode (one token) are the same graph at other
/// sizes. The KV cache is two parameters per layer (kv_cache_name), [context, kv_heads * head_dim]
/// f32, updated by the graph: they stay on the device between steps like the weights.
///
/// Inputs: "tokens" i32 [tokens], "start" i32 [1], "count" i32 [1] (1 <= count <= tokens), and
/// with several slots "slot" i32 [1] (the sequence the rows belong to).
/// Output: "logits" f32 [1, vocab] (the last real row), or [tokens, vocab] with all_logits.
///
/// A batched step (step_shape::batched: continuous batching of decode steps) takes "tokens" i32
/// [tokens], "positions" i32 [tokens] and "slots" i32 [tokens] instead: row i is the next token
/// of the sequence in slot slots[i] at position positions[i], and a row whose position is -1 is
/// idle (it writes nothing and its logits mean nothing). Output: "logits" f32 [tokens, vocab].
///
/// A pipeline stage (step_shape::layers, a range [first, end) of the layers) builds the same
/// graph restricted to its layers: a stage that does not hold layer 0 takes input "hidden" f32
/// [tokens, hidden_size] (the residual stream entering layer `first`) instead of "tokens", and a
/// stage that does not hold the last layer outputs "hidden" f32 [tokens, hidden_size] (every row,
/// padding included: the stream leaving layer end - 1) instead of "logits". Only the embedding
/// (GPT-2: with its learned positions) is on the first stage, only the final norm and the head on
/// the last; every stage takes "start" and "count" and writes the KV cache of its own layers.
#include <cstdint>
#include <string>

#include "base/error.hpp"
#include "graph/graph.hpp"
#include "models/layer_range.hpp"
#include "models/model_config.hpp"
#include "models/model_weights.hpp"

namespace mesh::models {

/// The sizes of one step graph.
struct step_shape {
  int64_t tokens = 1;       ///< rows in the batch
  int64_t context = 0;      ///< KV-cache rows of one sequence (positions a sequence can hold)
  int64_t attended = 0;     ///< cache rows attention reads: at least start + count of every run
  bool all_logits = false;  ///< logits of every row, not just the last real one (last stage)
  layer_range layers = {};  ///< the stage's layers (default: the whole model)
  /// Sequences the KV cache holds, each in a slot of `context` rows (the cache parameters are
  /// [slots * context, width]).
  int64_t slots = 1;
  /// A decode step of several sequences: row i is the next token of the sequence in its own
  /// slot (input "slots"; tokens <= slots), at its own position; logits of every row.
  bool batched = false;
  /// A greedy decode step that keeps its state on the device, to be run many times back to back
  /// (executor::run_repeated; session::decode_greedy). One token of one sequence, the whole
  /// model. The token it runs is parameter greedy_token_name (i32 [1]), its position
  /// greedy_position_name (i32 [1]); with several slots input "slot" names the sequence. It
  /// picks the next token on the device (the first index of the largest logit; `vocab` when no
  /// logit equals the maximum, i.e. NaN), writes it (as f32) into greedy_history_name (f32
  /// [slots * context, 1]) at the row of the cache it wrote, and updates the token to it (at
  /// most vocab - 1, so the next step reads an embedding row) and the position to position + 1.
  /// Output: "token" i32 [1].
  bool greedy = false;
};

/// The parameters of a greedy step (step_shape::greedy).
std::string greedy_token_name(const std::string& prefix);
std::string greedy_position_name(const std::string& prefix);
std::string greedy_history_name(const std::string& prefix);

/// The KV-cache parameter of a layer: "<prefix>kv.<layer>.k" or ".v".
std::string kv_cache_name(const std::string& prefix, int64_t layer, bool value);
/// Device bytes of one layer's KV cache (keys and values, f32) for `context` positions.
int64_t kv_cache_bytes(const model_config& config, int64_t context);

/// Builds the step graph. Parameter names are the weights' (`prefix` + "w." + tensor name) and
/// the caches'. `weights` must hold the tensors of the shape's layers (model_weights::plan of that
/// range or of the whole model). Errors: sizes out of range (attended beyond context, context
/// beyond the model's positions for GPT-2), a layer range the model does not have, or a graph the
/// builder refuses (a bug: internal).
expected<graph> build_step_graph(const model_config& config, const model_weights& weights, const step_shape& shape,
                                 const std::string& prefix = "");

}  // namespace mesh::models
