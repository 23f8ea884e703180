#pragma once
/// Text <-> token ids for a vocabulary of either kind: special and added tokens are split out of
/// the text first (longest match first), the rest goes to the byte-level BPE or SentencePiece
/// encoder. Cheap to share between threads (encode and decode are const and thread-safe).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "models/vocabulary.hpp"

namespace mesh::models {

struct encode_options {
  /// Put BOS/EOS around the text when the vocabulary asks for them (add_bos, add_eos).
  bool add_special = true;
  /// Recognise control tokens (`<|im_start|>`, `<s>`) written in the text. Off for untrusted
  /// text, which then cannot forge turns. User-defined added tokens are always recognised.
  bool parse_special = true;
  /// SentencePiece: the "▁" that add_space_prefix puts before the text's first piece. Off for text
  /// that continues text encoded before it (a chat turn's content after its header), so that the
  /// pieces equal those of encoding both at once. A "▁" after each special token stays.
  bool space_prefix = true;
};

struct decode_options {
  /// Leave control tokens (BOS, EOS, <|im_end|>) out of the text.
  bool skip_special = true;
};

class tokenizer {
 public:
  /// Text longer than this is refused by encode (a limit_exceeded error), whatever the vocabulary.
  static constexpr size_t max_text_bytes = size_t{256} << 20;

  /// Validates `v` and builds the encoder of its kind.
  static expected<tokenizer> create(vocabulary v);

  /// Token ids of `text`.
  expected<std::vector<int32_t>> encode(std::string_view text, const encode_options& options = {}) const;

  /// The bytes of `ids` joined (may end inside a UTF-8 character: see stream_decoder for text that
  /// is always whole). An id out of range is an error naming it.
  expected<std::string> decode(std::span<const int32_t> ids, const decode_options& options = {}) const;

  /// The bytes token `id` stands for (a byte piece's byte, "▁" as a space, a control token's
  /// text); `id` must be in range.
  const std::string& piece(int32_t id) const;
  /// Whether `id` is a control token (skipped by decode with skip_special).
  bool is_control(int32_t id) const;
  /// Whether decode drops the space that starts the first piece (SentencePiece's dummy prefix).
  bool strips_leading_space() const;

  const vocabulary& vocab() const;
  /// The id of a token's exact text, if there is one.
  std::optional<int32_t> find(std::string_view token_text) const;

 private:
  struct impl;
  explicit tokenizer(std::shared_ptr<const impl> p);
  std::shared_ptr<const impl> impl_;
};

}  // namespace mesh::models
