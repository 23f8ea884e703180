#include "models/generate.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>

#include "models/stream_decoder.hpp"

namespace mesh::models {

namespace {

using clock = std::chrono::steady_clock;

// Holds back text that may be the start of a stop string; emits the rest.
class stop_filter {
 public:
  explicit stop_filter(const std::vector<std::string>& stops) : stops_(stops) {}

  /// Adds text; returns what is safe to emit. Sets stopped() when a stop string appeared.
  std::string push(std::string_view text) {
    pending_ += text;
    size_t first = std::string::npos;
    for (const auto& s : stops_)
      if (!s.empty()) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
      stopped_ = true;
      std::string out = pending_.substr(0, first);
      pending_.clear();
      return out;
    }
    // Keep the longest tail that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stops_)
      for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); k > keep; --k)
        if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    // A held-back tail starts at a character boundary: stop strings are whole UTF-8, and so is
    // the text before the tail, since the tail begins where a stop string's first byte matched.
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
  }
  /// What is left when generation ends without a stop string.
  std::string finish() { return std::exchange(pending_, {}); }
  bool stopped() const { return stopped_; }

 private:
  const std::vector<std::string>& stops_;
  std::string pending_;
  bool stopped_ = false;
};

// Hands each token's log-probabilities out with the piece its text starts in (generate.hpp says
// the rule). Offsets are bytes of the decoder's output, of which the emitted text is a prefix.
class logprob_queue {
 public:
  /// A token whose text is [start, end) of the decoder's output (start == end: none yet).
  void add(token_logprob e, size_t start, size_t end) { pending_.push_back({std::move(e), start, end}); }

  /// The decoder's last bytes, [from, to): they finish the waiting tokens that had no text.
  void finish_text(size_t from, size_t to) {
    for (auto& p : pending_)
      if (p.start == from && p.end == from) p.end = to;
  }

  /// The entries that go out now that `text` has been emitted; `all`: every one left.
  std::vector<token_logprob> release(const std::string& text, bool all) {
    size_t n = 0;
    for (size_t i = 0; i < pending_.size(); ++i)
      if (all || (pending_[i].end > pending_[i].start && pending_[i].start < text.size())) n = i + 1;
    std::vector<token_logprob> out;
    for (size_t i = 0; i < n; ++i) {
      token_logprob e = std::move(pending_[i].entry);
      e.text_offset = code_points_before(text, std::min(pending_[i].start, text.size()));
      out.push_back(std::move(e));
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
    return out;
  }

 private:
  // Code points in text[0, byte): counted on from the last call (offsets only grow).
  int64_t code_points_before(const std::string& text, size_t byte) {
    for (; counted_bytes_ < byte; ++counted_bytes_)
      if ((static_cast<unsigned char>(text[counted_bytes_]) & 0xC0) != 0x80) ++counted_points_;
    return counted_points_;
  }

  struct waiting {
    token_logprob entry;
    size_t start = 0, end = 0;
  };
  std::vector<waiting> pending_;
  size_t counted_bytes_ = 0;
  int64_t counted_points_ = 0;
};

}  // namespace

const char* to_string(stop_reason r) {
  switch (r) {
    case stop_reason::eos: return "eos";
    case stop_reason::stop_string: return "stop_string";
    case stop_reason::max_tokens: return "max_tokens";
    case stop_reason::callback: return "callback";
  }
  return "?";
}

struct generation_run::state {
  state(const tokenizer& t, generate_options o, piece_callback p, sampler sm)
      : options(std::move(o)), on_piece(std::move(p)), smp(std::move(sm)), decoder(t), stops(options.stop) {}

  generate_options options;
  piece_callback on_piece;
  sampler smp;
  std::vector<int32_t> eos, history;
  stream_decoder decoder;
  stop_filter stops;  // reads options.stop: `state` lives on the heap and never moves
  logprob_queue logprobs;
  size_t decoded = 0;  // bytes the decoder has given out
  generation out;
  clock::time_point t0 = clock::now();
  bool ended = false;

