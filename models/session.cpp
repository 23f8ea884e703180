#include "models/session.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "models/layers.hpp"
#include "models/transformer.hpp"

namespace mesh::models {

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

expected<session> session::create(gpu::executor& ex, const checkpoint& ckpt, const session_options& options) {
  const auto t0 = clock::now();
  auto config = read_model_config(ckpt);
  if (!config) return forward_error(config);
  session s;
  s.ex_ = &ex;
  s.config_ = std::move(*config);
  s.options_ = options;
  s.source_ = ckpt.path().string();
  if (options.min_batch < 1 || options.max_batch < options.min_batch || options.min_attended < 1)
    return make_error(error_code::invalid_argument,
                      fmt::format("session: batch sizes {}..{} and attended rows {} do not make sense", options.min_batch,
                                  options.max_batch, options.min_attended));
  if (options.slots < 1 || options.slots > session_options::max_slots)
    return make_error(error_code::invalid_argument, fmt::format("session: {} slots asked for; 1 to {} are possible",
                                                                options.slots, session_options::max_slots));
  s.positions_.assign(static_cast<size_t>(options.slots), 0);
  const int64_t model_context = s.config_.max_context;
  s.context_ = options.context > 0 ? options.context : std::min(model_context, session_options::default_context_cap);
  if (s.context_ > model_context)
    return make_error(error_code::limit_exceeded,
                      fmt::format("{}: a context of {} positions was asked for, but the model was trained for {}", s.source_,
                                  s.context_, model_context));
  const auto& info = ex.info();
  using toggle = session_options::toggle;
  s.whole_context_decode_ = options.whole_context_decode == toggle::on ||
                            (options.whole_context_decode == toggle::automatic && info.kind != "cpu");
  // Only the stage's tensors: the embedding on the first, the norm and head on the last.
  auto weights = model_weights::plan(s.config_, ckpt, {info.fp16, info.bf16_storage, true, options.fuse_projections},
                                     options.layers);
  if (!weights) return forward_error(weights);
  s.weights_ = std::make_unique<model_weights>(std::move(*weights));
  for (const auto& w : s.weights_->all()) {
    const std::string name = options.prefix + w.param;
    expected<void> ok;
    if (stored_as_is(w)) {
      ok = ex.set_parameter_view(name, device_view(w));  // straight from the mapping
    } else {
      auto t = load_weight(w);
      if (!t) return make_error(t.error().code, s.source_ + ": " + t.error().message);
      tensor_map one;
      one.emplace(name, std::move(*t));
      ok = ex.set_parameters(one);
    }
    if (!ok) return make_error(ok.error().code, fmt::format("{}: uploading {}: {}", s.source_, w.param, ok.error().message));
    // The device holds its own copy now: the file's pages need not stay in this process's memory.
    // Only bytes in the file's mapping: a tensor an adapter replaced lies in the heap, where
    // MADV_DONTNEED would zero the pages (and whatever else they hold).
    for (const auto* src : w.sources)
      if (ckpt.locate(src->data)) advise_range(src->data, access_hint::dont_need);
  }
  s.stats_.load_seconds = seconds_since(t0);
  if (options.prepare_decode && s.whole_context_decode_ && s.layers().size() == 0) {
    // A session of the head alone: head()'s programs for the rows a pipeline of `slots`
    // sequences hands it (one for a prompt chunk's last row, up to every sequence's in a step).
    for (int64_t n = 1; n / 2 < s.slots(); n *= 2)
      if (auto id = s.program(s.head_rows(n), s.head_attended(), true); !id) return forward_error(id);
  } else if (options.prepare_decode && s.whole_context_decode_) {
    // The programs decode() and batched forward() pick: one row for a single sequence, else rows
    // min(slots, a power of two), a row for each sequence of the step.
    // ... and decode_greedy's (whole model), which attends over the whole context too.
    if (s.greedy_chunk() > 0)
      if (auto id = s.greedy_program(s.context_); !id) return forward_error(id);
    if (s.slots() == 1) {
      if (auto id = s.program(1, s.context_, false); !id) return forward_error(id);
    } else {
      for (int64_t p = 1; p / 2 < s.slots() && p <= layers::fused_attention_max_rows; p *= 2)
        if (auto id = s.program(std::min(s.slots(), p), s.context_, true, true); !id) return forward_error(id);
    }
  }
  return s;
}

expected<gpu::program_id> session::program(int64_t batch, int64_t attended, bool all_logits, bool batched) {
  const auto key = std::make_tuple(batch, attended, all_logits, batched);
  if (auto it = programs_.find(key); it != programs_.end()) return it->second;
  const auto t0 = clock::now();
  auto g = build_step_graph(config_, *weights_, {batch, context_, attended, all_logits, layers(), slots(), batched},
                            options_.prefix);
  if (!g) return forward_error(g);
  auto id = ex_->load(*g);
  if (!id) return make_error(id.error().code, fmt::format("{}: loading the step graph ({} tokens, {} attended): {}",
                                                          source_, batch, attended, id.error().message));
  programs_.emplace(key, *id);
  stats_.compile_seconds += seconds_since(t0);
  ++stats_.programs;
  return *id;
}

int64_t session::attended_for(int64_t rows, int64_t filled) const {
  if (whole_context_decode_ && rows <= layers::fused_attention_max_rows) return context_;
  return std::min(context_, std::max(options_.min_attended, next_pow2(filled)));
}

int64_t session::kv_cache_bytes() const {
  return slots() * layers().size() * models::kv_cache_bytes(config_, context_);
}

expected<void> session::check_slot(int64_t slot) const {
  if (slot >= 0 && slot < slots()) return {};
  return make_error(error_code::invalid_argument,
                    fmt::format("{}: slot {} does not exist (the session holds {})", source_, slot, slots()));
}

expected<void> session::check_token(int32_t t) const {
  if (t >= 0 && t < config_.vocab_size) return {};
  return make_error(error_code::invalid_argument,
                    fmt::format("{}: token {} is outside the vocabulary of {} tokens", source_, t, config_.vocab_size));
}

expected<void> session::need_whole(const char* call) const {
  if (layers().whole(config_.n_layers)) return {};
  return make_error(error_code::invalid_argument,
                    fmt::format("{}: {} needs the whole model; this session holds layers {} of {} (use forward)",
                                source_, call, to_string(layers()), config_.n_layers));
}

expected<std::vector<float>> session::step(int64_t slot, std::span<const int32_t> tokens, std::span<const float> hidden,
                                           bool all_logits) {
  if (auto ok = check_slot(slot); !ok) return forward_error(ok);
  int64_t& position = positions_[static_cast<size_t>(slot)];
  const int64_t d = config_.hidden_size;
  if (takes_tokens() != hidden.empty())
    return make_error(error_code::invalid_argument,
                      fmt::format("{}: layers {} of {} take {}", source_, to_string(layers()), config_.n_layers,
                                  takes_tokens() ? "tokens, not hidden rows" : "the previous stage's hidden rows, not tokens"));
  if (hidden.size() % static_cast<size_t>(d) != 0)
    return make_error(error_code::invalid_argument,
                      fmt::format("{}: {} hidden values are not whole rows of {}", source_, hidden.size(), d));
  const auto n = takes_tokens() ? static_cast<int64_t>(tokens.size()) : static_cast<int64_t>(hidden.size()) / d;
  all_logits = all_logits && returns_logits();  // other stages return every row anyway
  if (n == 0) return make_error(error_code::invalid_argument, "session: no tokens to run");
  if (position + n > context_)
    return make_error(error_code::limit_exceeded,
                      fmt::format("{}: {} more tokens after {} would pass the context of {} positions (the model was "
                                  "trained for {})",
                                  source_, n, position, context_, config_.max_context));
  for (const int32_t t : tokens)
    if (auto ok = check_token(t); !ok) return forward_error(ok);
  const auto t0 = clock::now();
  std::vector<float> result;  // logits, or the hidden rows of a stage before the last
  for (int64_t done = 0; done < n;) {
    const int64_t count = std::min(n - done, options_.max_batch);
    const int64_t batch = count == 1 && !all_logits ? 1 : std::max(options_.min_batch, next_pow2(count));
    auto id = program(batch, attended_for(batch, position + count), all_logits);
    if (!id) return forward_error(id);
    tensor_map inputs;
    if (takes_tokens()) {
      std::vector<int32_t> padded(static_cast<size_t>(batch), 0);
      std::copy(tokens.begin() + done, tokens.begin() + done + count, padded.begin());
      inputs.emplace("tokens", tensor::from_ints({batch}, padded));
    } else {  // padding rows are zeros: they change no real row
      std::vector<float> padded(static_cast<size_t>(batch * d), 0.0f);
      std::copy(hidden.begin() + done * d, hidden.begin() + (done + count) * d, padded.begin());
      inputs.emplace("hidden", tensor::from_floats({batch, d}, padded));
    }
    inputs.emplace("start", tensor::from_ints({1}, {static_cast<int32_t>(position)}));
    inputs.emplace("count", tensor::from_ints({1}, {static_cast<int32_t>(count)}));
    if (slots() > 1) inputs.emplace("slot", tensor::from_ints({1}, {static_cast<int32_t>(slot)}));
    auto out = ex_->run(*id, inputs);
    if (!out) return make_error(out.error().code, source_ + ": running a step: " + out.error().message);
    position += count;
    done += count;
    if (!returns_logits()) {
      auto values = out->at("hidden").to_floats();
      result.insert(result.end(), values.begin(), values.begin() + count * d);  // the real rows
    } else if (all_logits) {
      auto values = out->at("logits").to_floats();
      values.resize(static_cast<size_t>(count * config_.vocab_size));  // drop the padding rows
      result.insert(result.end(), values.begin(), values.end());
    } else {
      result = out->at("logits").to_floats();
    }
  }
  const double dt = seconds_since(t0);
  if (n == 1 && !all_logits) {
    stats_.decode_tokens += 1;
    stats_.decode_steps += 1;
    stats_.decode_seconds += dt;
  } else {
    stats_.prefill_tokens += n;
    stats_.prefill_seconds += dt;
  }
  return result;
}

expected<std::vector<float>> session::prefill(std::span<const int32_t> tokens) {
  if (auto ok = need_whole("prefill"); !ok) return forward_error(ok);
  return step(0, tokens, {}, false);
}

expected<std::vector<float>> session::decode(int32_t token) {
  if (auto ok = need_whole("decode"); !ok) return forward_error(ok);
  return step(0, std::span<const int32_t>(&token, 1), {}, false);
}

int64_t session::greedy_chunk() const {
  // Long enough that the device rarely waits for the host between chunks, short enough that a
  // stream's pieces come often and little is decoded past a stop.
  return layers().whole(config_.n_layers) ? 16 : 0;
}

expected<gpu::program_id> session::greedy_program(int64_t attended) {
  if (auto it = greedy_programs_.find(attended); it != greedy_programs_.end()) return it->second;
  const auto t0 = clock::now();
  step_shape shape{1, context_, attended, false, layers(), slots(), false, true};
  auto g = build_step_graph(config_, *weights_, shape, options_.prefix);
  if (!g) return forward_error(g);
  auto id = ex_->load(*g);
  if (!id) return make_error(id.error().code, fmt::format("{}: loading the greedy step graph ({} attended): {}", source_,
                                                          attended, id.error().message));
  greedy_programs_.emplace(attended, *id);
  stats_.compile_seconds += seconds_since(t0);
  ++stats_.programs;
  return *id;
}

expected<std::vector<int32_t>> session::decode_greedy(int64_t slot, int32_t token, int64_t count) {
  if (greedy_chunk() == 0) return sequence_model::decode_greedy(slot, token, count);
  if (auto ok = check_slot(slot); !ok) return forward_error(ok);
  int64_t& position = positions_[static_cast<size_t>(slot)];
  if (count < 1 || count > gpu::executor::max_repeated_runs)
    return make_error(error_code::invalid_argument, fmt::format("{}: decode_greedy of {} tokens; 1 to {} are possible",
                                                                source_, count, gpu::executor::max_repeated_runs));
  if (auto ok = check_token(token); !ok) return forward_error(ok);
  if (position + count > context_)
    return make_error(error_code::limit_exceeded,
                      fmt::format("{}: {} more tokens after {} would pass the context of {} positions", source_, count,
                                  position, context_));
  const auto t0 = clock::now();
  auto program = greedy_program(attended_for(1, position + count));
  if (!program) return forward_error(program);
  const std::vector<std::string> state = {greedy_token_name(options_.prefix), greedy_position_name(options_.prefix)};
  const int32_t values[2] = {token, static_cast<int32_t>(position)};
  if (auto ok = ex_->write_parameters(state, std::span(reinterpret_cast<const uint8_t*>(values), sizeof values)); !ok)
    return make_error(ok.error().code, source_ + ": setting the greedy step's token: " + ok.error().message);
  tensor_map inputs;
  if (slots() > 1) inputs.emplace("slot", tensor::from_ints({1}, {static_cast<int32_t>(slot)}));
  auto out = ex_->run_repeated(*program, inputs, count);
  if (!out) return make_error(out.error().code, source_ + ": running greedy steps: " + out.error().message);
  greedy_history_.resize(static_cast<size_t>(slots() * context_) * sizeof(float));
  if (auto ok = ex_->read_parameters({greedy_history_name(options_.prefix)}, greedy_history_); !ok)
    return make_error(ok.error().code, source_ + ": reading the greedy steps' tokens: " + ok.error().message);
  std::vector<int32_t> picked;
  picked.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    float f;
    const int64_t row = slot * context_ + position + i;  // the history's rows are the cache's
    std::memcpy(&f, greedy_history_.data() + static_cast<size_t>(row) * sizeof(float), sizeof f);
    const auto t = static_cast<int32_t>(f);
    if (!(f >= 0 && f < static_cast<float>(config_.vocab_size))) {
      position += i;  // the steps before it are appended
      return make_error(error_code::invalid_argument,
                        fmt::format("{}: the logits after position {} have no largest value (NaN weights?)", source_,
                                    position));
    }
    picked.push_back(t);
  }
  position += count;
  stats_.decode_tokens += count;
  stats_.decode_steps += count;
  stats_.decode_seconds += seconds_since(t0);
  return picked;
}

