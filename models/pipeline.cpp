#include "models/pipeline.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace mesh::models {

namespace {

expected<void> takes(const session& s, bool tokens, bool hidden) {
  if (s.takes_tokens() && hidden)
    return make_error(error_code::invalid_argument, fmt::format("layers {}: the first stage takes tokens, not hidden rows", to_string(s.layers())));
  if (!s.takes_tokens() && tokens)
    return make_error(error_code::invalid_argument, fmt::format("layers {}: this stage takes hidden rows, not tokens", to_string(s.layers())));
  return {};
}

}  // namespace

expected<std::vector<float>> local_stage::forward(int64_t slot, int64_t start, std::span<const int32_t> tokens,
                                                  std::span<const float> hidden) {
  std::lock_guard<std::mutex> lock(m_);
  if (slot < 0 || slot >= s_.slots())
    return make_error(error_code::invalid_argument,
                      fmt::format("layers {}: slot {} does not exist (the stage holds {})", to_string(s_.layers()), slot, s_.slots()));
  if (start == 0) s_.reset(slot);
  if (start != s_.position(slot))
    return make_error(error_code::invalid_argument,
                      fmt::format("layers {}: a step at position {} of slot {}, but the stage stands at {} (it missed a step)",
                                  to_string(s_.layers()), start, slot, s_.position(slot)));
  if (auto ok = takes(s_, !tokens.empty(), !hidden.empty()); !ok) return forward_error(ok);
  return s_.forward(slot, tokens, hidden);
}

expected<std::vector<float>> local_stage::forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                                  std::span<const float> hidden) {
  std::lock_guard<std::mutex> lock(m_);
  if (auto ok = takes(s_, !tokens.empty(), !hidden.empty()); !ok) return forward_error(ok);
  return s_.forward(rows, tokens, hidden);
}

expected<std::vector<float>> local_stage::head(std::span<const float> hidden) {
  std::lock_guard<std::mutex> lock(m_);
  if (!head_) return make_error(error_code::internal, fmt::format("layers {}: this stage holds no head", to_string(s_.layers())));
  return head_->head(hidden);
}

expected<std::unique_ptr<pipeline>> pipeline::create(const model_config& config, int64_t context,
                                                     std::vector<pipeline_stage> stages, int64_t slots) {
  if (stages.empty()) return make_error(error_code::invalid_argument, "pipeline: no stages");
  if (slots < 1) return make_error(error_code::invalid_argument, fmt::format("pipeline: {} slots", slots));
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
  std::optional<size_t> head;
  for (size_t i = 0; i < stages.size(); ++i)
    if (stages[i].link->has_head()) {
      if (head)
        return make_error(error_code::invalid_argument, fmt::format("pipeline: stages {} and {} both hold the head", *head + 1, i + 1));
      head = i;
    }
  if (head.has_value() == stages.back().layers.head)
    return make_error(error_code::invalid_argument,
                      head ? fmt::format("pipeline: stage {} holds the head, and the last stage applies it too", *head + 1)
                           : std::string("pipeline: the last stage applies no head, and no stage holds it"));
  std::unique_ptr<pipeline> p(new pipeline());
  p->head_ = head;
  p->config_ = config;
  p->context_ = context;
  p->stages_ = std::move(stages);
  p->positions_.assign(static_cast<size_t>(slots), 0);
  return p;
}

