#pragma once
/// What text generation needs of a model: append tokens and get the logits after the last one,
/// forget a sequence, and its size. A session (models/session.hpp) is one; a pipeline of stages
/// over several nodes (models/pipeline.hpp) is another, so that generate() and the node's model
/// host run either without knowing where the layers are.
///
/// A model holds slots() sequences at once (a server's continuous batching): prefill(slot, ...)
/// appends to one of them, decode(batch) appends one token to each of several in one step. The
/// calls without a slot are slot 0's.
#include <cstdint>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "models/model_config.hpp"

namespace mesh::models {

/// The next token of the sequence in `slot` (a batched decode step).
struct slot_token {
  int64_t slot = 0;
  int32_t token = 0;
};

/// One row of a batched step through a pipeline stage: the sequence it extends and the position
/// it fills there (where that sequence stands).
struct batch_row {
  int64_t slot = 0;
  int64_t position = 0;
};

class sequence_model {
 public:
  virtual ~sequence_model() = default;
  /// Appends `tokens` to the sequence in `slot` at position(slot) and returns the logits [vocab]
  /// after the last one. An error changes nothing the caller can see but the message.
  virtual expected<std::vector<float>> prefill(int64_t slot, std::span<const int32_t> tokens) = 0;
  /// Appends each entry's token to its slot's sequence in one step; returns the logits [vocab]
  /// after each, in the batch's order. Errors change nothing: an empty batch, a slot outside
  /// [0, slots()) or named twice, a token outside the vocabulary, a sequence at its context.
  virtual expected<std::vector<std::vector<float>>> decode(std::span<const slot_token> batch) = 0;
  /// Forgets the sequence in `slot`: its next prefill starts at position 0.
  virtual void reset(int64_t slot) = 0;
  /// Positions filled in `slot`.
  virtual int64_t position(int64_t slot) const = 0;
  /// Sequences held at once (1 or more).
  virtual int64_t slots() const = 0;

  /// Slot 0's prefill of `tokens`.
  virtual expected<std::vector<float>> prefill(std::span<const int32_t> tokens) = 0;
  /// Slot 0's prefill of one token.
  virtual expected<std::vector<float>> decode(int32_t token) = 0;
  virtual void reset() = 0;
  virtual int64_t position() const = 0;

  /// Greedy decoding of the sequence in `slot`: appends `token`, picks the next token as the
  /// first index of the largest logit (first_argmax), appends that, and so on until `count`
  /// tokens are picked; the last one picked is not appended yet (as after decode and
  /// first_argmax of its logits). Returns the picked tokens. Errors as decode's, and `count`
  /// positions past the context. This default runs decode and first_argmax; a session runs the
  /// steps on the device back to back, without the host between them.
  virtual expected<std::vector<int32_t>> decode_greedy(int64_t slot, int32_t token, int64_t count);
  /// Tokens decode_greedy is best given at once (0: it has no faster path than decode).
  virtual int64_t greedy_chunk() const { return 0; }
  /// Forgets the positions of the sequence in `slot` from `position` on (0 <= position <=
  /// position(slot)): what decode_greedy appended past a stop is dropped. The default refuses
  /// (unsupported).
  virtual expected<void> rewind(int64_t slot, int64_t position);

  /// Positions each sequence can hold.
  virtual int64_t context() const = 0;
  virtual const model_config& config() const = 0;
};

}  // namespace mesh::models