  // `last`: generation ended without a stop string, so every entry still waiting goes too.
  bool emit(const std::string& text, bool last) {
    out.text += text;
    std::vector<token_logprob> entries;
    if (options.logprobs >= 0) entries = logprobs.release(out.text, last);
    if (text.empty() && entries.empty()) return true;
    if (!entries.empty()) {
      out.logprobs.insert(out.logprobs.end(), entries.begin(), entries.end());
      if (options.on_logprobs) options.on_logprobs(std::move(entries));
    }
    return on_piece ? on_piece(text) : true;
  }
};

generation_run::generation_run(std::unique_ptr<state> s) : s_(std::move(s)) {}
generation_run::generation_run(generation_run&&) noexcept = default;
generation_run& generation_run::operator=(generation_run&&) noexcept = default;
generation_run::~generation_run() = default;

expected<generation_run> generation_run::start(const tokenizer& tok, const model_config& config,
                                               std::span<const int32_t> prompt, int64_t position, int64_t context,
                                               const generate_options& options, piece_callback on_piece) {
  auto smp = sampler::create(options.sampling);
  if (!smp) return forward_error(smp);
  if (prompt.empty()) return make_error(error_code::invalid_argument, "generate: the prompt is empty");
  if (options.max_tokens < 0)
    return make_error(error_code::invalid_argument, fmt::format("generate: max_tokens {} is negative", options.max_tokens));
  const auto prompt_n = static_cast<int64_t>(prompt.size());
  if (position + prompt_n + options.max_tokens > context)
    return make_error(error_code::limit_exceeded,
                      fmt::format("generate: {} prompt tokens after {} plus up to {} generated would pass the context of "
                                  "{} positions",
                                  prompt_n, position, options.max_tokens, context));
  if (options.logprobs > max_top_logprobs)
    return make_error(error_code::invalid_argument,
                      fmt::format("generate: {} alternatives per token asked, at most {}", options.logprobs, max_top_logprobs));
  auto s = std::make_unique<state>(tok, options, std::move(on_piece), std::move(*smp));
  if (options.stop_at_eos) {
    if (tok.vocab().eos_id) s->eos.push_back(*tok.vocab().eos_id);
    for (const int64_t e : config.eos_token_ids) s->eos.push_back(static_cast<int32_t>(e));
  }
  s->out.prompt_tokens = prompt_n;
  s->out.reason = stop_reason::max_tokens;
  s->history.assign(prompt.begin(), prompt.end());
  return generation_run(std::move(s));
}

void generation_run::prompt_done(double seconds) {
  s_->out.prompt_seconds = seconds;
  s_->t0 = clock::now();
}

bool generation_run::greedy() const {
  const auto& o = s_->options;
  return o.sampling.temperature <= 0.0f && o.sampling.repetition_penalty == 1.0f && o.logprobs < 0;
}

expected<std::optional<int32_t>> generation_run::next(std::span<const float> logits) {
  state& s = *s_;
  if (s.ended || static_cast<int64_t>(s.out.tokens.size()) >= s.options.max_tokens) return accept(0, std::nullopt);
  const int32_t next = s.smp.sample(logits, s.history);
  std::optional<token_logprob> entry;
  if (s.options.logprobs >= 0) entry = token_log_probabilities(logits, next, s.options.logprobs);
  return accept(next, std::move(entry));
}

size_t generation_run::generated() const { return s_->out.tokens.size(); }

