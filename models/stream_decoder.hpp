#pragma once
/// Token ids in, text out as generation goes: a chunk never ends inside a UTF-8 character (a
/// character spread over several byte tokens comes out whole, with the token that completes it).
#include <cstdint>
#include <string>

#include "base/error.hpp"
#include "models/tokenizer.hpp"

namespace mesh::models {

class stream_decoder {
 public:
  /// `tok` must outlive the decoder.
  explicit stream_decoder(const tokenizer& tok, decode_options options = {});

  /// The text that `id` completes: possibly empty (the start of a character), possibly more than
  /// the token's own bytes (the rest of an earlier character). Always valid UTF-8: bytes that can
  /// never form a character become U+FFFD. An id out of range is an error and changes nothing.
  expected<std::string> push(int32_t id);

  /// What is left at the end (an unfinished character becomes U+FFFD), and a fresh start.
  std::string finish();

 private:
  const tokenizer* tok_;
  decode_options options_;
  std::string pending_;  ///< at most 3 bytes: the start of a character
  bool first_text_ = true;
};

}  // namespace mesh::models
