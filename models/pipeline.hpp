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
/// What crosses each link per step: the step's start position and its rows (token ids into the
/// first stage, f32 [rows, hidden_size] between stages, [vocab] logits of the last row back).
#include <cstdint>
#include <memory>
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

/// One stage as the driving node reaches it.
class stage_link {
 public:
  virtual ~stage_link() = default;
  /// Runs the stage over the rows at positions [start, start + rows): `tokens` for the first
  /// stage, `hidden` (rows * hidden_size values) for any other. start 0 begins a new sequence
  /// (the stage forgets the old one); any other start must be where the stage stands, so a stage
  /// that missed a step says so instead of computing on a wrong cache. Returns what
  /// session::forward returns: hidden rows, or the last stage's logits of the last row.
  virtual expected<std::vector<float>> forward(int64_t start, std::span<const int32_t> tokens, std::span<const float> hidden) = 0;
};

/// A stage session in this process.
class local_stage final : public stage_link {
 public:
  explicit local_stage(session s) : s_(std::move(s)) {}
  static std::unique_ptr<stage_link> make(session s) { return std::make_unique<local_stage>(std::move(s)); }
  expected<std::vector<float>> forward(int64_t start, std::span<const int32_t> tokens, std::span<const float> hidden) override;
  const session& stage() const { return s_; }

 private:
  session s_;
};

/// A stage of a pipeline: where it runs (a node id or name, for messages), its layers, its link.
struct pipeline_stage {
  std::string node;
  layer_range layers;
  std::unique_ptr<stage_link> link;
};

class pipeline final : public sequence_model {
 public:
  /// A pipeline of `stages` for a model of `config` holding `context` positions. Errors
  /// (invalid_argument): no stages, a stage without a link, ranges that do not cover the layers
  /// in order, each once ("stage 2 on node b starts at layer 5, the one before ends at 4").
  static expected<std::unique_ptr<pipeline>> create(const model_config& config, int64_t context,
                                                    std::vector<pipeline_stage> stages);

  /// Runs the tokens through every stage. A stage that fails (its node left, its device failed,
  /// it is out of step) is an error naming the stage, its layers and its node; position() does
  /// not move, and stages that ran are brought back in step by the next sequence (reset()).
  expected<std::vector<float>> prefill(std::span<const int32_t> tokens) override;
  expected<std::vector<float>> decode(int32_t token) override;
  /// The next step starts at 0, which tells every stage to forget the old sequence.
  void reset() override { position_ = 0; }
  int64_t position() const override { return position_; }
  int64_t context() const override { return context_; }
  const model_config& config() const override { return config_; }
  const std::vector<pipeline_stage>& stages() const { return stages_; }
  /// The index of the stage whose failure ended the last step, if it ended so (a wrong amount
  /// of values returned counts too); none after a step that succeeded.
  std::optional<size_t> failed_stage() const { return failed_stage_; }

 private:
  pipeline() = default;
  model_config config_;
  int64_t context_ = 0;
  int64_t position_ = 0;
  std::vector<pipeline_stage> stages_;
  std::optional<size_t> failed_stage_;
};

}  // namespace mesh::models
