#pragma once
/// What text generation needs of a model: append tokens and get the logits after the last one,
/// forget the sequence, and its size. A session (models/session.hpp) is one; a pipeline of stages
/// over several nodes (models/pipeline.hpp) is another, so that generate() and the node's model
/// host run either without knowing where the layers are.
#include <cstdint>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "models/model_config.hpp"

namespace mesh::models {

class sequence_model {
 public:
  virtual ~sequence_model() = default;
  /// Appends `tokens` at position() and returns the logits [vocab] after the last one. An error
  /// changes nothing the caller can see but the message (position() stays).
  virtual expected<std::vector<float>> prefill(std::span<const int32_t> tokens) = 0;
  /// prefill of one token.
  virtual expected<std::vector<float>> decode(int32_t token) = 0;
  /// Forgets the sequence: the next prefill starts at position 0.
  virtual void reset() = 0;
  /// Positions filled so far.
  virtual int64_t position() const = 0;
  /// Positions it can hold.
  virtual int64_t context() const = 0;
  virtual const model_config& config() const = 0;
};

}  // namespace mesh::models