expected<generation_run::chunk_result> generation_run::decode_chunk(sequence_model& model, int64_t slot, int32_t token) {
  const int64_t from = model.position(slot);
  const int64_t left = s_->options.max_tokens - static_cast<int64_t>(generated());
  auto picked = model.decode_greedy(slot, token, std::clamp<int64_t>(left, 1, std::max<int64_t>(model.greedy_chunk(), 1)));
  if (!picked) return forward_error(picked);
  chunk_result r;
  r.decoded = static_cast<int64_t>(picked->size());
  int64_t used = 0;
  for (const int32_t t : *picked) {
    ++used;
    r.next = next_token(t);
    if (!r.next || !*r.next) break;
  }
  // Ended inside the chunk: drop the positions decoded past the stop.
  if ((!r.next || !*r.next) && from + used < model.position(slot))
    if (auto ok = model.rewind(slot, from + used); !ok) return forward_error(ok);
  return r;
}

expected<std::optional<int32_t>> generation_run::next_token(int32_t token) { return accept(token, std::nullopt); }

expected<std::optional<int32_t>> generation_run::accept(int32_t next, std::optional<token_logprob> entry) {
  state& s = *s_;
  generation& out = s.out;
  const auto end = [&](stop_reason r) -> std::optional<int32_t> {
    out.reason = r;
    s.ended = true;
    return std::nullopt;
  };
  if (s.ended || static_cast<int64_t>(out.tokens.size()) >= s.options.max_tokens) return end(out.reason);
  out.tokens.push_back(next);
  s.history.push_back(next);
  if (s.options.on_token && !s.options.on_token(static_cast<int64_t>(out.tokens.size())))
    return end(stop_reason::callback);
  if (std::find(s.eos.begin(), s.eos.end(), next) != s.eos.end()) return end(stop_reason::eos);
  auto piece = s.decoder.push(next);
  if (!piece) {
    s.ended = true;
    return forward_error(piece);
  }
  if (entry) s.logprobs.add(std::move(*entry), s.decoded, s.decoded + piece->size());
  s.decoded += piece->size();
  const std::string safe = s.stops.push(*piece);
  if (!s.emit(safe, false)) return end(stop_reason::callback);
  if (s.stops.stopped()) return end(stop_reason::stop_string);
  // The last token needs no logits after it.
  if (static_cast<int64_t>(out.tokens.size()) == s.options.max_tokens) return end(stop_reason::max_tokens);
  return next;
}

generation generation_run::finish() {
  state& s = *s_;
  generation& out = s.out;
  if (out.reason == stop_reason::max_tokens || out.reason == stop_reason::eos) {
    const std::string tail = s.decoder.finish();
    s.logprobs.finish_text(s.decoded, s.decoded + tail.size());
    s.decoded += tail.size();
    const std::string rest = s.stops.push(tail);
    s.emit(s.stops.stopped() ? rest : rest + s.stops.finish(), !s.stops.stopped());
    if (s.stops.stopped()) out.reason = stop_reason::stop_string;
  }
  out.generate_seconds = std::chrono::duration<double>(clock::now() - s.t0).count();
  return std::move(out);
}

expected<generation> generate(sequence_model& s, const tokenizer& tok, std::span<const int32_t> prompt,
                              const generate_options& options, const piece_callback& on_piece) {
  auto run = generation_run::start(tok, s.config(), prompt, s.position(), s.context(), options, on_piece);
  if (!run) return forward_error(run);
  const auto t0 = clock::now();
  auto logits = s.prefill(prompt);
  if (!logits) return forward_error(logits);
  run->prompt_done(std::chrono::duration<double>(clock::now() - t0).count());
  auto next = run->next(*logits);
  if (!next) return forward_error(next);
  // Greedy on the device: chunks of steps with no host between them.
  while (*next && run->greedy() && s.greedy_chunk() > 0) {
    auto chunk = run->decode_chunk(s, 0, **next);
    if (!chunk) return forward_error(chunk);
    next = std::move(chunk->next);
    if (!next) return forward_error(next);
  }
  while (*next) {
    logits = s.decode(**next);
    if (!logits) return forward_error(logits);
    next = run->next(*logits);
    if (!next) return forward_error(next);
  }
  return run->finish();
}

}  // namespace mesh::models
