#pragma once
/// SentencePiece-style BPE as llama.cpp runs it for `tokenizer.ggml.model = "llama"` (Llama 2,
/// TinyLlama, Mistral): spaces become "▁", adjacent pieces merge greedily by the score of the
/// merged piece, characters outside the vocabulary fall back to `<0xXX>` byte pieces.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "models/vocabulary.hpp"

namespace mesh::models {

class spm_encoder {
 public:
  /// `v` and `ids` must have passed validate() and outlive the encoder.
  static expected<spm_encoder> create(const vocabulary& v, const std::unordered_map<std::string_view, int32_t>& ids);

  /// Appends the ids of `text`; `space_prefix` puts "▁" first (the caller decides: start of the
  /// text, or after a special token).
  void encode(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;

  /// Texts longer than this are encoded in pieces cut before a space (see encode).
  static constexpr size_t max_chunk_bytes = 64 * 1024;

 private:
  void encode_chunk(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;
  const vocabulary* vocab_ = nullptr;
  const std::unordered_map<std::string_view, int32_t>* ids_ = nullptr;
  std::array<int32_t, 256> byte_ids_{};  ///< id of `<0xXX>` per byte, -1 if absent
};

}  // namespace mesh::models
