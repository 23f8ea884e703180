#pragma once
/// The accounting of one generation through a node: what the client is sent as models::generate
/// emits text (pieces with the tokens generated so far) and when it ends (counts, timings,
/// finish reason, or the error). Pure: the worker feeds it what the session reports.
#include <cstdint>
#include <string_view>

#include "actors/generate_request_check.hpp"
#include "base/error.hpp"
#include "models/generate.hpp"
#include "wire/messages.hpp"

namespace mesh::generation {

class generation_stream {
 public:
  explicit generation_stream(uint64_t request) : request_(request) {}

  /// generate_options::on_token reported `tokens` generated so far.
  void token(int64_t tokens);
  /// The message for a piece of text models::generate emitted, with the tokens counted so far
  /// (its text belongs to them: a piece is emitted after on_token of its last token).
  msg::generate_piece piece(std::string_view text) const;

  /// The final message of a generation that ran: counts from `g`, its timings, the finish reason
  /// (finish_of), and `load_seconds` (0 when the model was already loaded).
  msg::generate_done done(const models::generation& g, const context_fit& fit, double load_seconds) const;

  /// Tokens reported so far.
  uint32_t tokens() const { return tokens_; }

 private:
  uint64_t request_;
  uint32_t tokens_ = 0;
};

/// The final message of a request that failed before or while generating.
msg::generate_done failed(uint64_t request, const error& e);

/// The final message of a request withdrawn before it ran.
msg::generate_done cancelled(uint64_t request);

}  // namespace mesh::generation
