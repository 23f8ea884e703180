#pragma once
/// Errors of the OpenAI-compatible API: an HTTP status and OpenAI's JSON error object
/// `{"error": {"message", "type", "param", "code"}}`, which clients (the `openai` packages among
/// them) read to raise their typed errors.
#include <string>

#include <tl/expected.hpp>

namespace mesh::serving {

/// Why a request failed, independent of HTTP: what a generation backend reports and what the
/// request parser finds. api_error maps each to its status.
enum class failure_kind {
  invalid_request,  ///< 400: a parameter is malformed, out of range or not supported
  unauthorized,     ///< 401: missing or wrong bearer key
  model_not_found,  ///< 404: no loaded model has that id
  too_long,         ///< 413: the body, or the prompt plus max_tokens, is larger than allowed
  queue_full,       ///< 429: the model's queue is full; retry later
  no_capacity,      ///< 503: the server cannot take work (stopping, nothing loaded)
  timeout,          ///< 504: the request did not finish within the server's timeout
  cancelled,        ///< the client went away or the request was cancelled (never sent)
  internal,         ///< 500: a bug or a device failure
};

/// "invalid_request", "model_not_found", ...
const char* to_string(failure_kind k);

/// A failure with the sentence a person can act on, and the request parameter it concerns
/// (empty when none).
struct failure {
  failure_kind kind = failure_kind::internal;
  std::string message;
  std::string param;
};

template <class T>
using result = tl::expected<T, failure>;

inline tl::unexpected<failure> fail(failure_kind kind, std::string message, std::string param = {}) {
  return tl::unexpected<failure>(failure{kind, std::move(message), std::move(param)});
}

/// The HTTP status of a failure kind (cancelled: 499, which is never sent to anyone).
int http_status(failure_kind k);

/// The JSON body OpenAI sends for an error of this kind: `type` and `code` as OpenAI spells
/// them where it has one ("invalid_request_error", "model_not_found", "invalid_api_key",
/// "context_length_exceeded", ...), `param` null when empty.
std::string error_body(const failure& f);

}  // namespace mesh::serving