expected<void> session::rewind(int64_t slot, int64_t position) {
  if (auto ok = check_slot(slot); !ok) return forward_error(ok);
  int64_t& at = positions_[static_cast<size_t>(slot)];
  if (position < 0 || position > at)
    return make_error(error_code::invalid_argument, fmt::format("{}: cannot rewind slot {} to position {} (it stands at {})",
                                                                source_, slot, position, at));
  at = position;  // later cache rows are never read before they are written again
  return {};
}

expected<std::vector<float>> session::forward(std::span<const int32_t> tokens, bool all_logits) {
  return step(0, tokens, {}, all_logits);
}

expected<std::vector<float>> session::forward(std::span<const float> hidden, bool all_logits) {
  if (hidden.empty()) return make_error(error_code::invalid_argument, "session: no hidden rows to run");
  return step(0, {}, hidden, all_logits);
}

expected<std::vector<float>> session::prefill_all_logits(std::span<const int32_t> tokens) {
  if (auto ok = need_whole("prefill_all_logits"); !ok) return forward_error(ok);
  if (static_cast<int64_t>(tokens.size()) > options_.max_batch)
    return make_error(error_code::invalid_argument,
                      fmt::format("session: {} tokens with every row's logits exceed one batch of {}", tokens.size(),
                                  options_.max_batch));
  return step(0, tokens, {}, true);
}

