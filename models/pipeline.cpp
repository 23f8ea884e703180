#include "models/pipeline.hpp"

#include <fmt/format.h>

namespace mesh::models {

expected<std::vector<float>> local_stage::forward(int64_t start, std::span<const int32_t> tokens, std::span<const float> hidden) {
  if (start == 0) s_.reset();
  if (start != s_.position())
    return make_error(error_code::invalid_argument,
                      fmt::format("layers {}: a step at position {}, but the stage stands at {} (it missed a step)",
                                  to_string(s_.layers()), start, s_.position()));
  if (s_.takes_tokens()) {
    if (!hidden.empty()) return make_error(error_code::invalid_argument, fmt::format("layers {}: the first stage takes tokens, not hidden rows", to_string(s_.layers())));
    return s_.forward(tokens);
  }
  if (!tokens.empty()) return make_error(error_code::invalid_argument, fmt::format("layers {}: this stage takes hidden rows, not tokens", to_string(s_.layers())));
  return s_.forward(hidden);
}

expected<std::unique_ptr<pipeline>> pipeline::create(const model_config& config, int64_t context,
                                                     std::vector<pipeline_stage> stages) {
  if (stages.empty()) return make_error(error_code::invalid_argument, "pipeline: no stages");
  int64_t next = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& s = stages[i];
    if (!s.link) return make_error(error_code::invalid_argument, fmt::format("pipeline: stage {} on node {} has no link", i + 1, s.node));
    if (s.layers.first != next || s.layers.end <= s.layers.first)
      return make_error(error_code::invalid_argument,
                        fmt::format("pipeline: stage {} on node {} holds layers {}, but the next layer is {}", i + 1, s.node,
                                    to_string(s.layers), next));
    next = s.layers.end;
  }
  if (next != config.n_layers)
    return make_error(error_code::invalid_argument,
                      fmt::format("pipeline: the stages end at layer {}, but the model has {} layers", next, config.n_layers));
  std::unique_ptr<pipeline> p(new pipeline());
  p->config_ = config;
  p->context_ = context;
  p->stages_ = std::move(stages);
  return p;
}

expected<std::vector<float>> pipeline::prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return make_error(error_code::invalid_argument, "pipeline: no tokens to run");
  const auto n = static_cast<int64_t>(tokens.size());
  if (position_ + n > context_)
    return make_error(error_code::limit_exceeded,
                      fmt::format("pipeline: {} more tokens after {} would pass the context of {} positions", n, position_, context_));
  expected<std::vector<float>> out;
  failed_stage_.reset();
  for (size_t i = 0; i < stages_.size(); ++i) {
    auto& s = stages_[i];
    out = i == 0 ? s.link->forward(position_, tokens, {}) : s.link->forward(position_, {}, std::span<const float>(*out));
    if (!out) failed_stage_ = i;
    if (!out)
      return make_error(out.error().code, fmt::format("stage {} of {} (layers {} on node {}): {}", i + 1, stages_.size(),
                                                      to_string(s.layers), s.node, out.error().message));
    // A link that returns the wrong amount (a peer of another build, a bug) must not reach the
    // next stage or the sampler as a misshapen tensor.
    const bool last = i + 1 == stages_.size();
    const auto want = static_cast<size_t>(last ? config_.vocab_size : n * config_.hidden_size);
    if (out->size() != want) failed_stage_ = i;
    if (out->size() != want)
      return make_error(error_code::internal, fmt::format("stage {} of {} (layers {} on node {}) returned {} values, not {}", i + 1,
                                                          stages_.size(), to_string(s.layers), s.node, out->size(), want));
  }
  position_ += n;
  return out;
}

expected<std::vector<float>> pipeline::decode(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

}  // namespace mesh::models
