#pragma once
/// What a node checks in a generate_request before it touches a model, and how the request's
/// numbers become models::generate's options. Pure: no files, no device (the fuzzer runs it on
/// every generate_request it decodes).
#include <cstdint>
#include <string>

#include "base/error.hpp"
#include "models/generate.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

/// Bounds on a request from a peer, beyond what the codec already bounds.
struct request_limits {
  uint32_t max_tokens = 1u << 20;   ///< the context refuses more anyway; this keeps numbers sane
  size_t max_stop_strings = 16;
  size_t max_stop_bytes = 256;      ///< per stop string
  size_t max_path_bytes = 4096;     ///< PATH_MAX
};

/// The options models::generate runs with, or an invalid_argument error whose message names the
/// field and the value: an empty model path or prompt, max_tokens 0 or past the limit, a
/// temperature that is negative or not finite, top_k < 0, top_p outside (0, 1], min_p outside
/// [0, 1], repeat_penalty not > 0, too many, empty or too long stop strings.
expected<models::generate_options> check_request(const msg::generate_request& r, const request_limits& limits = {});

/// How many tokens a generation may make in a session of `context` positions after a prompt of
/// `prompt_tokens`: `max_tokens`, or the room left when that is less (then `capped`, and a
/// generation that uses it all ends for `context`, not `length`).
struct context_fit {
  int64_t max_tokens = 0;
  bool capped = false;
};

/// A prompt that leaves no room for one generated token is a limit_exceeded error naming both
/// numbers; `model` names the checkpoint in it.
expected<context_fit> fit_context(int64_t prompt_tokens, int64_t max_tokens, int64_t context, const std::string& model);

/// The wire's finish reason for how models::generate ended (`capped` from fit_context;
/// stop_reason::callback is a cancellation, the only reason the node's callback says stop).
finish_reason finish_of(models::stop_reason r, const context_fit& fit);

}  // namespace mesh::generation