expected<std::vector<float>> session::prefill(int64_t slot, std::span<const int32_t> tokens) {
  if (auto ok = need_whole("prefill"); !ok) return forward_error(ok);
  return step(slot, tokens, {}, false);
}

int64_t session::head_rows(int64_t n) const { return next_pow2(n); }

expected<std::vector<float>> session::head(std::span<const float> hidden) {
  const int64_t d = config_.hidden_size;
  if (layers().size() != 0 || !returns_logits())
    return make_error(error_code::invalid_argument,
                      fmt::format("{}: head() needs a session of the head alone; this one holds layers {}", source_, to_string(layers())));
  if (hidden.empty() || hidden.size() % static_cast<size_t>(d) != 0)
    return make_error(error_code::invalid_argument,
                      fmt::format("{}: {} hidden values are not whole rows of {}", source_, hidden.size(), d));
  const auto n = static_cast<int64_t>(hidden.size()) / d;
  if (n > options_.max_batch)
    return make_error(error_code::invalid_argument, fmt::format("{}: {} rows for the head, more than one batch of {}", source_, n, options_.max_batch));
  const int64_t batch = head_rows(n);
  auto id = program(batch, head_attended(), true);
  if (!id) return forward_error(id);
  std::vector<float> padded(static_cast<size_t>(batch * d), 0.0f);
  std::copy(hidden.begin(), hidden.end(), padded.begin());
  tensor_map inputs;
  inputs.emplace("hidden", tensor::from_floats({batch, d}, padded));
  inputs.emplace("start", tensor::from_ints({1}, {0}));
  inputs.emplace("count", tensor::from_ints({1}, {static_cast<int32_t>(n)}));
  if (slots() > 1) inputs.emplace("slot", tensor::from_ints({1}, {0}));
  auto out = ex_->run(*id, inputs);
  if (!out) return make_error(out.error().code, source_ + ": running the head: " + out.error().message);
  auto logits = out->at("logits").to_floats();
  logits.resize(static_cast<size_t>(n * config_.vocab_size));  // drop the padding rows
  return logits;
}

