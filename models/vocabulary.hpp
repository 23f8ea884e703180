#pragma once
/// The input of every tokenizer: a plain value that the Hugging Face loader (tokenizer_json.hpp)
/// and the GGUF reader both fill, so neither depends on the other.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"

namespace mesh::models {

/// What a token is, with the numbers GGUF stores in `tokenizer.ggml.token_type`.
enum class token_type : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       ///< special: BOS, EOS, <|im_start|>; matched in text only when asked
  user_defined = 4,  ///< added token: always matched in text, decoded as its text
  unused = 5,
  byte = 6,          ///< SentencePiece byte fallback piece `<0xXX>`
};

/// Bounds on what a vocabulary may hold: a hostile file must not make the node allocate without
/// limit. Real vocabularies stay far below (Gemma: 256k tokens, Qwen2: 151k tokens and merges).
struct vocabulary_limits {
  static constexpr size_t max_tokens = size_t{1} << 21;
  static constexpr size_t max_token_bytes = 1024;
  static constexpr size_t max_merges = size_t{1} << 22;
  static constexpr size_t max_pre_tokenizer_patterns = 16;
  static constexpr size_t max_pattern_bytes = 4096;
};

/// A tokenizer's vocabulary, as the checkpoint describes it.
struct vocabulary {
  enum class kind {
    byte_bpe,       ///< GPT-2 style: regex pre-tokenizer, bytes mapped to printable characters, merges by rank
    sentencepiece,  ///< llama style: "▁" for spaces, merges by the score of the merged piece, byte fallback
  };
  kind model = kind::byte_bpe;

  /// Token text by id. byte_bpe: in GPT-2's byte-to-character mapping (except added tokens, which
  /// are raw text); sentencepiece: with "▁" for spaces.
  std::vector<std::string> tokens;
  /// Per token, or empty. sentencepiece merges the adjacent pair whose merged piece scores highest.
  std::vector<float> scores;
  /// Per token (as token_type values), or empty: then every token is normal.
  std::vector<int32_t> token_types;
  /// byte_bpe merge rules in rank order (first = applied first); both sides and their
  /// concatenation must be tokens.
  std::vector<std::pair<std::string, std::string>> merges;

  /// GGUF `tokenizer.ggml.pre` name: "gpt2", "llama-bpe", "qwen2", "smollm", ... Used when
  /// pre_tokenizer_patterns is empty (a GGUF file carries only the name).
  std::string pre_tokenizer;
  /// The split regexes (PCRE2 syntax), applied in order, each to the pieces the previous one
  /// produced (matches and the text between them both become pieces: HF's "Isolated").
  std::vector<std::string> pre_tokenizer_patterns;
  /// byte_bpe: a word that is a whole token is taken as is, before merges (HF `ignore_merges`,
  /// set by Llama 3).
  bool ignore_merges = false;
  /// sentencepiece: put "▁" before the text (and after every special token), as llama.cpp does.
  bool add_space_prefix = true;

  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  bool add_bos = false;
  bool add_eos = false;

  /// The type of token `id`; normal when token_types is empty. `id` must be in range.
  token_type type_of(int32_t id) const;
  /// Number of tokens, as the id type.
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }

  /// Checks what a tokenizer relies on: limits, sizes of scores/types, ids in range, no duplicate
  /// token, merges naming only tokens. The message names the offending token.
  expected<void> validate() const;
};

/// Printable form of a token's text for error messages (control bytes escaped, length capped).
std::string printable_token(const std::string& text);

/// Whether `text` is written as a SentencePiece byte-fallback piece: `<0xXX>`, XX two uppercase
/// hex digits.
bool is_byte_piece(const std::string& text);

}  // namespace mesh::models