template <class Run>
expected<std::vector<float>> pipeline::through_stages(int64_t rows, int64_t logit_rows, std::optional<size_t>* failed, Run run) {
  expected<std::vector<float>> out;
  std::optional<size_t> failed_stage;
  if (!failed) failed = &failed_stage;
  failed->reset();
  for (size_t i = 0; i < stages_.size(); ++i) {
    auto& s = stages_[i];
    out = run(*s.link, i == 0 ? std::span<const float>() : std::span<const float>(*out));
    if (!out) *failed = i;
    if (!out)
      return make_error(out.error().code, fmt::format("stage {} of {} (layers {} on node {}): {}", i + 1, stages_.size(),
                                                      to_string(s.layers), s.node, out.error().message));
    // A link that returns the wrong amount (a peer of another build, a bug) must not reach the
    // next stage or the sampler as a misshapen tensor.
    const bool logits = i + 1 == stages_.size() && !head_;
    const auto want = static_cast<size_t>(logits ? logit_rows * config_.vocab_size : rows * config_.hidden_size);
    if (out->size() != want) *failed = i;
    if (out->size() != want)
      return make_error(error_code::internal, fmt::format("stage {} of {} (layers {} on node {}) returned {} values, not {}", i + 1,
                                                          stages_.size(), to_string(s.layers), s.node, out->size(), want));
  }
  if (head_) {  // the last `logit_rows` rows through the head
    auto& s = stages_[*head_];
    const auto d = static_cast<size_t>(config_.hidden_size);
    const std::span<const float> last(out->data() + out->size() - static_cast<size_t>(logit_rows) * d, static_cast<size_t>(logit_rows) * d);
    out = s.link->head(last);
    const auto want = static_cast<size_t>(logit_rows * config_.vocab_size);
    if (!out || out->size() != want) *failed = *head_;
    if (!out)
      return make_error(out.error().code, fmt::format("the head on stage {} of {} (node {}): {}", *head_ + 1, stages_.size(), s.node,
                                                      out.error().message));
    if (out->size() != want)
      return make_error(error_code::internal, fmt::format("the head on stage {} of {} (node {}) returned {} values, not {}", *head_ + 1,
                                                          stages_.size(), s.node, out->size(), want));
  }
  return out;
}

expected<std::vector<float>> pipeline::prefill(int64_t slot, std::span<const int32_t> tokens, std::optional<size_t>* failed) {
  if (slot < 0 || slot >= slots())
    return make_error(error_code::invalid_argument, fmt::format("pipeline: slot {} does not exist (it holds {})", slot, slots()));
  if (tokens.empty()) return make_error(error_code::invalid_argument, "pipeline: no tokens to run");
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t& position = positions_[static_cast<size_t>(slot)];
  if (position + n > context_)
    return make_error(error_code::limit_exceeded,
                      fmt::format("pipeline: {} more tokens after {} would pass the context of {} positions", n, position, context_));
  auto out = through_stages(n, 1, failed, [&](stage_link& link, std::span<const float> hidden) {
    return hidden.empty() ? link.forward(slot, position, tokens, {}) : link.forward(slot, position, {}, hidden);
  });
  if (out) position += n;
  return out;
}

expected<std::vector<float>> pipeline::decode(int32_t token) { return prefill(0, std::span<const int32_t>(&token, 1)); }

expected<std::vector<std::vector<float>>> pipeline::decode(std::span<const slot_token> batch, std::optional<size_t>* failed) {
  if (batch.empty()) return make_error(error_code::invalid_argument, "pipeline: an empty decode batch");
  std::vector<batch_row> rows;
  std::vector<int32_t> tokens;
  std::vector<bool> named(positions_.size(), false);
  for (const auto& e : batch) {
    if (e.slot < 0 || e.slot >= slots())
      return make_error(error_code::invalid_argument, fmt::format("pipeline: slot {} does not exist (it holds {})", e.slot, slots()));
    if (named[static_cast<size_t>(e.slot)])
      return make_error(error_code::invalid_argument, fmt::format("pipeline: slot {} named twice in one decode batch", e.slot));
    named[static_cast<size_t>(e.slot)] = true;
    const int64_t position = positions_[static_cast<size_t>(e.slot)];
    if (position + 1 > context_)
      return make_error(error_code::limit_exceeded,
                        fmt::format("pipeline: the sequence in slot {} is at the context of {} positions", e.slot, context_));
    rows.push_back({e.slot, position});
    tokens.push_back(e.token);
  }
  const auto n = static_cast<int64_t>(batch.size());
  auto out = through_stages(n, n, failed, [&](stage_link& link, std::span<const float> hidden) {
    return hidden.empty() ? link.forward(rows, tokens, {}) : link.forward(rows, {}, hidden);
  });
  if (!out) return forward_error(out);
  const auto vocab = static_cast<std::ptrdiff_t>(config_.vocab_size);
  std::vector<std::vector<float>> result;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto at = out->begin() + static_cast<std::ptrdiff_t>(i) * vocab;
    result.emplace_back(at, at + vocab);
    ++positions_[static_cast<size_t>(batch[i].slot)];
  }
  return result;
}

}  // namespace mesh::models