expected<std::vector<float>> session::forward(int64_t slot, std::span<const int32_t> tokens, std::span<const float> hidden) {
  if (tokens.empty() && hidden.empty()) return make_error(error_code::invalid_argument, "session: no rows to run");
  return step(slot, tokens, hidden, false);
}

expected<std::vector<float>> session::forward(std::span<const batch_row> rows, std::span<const int32_t> tokens,
                                              std::span<const float> hidden) {
  return batch_step(rows, tokens, hidden);
}

expected<std::vector<std::vector<float>>> session::decode(std::span<const slot_token> batch) {
  if (auto ok = need_whole("decode"); !ok) return forward_error(ok);
  if (batch.empty()) return make_error(error_code::invalid_argument, "session: an empty decode batch");
  std::vector<batch_row> rows;
  std::vector<int32_t> tokens;
  for (const auto& e : batch) {
    if (auto ok = check_slot(e.slot); !ok) return forward_error(ok);
    rows.push_back({e.slot, position(e.slot)});
    tokens.push_back(e.token);
  }
  auto logits = batch_step(rows, tokens, {});
  if (!logits) return forward_error(logits);
  const auto vocab = static_cast<std::ptrdiff_t>(config_.vocab_size);
  std::vector<std::vector<float>> result;
  result.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto at = logits->begin() + static_cast<std::ptrdiff_t>(i) * vocab;
    result.emplace_back(at, at + vocab);
  }
  return result;
}

