#pragma once
/// A pipeline stage's share of a model: a contiguous range of its layers [first, end). The stage
/// that holds layer 0 also embeds the tokens; the one that holds the last layer also applies the
/// final norm and the output head, unless `head` is false (a split model's serving node applies
/// it: the link then carries a hidden row per token, not the logits). The head alone is the empty
/// range [layers, layers). The whole model is the one stage [0, layers).
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace mesh::models {

struct layer_range {
  int64_t first = 0;  ///< the first layer of the stage
  /// One past its last layer; 0 means "to the model's last layer", so that a default range is
  /// the whole model (no stage is ever [first, 0): that would be empty).
  int64_t end = 0;
  /// Whether a stage that ends at the last layer also applies the final norm and the head.
  bool head = true;

  int64_t size() const { return end - first; }
  /// The stage embeds tokens (it holds layer 0).
  bool takes_tokens() const { return first == 0; }
  /// The stage ends with the final norm and the output head.
  bool returns_logits(int64_t n_layers) const { return head && end == n_layers; }
  bool whole(int64_t n_layers) const { return first == 0 && end == n_layers && head; }
  /// The final norm and the head alone, no layer (a split model's serving node).
  static layer_range head_of(int64_t n_layers) { return {n_layers, n_layers, true}; }
  bool operator==(const layer_range&) const = default;
};

/// "[2, 4)"; "[2, 4) without the head" for a stage that leaves the head to another.
std::string to_string(const layer_range& r);

/// The range with `end` 0 replaced by the model's layer count, or an invalid_argument error that
/// names the range and the count ("layers [3, 7) of a model with 4 layers: ...") when it is empty
/// (but the head alone), negative or runs past the last layer.
expected<layer_range> resolve_layers(const layer_range& r, int64_t n_layers);

/// Device bytes of a model's parts, as the device stores them (quantized blocks stay quantized):
/// what a stage of it needs (model_weights' plan_costs measures them; stage_plan divides them).
struct model_costs {
  std::vector<int64_t> layer_bytes;  ///< weights of each layer
  int64_t kv_bytes_per_layer = 0;    ///< one layer's KV cache for the context planned for
  int64_t first_bytes = 0;           ///< the embedding (GPT-2: and its positions): the first stage's
  int64_t last_bytes = 0;            ///< the final norm and the output head: the last stage's
  /// Bytes in both first_bytes and last_bytes (a tied embedding is also the head): a stage that
  /// is first and last holds them once.
  int64_t shared_bytes = 0;

  int64_t layers() const { return static_cast<int64_t>(layer_bytes.size()); }
  /// Weights and KV caches of the stage `r` (a resolved range), with the first and last stage's
  /// extras when it is one of them.
  int64_t stage_bytes(const layer_range& r) const;
};

}  // namespace mesh::models
