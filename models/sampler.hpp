#pragma once
/// Choosing the next token from logits. The steps, in order (those left at their neutral value
/// are skipped):
///   1. repetition penalty p over every distinct token already in the history (prompt and
///      generated): a positive logit is divided by p, a negative one multiplied (CTRL's rule, as
///      Hugging Face and llama.cpp apply it);
///   2. temperature <= 0: greedy, the highest logit (the lowest id on a tie); otherwise logits / T;
///   3. top-k: keep the k highest;
///   4. top-p: keep the smallest set of highest-probability tokens whose probabilities sum to at
///      least p (at least one token);
///   5. min-p: drop tokens whose probability is below min_p times the highest;
///   6. draw from the softmax of what remains.
/// The draw uses std::mt19937_64 seeded with `seed` and its 53 high bits as a double in [0, 1)
/// (not std::uniform_real_distribution, whose algorithm differs between standard libraries), so
/// the same seed, logits and history give the same token on every platform.
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace mesh::models {

struct sampling_options {
  float temperature = 0.0f;       ///< <= 0: greedy
  int32_t top_k = 0;              ///< 0: off
  float top_p = 1.0f;             ///< 1: off
  float min_p = 0.0f;             ///< 0: off
  float repetition_penalty = 1.0f;  ///< 1: off
  uint64_t seed = 0;
};

/// The most alternatives token_log_probabilities gives (OpenAI's limit for top_logprobs).
inline constexpr int32_t max_top_logprobs = 20;

/// A generated token's log-probability under the model: the log-softmax of the raw logits (before
/// the repetition penalty, temperature and truncation that chose it), as OpenAI's and vLLM's
/// `logprobs` report it.
struct token_logprob {
  int32_t id = 0;
  double logprob = 0;
  /// The most likely tokens at that step, highest first (the lower id first on a tie).
  std::vector<std::pair<int32_t, double>> top;
  /// Where the token's text starts in the generated text, in Unicode code points (set by
  /// generate; 0 here).
  int64_t text_offset = 0;
};

/// The log-softmax of `logits` at `chosen` (computed in double), and the `top` most likely
/// tokens (clamped to [0, max_top_logprobs] and to the vocabulary).
token_logprob token_log_probabilities(std::span<const float> logits, int32_t chosen, int32_t top);

/// The index of the first largest logit (greedy decoding); NaN logits are passed over (all NaN:
/// 0). Two passes that the compiler vectorises (the largest value, then its first index): on a
/// 128,256-token vocabulary several times faster than std::max_element's compare-and-branch
/// chain, which a decode step pays every token.
int32_t first_argmax(std::span<const float> logits);

class sampler {
 public:
  /// Checks the options (temperature finite, top_p in (0, 1], min_p in [0, 1], penalty > 0,
  /// top_k >= 0).
  static expected<sampler> create(const sampling_options& options);

  /// The next token given the logits of every token and the tokens so far.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  const sampling_options& options() const { return options_; }

 private:
  explicit sampler(const sampling_options& o) : options_(o), rng_(o.seed) {}
  double uniform();

  sampling_options options_;
  std::mt19937_64 rng_;
};

}  // namespace mesh::models
