#pragma once
/// A model split into pipeline stages, driven as one sequence_model: the node that serves it
/// holds the tokenizer and the sampler and runs each step through the stages in order (the first
/// takes the tokens, each next one the hidden rows the one before returned, the last returns the
/// logits). KV caches stay with their stages. Where a stage runs is its link's business: a
/// local_stage runs a stage session in this process; a link over the mesh sends the rows to the
/// peer that holds it (actors/remote_stage.hpp). No I/O here.
///
///   std::vector<pipeline_stage> stages;
///   stages.push_back({"self", {0, 12}, local_stage::make(std::move(*first_session))});
///   stages.push_back({"peer b", {12, 24}, std::move(remote)});
///   auto p = pipeline::create(config, context, std::move(stages));
///   auto g = generate(**p, tok, prompt, options);   // as on a whole-model session
///
/// What crosses each link per step: the slot and start position (or, for a batched decode step,
/// each row's slot and position) and the rows (token ids into the first stage, f32
/// [rows, hidden_size] between stages, logits back: [vocab] after a prefill's last row, a row of
/// [vocab] per sequence of a batched step).
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "models/layer_range.hpp"
#include "models/model_config.hpp"
#include "models/sequence_model.hpp"
#include "models/session.hpp"

namespace mesh::models {

/// One stage as the driving node reaches it. A stage holds as many sequences as its pipeline
/// (slots), each with its own position and KV cache.
class stage_link {
 public:
  virtual ~stage_link() = default;
  /// Runs the stage over the rows at positions [start, start + rows) of the sequence in `slot`:
  /// `tokens` for the first stage, `hidden` (rows * hidden_size values) for any other. start 0
  /// begins a new sequence in the slot (the stage forgets the old one); any other start must be
  /// where the slot stands, so a stage that missed a step says so instead of computing on a
  /// wrong cache. Returns what session::forward returns: hidden rows, or the last stage's logits
  /// of the last row.
  virtual expected<std::vector<float>> forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                               std::span<const float> hidden) = 0;
  /// A batched step: input row i (tokens[i] or hidden row i) extends rows[i].slot at
  /// rows[i].position, which must be where that slot stands. Returns a row per input row: hidden
  /// [n, hidden_size], or on the last stage logits [n, vocab].
  virtual expected<std::vector<float>> forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                               std::span<const float> hidden) = 0;
  /// Whether this stage also holds the model's final norm and head for the pipeline (a split
  /// model's serving node: the last stage then returns hidden rows, and the link from it carries
  /// one row per sequence instead of its logits).
  virtual bool has_head() const { return false; }
  /// The head over hidden rows [n, hidden_size]: logits [n, vocab].
  virtual expected<std::vector<float>> head(std::span<const float> hidden) {
    (void)hidden;
    return make_error(error_code::internal, "this stage holds no head");
  }
};

/// A stage session in this process.
class local_stage final : public stage_link {
 public:
  /// Steps from several threads run one at a time (the session is not thread-safe).
  /// `head`: a session of the head alone (layer_range::head_of) this stage runs for the pipeline.
  explicit local_stage(session s, std::optional<session> head = std::nullopt) : s_(std::move(s)), head_(std::move(head)) {}
  static std::unique_ptr<stage_link> make(session s, std::optional<session> head = std::nullopt) {
    return std::make_unique<local_stage>(std::move(s), std::move(head));
  }
  expected<std::vector<float>> forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override;
  expected<std::vector<float>> forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                       std::span<const float> hidden) override;
  bool has_head() const override { return head_.has_value(); }
  expected<std::vector<float>> head(std::span<const float> hidden) override;
  const session& stage() const { return s_; }

 private:
  std::mutex m_;  ///< the stage's and the head's steps: they share this node's executor
  session s_;
  std::optional<session> head_;
};

/// A stage of a pipeline: where it runs (a node id or name, for messages), its layers, its link.
struct pipeline_stage {
  std::string node;
  layer_range layers;
  std::unique_ptr<stage_link> link;
};

class pipeline final : public sequence_model {
 public:
  /// A pipeline of `stages` for a model of `config` holding `slots` sequences of `context`
  /// positions each (every stage must hold as many). Errors (invalid_argument): no stages, a
  /// stage without a link, ranges that do not cover the layers in order, each once ("stage 2 on
  /// node b starts at layer 5, the one before ends at 4"), slots < 1.
  /// A stage may hold the head for the pipeline (stage_link::has_head, at most one); the last
  /// stage's layers then say it applies none (layer_range::head false), and each step's last
  /// stage's rows go through that stage's head for the logits.
  static expected<std::unique_ptr<pipeline>> create(const model_config& config, int64_t context,
                                                    std::vector<pipeline_stage> stages, int64_t slots = 1);

  /// Runs the tokens through every stage. A stage that fails (its node left, its device failed,
  /// it is out of step) is an error naming the stage, its layers and its node; position(slot)
  /// does not move, and stages that ran are brought back in step by the slot's next sequence
  /// (reset(slot)). `failed` (when given) is set to the index of the stage whose failure ended
  /// the step (a wrong amount of values returned counts too), and reset when it succeeds.
  ///
  /// Steps on disjoint slots may run at once, from several threads: each stage runs one step at
  /// a time (a local stage under a lock of its own, a peer in the order its steps arrive), so
  /// micro-batches stepped together flow through the stages as a pipeline, one at each stage.
  /// reset() and steps on the same slot must not overlap.
  expected<std::vector<float>> prefill(int64_t slot, std::span<const int32_t> tokens, std::optional<size_t>* failed);
  expected<std::vector<float>> prefill(int64_t slot, std::span<const int32_t> tokens) override {
    return prefill(slot, tokens, nullptr);
  }
  /// One batched step through every stage (each stage runs all the rows in one graph run).
  expected<std::vector<std::vector<float>>> decode(std::span<const slot_token> batch, std::optional<size_t>* failed);
  expected<std::vector<std::vector<float>>> decode(std::span<const slot_token> batch) override { return decode(batch, nullptr); }
  /// The slot's next step starts at 0, which tells every stage to forget its old sequence.
  void reset(int64_t slot) override { positions_.at(static_cast<size_t>(slot)) = 0; }
  int64_t position(int64_t slot) const override { return positions_.at(static_cast<size_t>(slot)); }
  int64_t slots() const override { return static_cast<int64_t>(positions_.size()); }
  expected<std::vector<float>> prefill(std::span<const int32_t> tokens) override { return prefill(0, tokens); }
  expected<std::vector<float>> decode(int32_t token) override;
  void reset() override { reset(0); }
  int64_t position() const override { return position(0); }
  int64_t context() const override { return context_; }
  const model_config& config() const override { return config_; }
  const std::vector<pipeline_stage>& stages() const { return stages_; }

 private:
  pipeline() = default;
  /// Runs `input` (tokens for the first stage) through every stage with `run(link, hidden)`;
  /// checks each stage's output has `rows` rows (the last stage `logit_rows` of logits).
  template <class Run>
  expected<std::vector<float>> through_stages(int64_t rows, int64_t logit_rows, std::optional<size_t>* failed, Run run);
  model_config config_;
  int64_t context_ = 0;
  std::vector<int64_t> positions_ = {0};  ///< per slot
  std::vector<pipeline_stage> stages_;
  std::optional<size_t> head_;  ///< the stage that holds the head, when the last one does not
};

}  // namespace mesh::models
