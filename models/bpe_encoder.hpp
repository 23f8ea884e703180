#pragma once
/// Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM): regex pre-tokenizer, bytes mapped through
/// GPT-2's table, merges applied by rank within each word.
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "models/pre_tokenizer.hpp"
#include "models/vocabulary.hpp"

namespace mesh::models {

class bpe_encoder {
 public:
  /// `v` must have passed validate() and outlive the encoder.
  static expected<bpe_encoder> create(const vocabulary& v,
                                      const std::unordered_map<std::string_view, int32_t>& ids);
  bpe_encoder(bpe_encoder&& o) noexcept;

  /// Appends the ids of `text` (no special tokens are looked for here).
  expected<void> encode(std::string_view text, std::vector<int32_t>& out) const;

  /// Words kept in the cache at most; the cache is emptied when full, so memory stays bounded
  /// whatever the text.
  static constexpr size_t cache_limit = 1 << 16;
  /// Longer words are merged in pieces of this size (cut at character boundaries), which bounds
  /// the working memory of a hostile text; no real word comes near it.
  static constexpr size_t max_word_bytes = 64 * 1024;

 private:
  bpe_encoder(const vocabulary& v, const std::unordered_map<std::string_view, int32_t>& ids, pre_tokenizer pre);
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  struct merge_info {
    int32_t rank;
    int32_t result;
  };
  const vocabulary* vocab_;
  const std::unordered_map<std::string_view, int32_t>* ids_;
  pre_tokenizer pre_;
  std::array<int32_t, 256> byte_ids_{};  ///< id of each byte's mapped character, -1 if absent
  std::unordered_map<uint64_t, merge_info> merges_;  ///< (left id << 32 | right id) -> rank, result
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace mesh::models
