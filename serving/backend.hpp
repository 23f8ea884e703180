#pragma once
/// What the HTTP server asks of whatever generates text: a model by id, a prompt (or chat
/// messages the backend renders with the model's own chat template), sampling options, stop
/// strings and a token limit; pieces of text streamed back through a callback, then one final
/// outcome. The server knows nothing about sessions, executors or nodes: local_backend runs
/// models on this process's executor, and a mesh backend can forward to a node behind the same
/// interface (no CAF or wire types here).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/chat_template.hpp"
#include "models/generate.hpp"
#include "models/sampler.hpp"
#include "serving/api_error.hpp"

namespace mesh::serving {

/// One generation, as the API asked for it.
struct generation_request {
  std::string model;
  /// Chat: render `messages` with the model's chat template (and the assistant's turn opened);
  /// otherwise `prompt` is the text to continue.
  bool chat = false;
  std::vector<models::chat_message> messages;
  std::string prompt;
  models::sampling_options sampling;
  /// Tokens to generate at most; none: up to the model's context.
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;
  /// Go on past the end-of-sequence token (only max_tokens, the context or a stop string end it).
  bool ignore_eos = false;
  /// With chat: a chat template family by name ("chatml", "llama3", ...) instead of the model's.
  std::string chat_template;
  /// `model` may also be a checkpoint path: a loaded model of that path serves it, or the
  /// backend loads it on demand (a node's own clients; never the HTTP API).
  bool by_path = false;
  /// With by_path: a PEFT LoRA adapter directory merged into the checkpoint at load (the model
  /// of that path and adapter is another model than the plain checkpoint's).
  std::string adapter;
  /// A max_tokens past the context is shortened to the room left (the result says
  /// context_capped) instead of refused.
  bool cap_to_context = false;
  /// >= 0: each generated token's log-probability and this many alternatives (at most
  /// models::max_top_logprobs); -1: none.
  int32_t logprobs = -1;
};

/// A token as the API shows it: its bytes (possibly part of a UTF-8 character, which is why
/// OpenAI's entries carry `bytes`) and its log-probability.
struct token_choice {
  std::string bytes;
  double logprob = 0;
};

/// One generated token's log-probabilities (generation_request::logprobs >= 0); the rule for
/// which piece an entry comes with is models::generate_options::on_logprobs's.
struct token_logprobs {
  token_choice token;
  std::vector<token_choice> top;  ///< the most likely tokens at that step, highest first
  int64_t text_offset = 0;        ///< where the token's text starts in the generated text, in code points
};

/// Why a finished generation ended, in the API's terms.
enum class finish_reason {
  stop,    ///< end of sequence or a stop string
  length,  ///< max_tokens (or the context) reached
};

/// "stop", "length".
const char* to_string(finish_reason r);

struct generation_result {
  finish_reason reason = finish_reason::stop;
  std::string text;  ///< everything the pieces carried, joined
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double queue_seconds = 0;     ///< from start() to the generation starting
  double prompt_seconds = 0;    ///< prefill
  double generate_seconds = 0;  ///< sampling and decoding after the prefill
  double load_seconds = 0;      ///< loading the model on demand for this request (0: it was loaded)
  models::stop_reason stop = models::stop_reason::max_tokens;  ///< how models::generate ended
  bool context_capped = false;  ///< max_tokens was shortened to the context (cap_to_context)
  std::vector<token_logprobs> logprobs;  ///< with request.logprobs >= 0
};

using generation_outcome = result<generation_result>;

/// Called from a backend thread, one at a time for a request (different requests' callbacks may
/// run at once, from different threads: a split model steps its micro-batches from several).
/// `on_piece` gets each piece of text as it is decided (whole
/// UTF-8 characters) with the log-probabilities of the tokens it carries (when asked for; the
/// last piece may then be empty); `on_done` is called exactly once, last: the result, or a
/// failure (a cancelled request ends with failure_kind::cancelled).
struct generation_callbacks {
  std::function<void(std::string_view piece, std::span<const token_logprobs> logprobs)> on_piece;
  std::function<void(generation_outcome outcome)> on_done;
  /// Optional: after each token is sampled, with the number generated so far (before its text,
  /// if any, reaches on_piece).
  std::function<void(int64_t tokens)> on_token;
};

/// A started request. cancel() may be called from any thread, any number of times; the
/// backend stops at the next token (or before starting, if still queued) and reports cancelled.
class request_handle {
 public:
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> cancelled_{false};
};

/// Where a range of a model's layers runs (a model split over the mesh).
struct model_stage_info {
  std::string node;  ///< node id, hex
  int64_t first_layer = 0;
  int64_t end_layer = 0;  ///< one past the last
};

/// A model a backend serves.
struct model_info {
  std::string id;
  int64_t context = 0;  ///< positions a request may use (prompt plus generated tokens)
  int64_t created = 0;  ///< unix seconds when it was loaded
  bool chat = false;    ///< whether it has a chat template (chat completions need one)
  std::string path;     ///< the checkpoint it was loaded from
  int64_t layers = 0;
  bool on_demand = false;  ///< loaded for a request naming its path (unloaded when others are needed)
  /// Split over the mesh: its stages in order; empty: every layer in this process.
  std::vector<model_stage_info> stages;
};

/// Requests a backend holds now (metrics: queue depth).
struct backend_queue {
  int64_t running = 0;
  int64_t waiting = 0;
};

class generation_backend {
 public:
  virtual ~generation_backend() = default;

  virtual std::vector<model_info> models() const = 0;

  virtual backend_queue queue() const = 0;

  /// Checks and queues a request. What can be known at once fails here, with no callback called:
  /// an unknown model, a prompt longer than the context, a conversation the chat template
  /// refuses, a full queue. Otherwise the callbacks run later on a backend thread.
  virtual result<std::shared_ptr<request_handle>> start(generation_request request, generation_callbacks callbacks) = 0;
};

}  // namespace mesh::serving