expected<std::vector<float>> session::batch_step(std::span<const batch_row> batch, std::span<const int32_t> tokens,
                                                 std::span<const float> hidden) {
  if (batch.empty()) return make_error(error_code::invalid_argument, "session: an empty decode batch");
  const int64_t d = config_.hidden_size;
  const auto n = static_cast<int64_t>(batch.size());
  if (takes_tokens() ? static_cast<int64_t>(tokens.size()) != n || !hidden.empty()
                     : static_cast<int64_t>(hidden.size()) != n * d || !tokens.empty())
    return make_error(error_code::invalid_argument,
                      fmt::format("{}: a batch of {} rows needs {} for layers {} of {}", source_, n,
                                  takes_tokens() ? fmt::format("{} tokens", n) : fmt::format("{} hidden values", n * d),
                                  to_string(layers()), config_.n_layers));
  if (slots() == 1) {  // one sequence: the plain step (no batched program for one slot)
    if (n > 1)
      return make_error(error_code::invalid_argument, fmt::format("{}: slot 0 named {} times in one decode batch", source_, n));
    if (auto ok = check_slot(batch[0].slot); !ok) return forward_error(ok);
    if (batch[0].position != positions_[0])
      return make_error(error_code::invalid_argument,
                        fmt::format("{}: a step at position {} of slot 0, which stands at {} (it missed a step)", source_,
                                    batch[0].position, positions_[0]));
    return step(0, tokens, hidden, false);  // one row: [vocab] logits or one hidden row
  }
  // Row i is the batch's i-th sequence, in whichever slot it is (the "slots" input): the step has
  // as many rows as the batch (in buckets of powers of two, at most the slots); the rows past it
  // are idle.
  int64_t longest = 0;
  std::vector<bool> named(static_cast<size_t>(slots()), false);
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& e = batch[i];
    if (auto ok = check_slot(e.slot); !ok) return forward_error(ok);
    if (named[static_cast<size_t>(e.slot)])
      return make_error(error_code::invalid_argument,
                        fmt::format("{}: slot {} named twice in one decode batch", source_, e.slot));
    named[static_cast<size_t>(e.slot)] = true;
    if (takes_tokens())
      if (auto ok = check_token(tokens[i]); !ok) return forward_error(ok);
    const int64_t pos = positions_[static_cast<size_t>(e.slot)];
    if (e.position != pos)
      return make_error(error_code::invalid_argument,
                        fmt::format("{}: a step at position {} of slot {}, which stands at {} (it missed a step)", source_,
                                    e.position, e.slot, pos));
    if (pos + 1 > context_)
      return make_error(error_code::limit_exceeded,
                        fmt::format("{}: the sequence in slot {} is at the context of {} positions", source_, e.slot, context_));
    longest = std::max(longest, pos + 1);
  }
  const int64_t rows = std::min(slots(), next_pow2(n));
  auto id = program(rows, attended_for(rows, longest), true, true);
  if (!id) return forward_error(id);
  const auto t0 = clock::now();
  std::vector<int32_t> positions(static_cast<size_t>(rows), -1), row_slots(static_cast<size_t>(rows), 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    positions[i] = static_cast<int32_t>(batch[i].position);
    row_slots[i] = static_cast<int32_t>(batch[i].slot);
  }
  tensor_map inputs;
  if (takes_tokens()) {
    std::vector<int32_t> in(static_cast<size_t>(rows), 0);
    std::copy(tokens.begin(), tokens.end(), in.begin());
    inputs.emplace("tokens", tensor::from_ints({rows}, in));
  } else {  // idle rows are zeros: they change no real row
    std::vector<float> in(static_cast<size_t>(rows * d), 0.0f);
    std::copy(hidden.begin(), hidden.end(), in.begin());
    inputs.emplace("hidden", tensor::from_floats({rows, d}, in));
  }
  inputs.emplace("positions", tensor::from_ints({rows}, positions));
  inputs.emplace("slots", tensor::from_ints({rows}, row_slots));
  auto out = ex_->run(*id, inputs);
  if (!out) return make_error(out.error().code, source_ + ": running a batched decode step: " + out.error().message);
  // The first n output rows, of width w, are the batch's, in its order.
  const bool logits = returns_logits();
  const auto values = out->at(logits ? "logits" : "hidden").to_floats();
  const int64_t w = logits ? config_.vocab_size : d;
  std::vector<float> result(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n * w));
  for (const auto& e : batch) ++positions_[static_cast<size_t>(e.slot)];
  stats_.decode_tokens += n;
  stats_.decode_steps += 1;
  stats_.decode_seconds += seconds_since(t0);
  return result;
}

}  // namespace mesh::models
