#pragma once
/// Request bodies of the OpenAI-compatible API, decoded into typed requests: pure functions of
/// the body's bytes, no I/O. Parameters that the backend can honour are mapped; parameters that
/// would change the result but cannot be honoured (n > 1, tools, penalties other than
/// repetition_penalty, ...) are refused with a 400 naming the parameter, as is any parameter
/// OpenAI does not define (OpenAI refuses those too); harmless ones (`user`, `metadata`,
/// `store`, ...) are accepted and ignored. docs/serving.md lists them.
#include <cstdint>
#include <string_view>

#include "serving/api_error.hpp"
#include "serving/backend.hpp"

namespace mesh::serving {

/// Bounds on what a request may carry, beyond the server's body size limit.
struct request_limits {
  size_t max_messages = 1024;
  size_t max_stop = 4;            ///< as OpenAI
  size_t max_stop_bytes = 256;    ///< per stop string
  int max_json_depth = 32;        ///< nesting of arrays and objects
};

/// A decoded request: what to generate, and how to answer.
struct api_request {
  generation_request generation;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage: a last chunk with usage
};

/// `POST /v1/chat/completions`. Without `seed`, `default_seed` is used (the server passes a
/// fresh random one: OpenAI's output varies between calls unless a seed is given). Without
/// `temperature`, 1 (OpenAI's default).
result<api_request> parse_chat_request(std::string_view body, uint64_t default_seed, const request_limits& limits = {});

/// `POST /v1/completions`: `prompt` is a string or an array of one string.
result<api_request> parse_completion_request(std::string_view body, uint64_t default_seed,
                                             const request_limits& limits = {});

/// Nesting depth of JSON text (arrays and objects; brackets inside strings do not count), read
/// without parsing, so that a deeply nested body is refused before a parser recurses into it.
int json_depth(std::string_view text);

}  // namespace mesh::serving
