#pragma once
/// Text generation on a sequence model (a session, or a pipeline of stages over the mesh): prefill the prompt, then sample and decode token by token,
/// streaming whole UTF-8 pieces to a callback, until an end-of-sequence token, a stop string or
/// max_tokens.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "models/sampler.hpp"
#include "models/sequence_model.hpp"
#include "models/session.hpp"
#include "models/tokenizer.hpp"

namespace mesh::models {

struct generate_options {
  sampling_options sampling;
  int64_t max_tokens = 256;
  /// Generation ends when the decoded text contains one of these; the stop string and anything
  /// after it are not emitted (text that might begin one is held back until it cannot).
  std::vector<std::string> stop;
  /// End at the vocabulary's EOS or any of the config's eos ids (not emitted).
  bool stop_at_eos = true;
  /// Called after each token is sampled with the number generated so far (that one included),
  /// before its text is emitted; false ends generation (reason callback). Unlike the piece
  /// callback it runs for every token, also one that adds no text yet (part of a UTF-8
  /// character, a control token, text held back for a stop string): a node counts tokens and
  /// notices a withdrawn request with it.
  std::function<bool(int64_t tokens)> on_token;
  /// >= 0: give each generated token's log-probability and this many alternatives (at most
  /// max_top_logprobs); -1: none.
  int32_t logprobs = -1;
  /// With logprobs: called just before the piece callback with the tokens whose entries go out
  /// with that piece. A token's entry goes with the piece its text starts in (a token with no
  /// text of its own, such as the first part of a UTF-8 character, with the next that has);
  /// tokens whose text a stop string cut, and an ending EOS, have none; at max_tokens any left
  /// go out last, with a piece that may be empty.
  std::function<void(std::vector<token_logprob> tokens)> on_logprobs;
};

enum class stop_reason { eos, stop_string, max_tokens, callback };

/// "eos", "stop_string", "max_tokens", "callback".
const char* to_string(stop_reason r);

struct generation {
  std::vector<int32_t> tokens;  ///< generated ids (an ending EOS included)
  std::string text;             ///< what was emitted
  stop_reason reason = stop_reason::max_tokens;
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;      ///< prefill
  double generate_seconds = 0;    ///< sampling and decoding after the prefill
  std::vector<token_logprob> logprobs;  ///< with options.logprobs >= 0: every entry given out
};

/// Called with each piece of text as it is decided (never a split UTF-8 character); return false
/// to end generation (reason callback). Empty only for the last call of a generation whose last
/// log-probabilities came with no text (generate_options::on_logprobs).
using piece_callback = std::function<bool(std::string_view piece)>;

/// Generates after `prompt` (token ids, e.g. tokenizer::encode of a rendered chat), continuing
/// from the session's position (reset() it first for a fresh sequence). A prompt plus max_tokens
/// beyond the session's context is an error before anything runs; so are bad sampling options.
expected<generation> generate(sequence_model& s, const tokenizer& tok, std::span<const int32_t> prompt,
                              const generate_options& options, const piece_callback& on_piece = {});

/// One generation as steps, for a caller that runs the model itself (a server that batches the
/// decode steps of several requests). generate() is this with a sequence model:
///
///   auto run = generation_run::start(tok, config, prompt, position, context, options, on_piece);
///   auto logits = model.prefill(prompt);          // timed by the caller: run->prompt_done(seconds)
///   while (auto next = run->next(*logits)) {      // samples, emits text
///     if (!*next) break;                          // ended: run->finish()
///     logits = model.decode(**next);
///   }
class generation_run {
 public:
  /// Checks the options (sampling, max_tokens, logprobs) and that `position` + the prompt + max_tokens
  /// fit `context`; errors as generate()'s. `tok` must outlive the run.
  static expected<generation_run> start(const tokenizer& tok, const model_config& config,
                                        std::span<const int32_t> prompt, int64_t position, int64_t context,
                                        const generate_options& options, piece_callback on_piece = {});
  generation_run(generation_run&&) noexcept;
  generation_run& operator=(generation_run&&) noexcept;
  ~generation_run();

  /// Records the prefill's time (generation::prompt_seconds); the generation time counts from here.
  void prompt_done(double seconds);
  /// Takes the logits after the last token the model was given, samples the next token, emits
  /// its text (callbacks run here) and returns the token to give the model next, or nullopt when
  /// the generation has ended (then finish()). An error (a token the tokenizer cannot decode)
  /// ends it too.
  expected<std::optional<int32_t>> next(std::span<const float> logits);
  /// next() for a token picked elsewhere (greedy decoding on the device: the sampling options
  /// must be greedy, without logprobs).
  expected<std::optional<int32_t>> next_token(int32_t token);
  /// Whether next() would pick the first index of the largest logit and report nothing else of
  /// the logits (greedy, no repetition penalty, no logprobs): then next_token may take its place.
  bool greedy() const;
  /// What decode_chunk did: the tokens the model decoded, and the generation's answer after the
  /// last one it took (as next_token's).
  struct chunk_result {
    int64_t decoded = 0;
    expected<std::optional<int32_t>> next = std::optional<int32_t>{};
  };
  /// Greedy decoding on the device, a chunk at a time: `token` (the one to decode next) and then
  /// up to model.greedy_chunk() - 1 more through model.decode_greedy for the sequence in `slot`,
  /// each picked token handed to next_token; when the generation ends inside the chunk the model
  /// is rewound to where one step at a time would have left it. Errors: the model's
  /// (decode_greedy, rewind). For greedy() runs on a model with greedy_chunk() > 0.
  expected<chunk_result> decode_chunk(sequence_model& model, int64_t slot, int32_t token);
  /// Tokens generated so far.
  size_t generated() const;
  /// Ends the generation (emitting what was held back when it ended by EOS or max_tokens) and
  /// returns it. Call once, after next() returned nullopt.
  generation finish();

 private:
  struct state;
  explicit generation_run(std::unique_ptr<state> s);
  /// Records `token` as the next one (with its logprobs entry) and emits its text.
  expected<std::optional<int32_t>> accept(int32_t token, std::optional<token_logprob> entry);
  std::unique_ptr<state> s_;
};

}  // namespace mesh::models
