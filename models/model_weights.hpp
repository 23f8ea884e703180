#pragma once
/// A checkpoint's tensors as graph parameters: which tensors an architecture needs, with the shape
/// the config implies (checked when planned, so a missing or misshapen tensor is an error naming
/// the file and the tensor before anything is built), the dtype each becomes on the device, and
/// the conversion that uploads it.
///
/// Matrices keep their checkpoint type on the device: f16 and bf16 where the executor stores them,
/// and the block-quantized GGUF types (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k) always,
/// read by the `linear` op, which decodes the blocks as it multiplies. Such a weight is uploaded
/// straight from the mapped file (executor::set_parameter_view), with no host copy. Vectors
/// (norms, biases) and float types the executor cannot store become f32 at load.
///
/// A pipeline stage plans only what its layers need (plan's layer_range): the embedding on the
/// first stage, the final norm and the head on the last (a tied head is the embedding matrix,
/// which the last stage then holds although it embeds nothing). plan_costs gives the bytes of
/// each part, for sizing stages before anything is loaded.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "graph/dtype.hpp"
#include "graph/shape.hpp"
#include "graph/tensor.hpp"
#include "models/checkpoint.hpp"
#include "models/layer_range.hpp"
#include "models/model_config.hpp"

namespace mesh::models {

/// One checkpoint tensor as a graph parameter, or several projections of the same input stacked
/// along their output rows (a fused weight: one matrix-vector product instead of several).
struct weight {
  std::string param;  ///< the parameter's name in the graph: "w." + the tensor's name (fused: the names joined by '+')
  std::vector<const tensor_view*> sources;  ///< where its bytes lie (in the checkpoint's mapping), rows stacked in this order
  shape dims;                               ///< as stored: [out, in] for projections (HF GPT-2: [in, out])
  dtype type = dtype::f32;                  ///< on the device
  int64_t layer = -1;  ///< the layer it belongs to; -1: the embedding, final norm or head
};

/// Rows [first, first + count) of a weight.
struct row_span {
  int64_t first = 0, count = 0;
};

/// What the device may store besides f32.
struct weight_options {
  bool keep_f16 = true;   ///< f16 matrices stay f16 (the executor has 16-bit storage)
  bool keep_bf16 = true;  ///< bf16 matrices stay bf16
  bool keep_quantized = true;  ///< quantized matrices stay quantized (else dequantized to f32)
  /// Stack each layer's q, k and v projections, and its gate and up projections, into one weight
  /// where they share a device dtype (Llama-family models; GPT-2 files hold q, k and v stacked
  /// already). A decode step then runs one matrix-vector product where it ran two or three.
  bool fuse_projections = true;
};

/// The weights of one model, keyed by checkpoint tensor name. Refers into the checkpoint: keep it
/// alive while this lives.
class model_weights {
 public:
  /// Finds every tensor the config's architecture needs and checks its shape; the first missing
  /// or misshapen one is the error (checkpoint::require's message: the file, the tensor, both
  /// shapes). Also checks that a GGUF rope_freqs tensor, when the config names one, is F32.
  /// With `layers`, only the tensors of that stage (a range the model lacks is resolve_layers'
  /// error).
  static expected<model_weights> plan(const model_config& config, const checkpoint& ckpt,
                                      const weight_options& options = {}, const layer_range& layers = {});

  /// The weight of that checkpoint tensor; it must have been planned (an assert). A fused
  /// tensor's weight is the stack it is part of: rows_of says which of its rows are the tensor's.
  const weight& at(std::string_view tensor_name) const;
  /// The rows of at(tensor_name) that hold that tensor (all of them unless it is fused).
  row_span rows_of(std::string_view tensor_name) const;
  bool has(std::string_view tensor_name) const { return index_.count(std::string(tensor_name)) > 0; }
  const std::vector<weight>& all() const { return weights_; }
  /// Bytes the parameters take on the device.
  int64_t device_bytes() const;
  /// The layers planned for (resolved: end is the last one's successor).
  const layer_range& layers() const { return layers_; }

  /// GGUF Llama 3: rope_freqs.weight's divisors (empty otherwise).
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }

 private:
  std::vector<weight> weights_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<float> rope_freqs_;
  layer_range layers_;
};

/// What each part of the model takes on a device with `options` (model_costs), the KV caches of
/// `sequences` sequences of `context` positions: plans every tensor (errors as plan's) and loads
/// nothing.
expected<model_costs> plan_costs(const model_config& config, const checkpoint& ckpt, const weight_options& options,
                                 int64_t context, int64_t sequences = 1);

/// The bytes of each of the checkpoint's files (checkpoint::files() order) that a stage of
/// `layers` reads to load: every file's header (opening the checkpoint parses it) and the data
/// of the stage's tensors, sorted and merged. What a node without the checkpoint must fetch to
/// load that stage. Errors: plan's.
expected<std::vector<std::vector<file_span>>> stage_file_ranges(const model_config& config, const checkpoint& ckpt,
                                                                 const layer_range& layers);

/// True when the weight is one checkpoint tensor whose device dtype is its checkpoint type: its
/// bytes upload as they lie, straight from the mapping.
bool stored_as_is(const weight& w);

/// The graph tensor_view of a weight stored as it is (stored_as_is): the checkpoint's bytes.
mesh::tensor_view device_view(const weight& w);

/// The host tensor a weight uploads when it is not stored as it is: each row widened or
/// dequantized to f32, or a fused weight's sources' bytes one after the other.
expected<tensor> load_weight(const weight& w);

}  // namespace mesh::models
