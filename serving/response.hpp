#pragma once
/// Response bodies of the OpenAI-compatible API, as JSON text: pure functions, no I/O.
/// Non-streamed: one `chat.completion` or `text_completion` object. Streamed: server-sent
/// events, each `data: <json>\n\n`: a first chat chunk with the assistant's role, one chunk per
/// piece of text, a last chunk with finish_reason, an optional usage chunk (empty choices), then
/// `data: [DONE]\n\n`.
///
/// Log-probabilities, when asked for, take OpenAI's two shapes: chat choices carry
/// `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
/// "refusal": null}`; text completions carry `{"tokens", "token_logprobs", "top_logprobs":
/// [{token: logprob}], "text_offset"}`. A token that is part of a UTF-8 character shows U+FFFD in
/// "token" and its real bytes in "bytes".
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "serving/api_error.hpp"
#include "serving/backend.hpp"

namespace mesh::serving {

/// What every object of one response shares.
struct response_meta {
  std::string id;        ///< "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;   ///< unix seconds
  std::string model;
  bool chat = true;      ///< chat.completion(.chunk) or text_completion
  bool logprobs = false;  ///< log-probabilities were asked for: choices carry them (else null)
};

/// A fresh id of the endpoint's form: "chatcmpl-" or "cmpl-" and 24 random hex digits.
std::string make_response_id(bool chat);

/// The whole answer to a non-streamed request.
std::string completion_json(const response_meta& meta, const generation_result& r);

/// One event: `data: ` + JSON + blank line.
std::string sse_event(std::string_view json);
/// The event that ends a stream: `data: [DONE]\n\n`.
std::string sse_done();

/// Chat: the first chunk, `delta: {"role": "assistant", "content": ""}`. (Text completions have
/// no such chunk.) `usage_null`: include_usage was asked, so every chunk carries "usage": null.
std::string first_chunk_json(const response_meta& meta, bool usage_null);
/// A chunk carrying a piece of text, and the log-probabilities of the tokens it carries.
std::string piece_chunk_json(const response_meta& meta, std::string_view piece, std::span<const token_logprobs> logprobs,
                             bool usage_null);
/// The chunk with finish_reason (empty delta / text).
std::string finish_chunk_json(const response_meta& meta, finish_reason reason, bool usage_null);
/// The usage chunk: empty choices, usage counts (only when include_usage was asked).
std::string usage_chunk_json(const response_meta& meta, const generation_result& r);

/// `GET /v1/models`: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}.
std::string models_json(std::span<const model_info> models);
/// `GET /v1/models/{id}`: one of them.
std::string model_json(const model_info& m);

}  // namespace mesh::serving
