#pragma once
/// Byte-level BPE's first step: split text into words with the checkpoint's own regexes, run
/// through PCRE2 (UTF + UCP, so \p{L} and \s mean what they mean in HF's Oniguruma and Python's
/// `regex`). PCRE2 stays inside the .cpp.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace mesh::models {

/// The patterns llama.cpp knows a GGUF `tokenizer.ggml.pre` name by, as they appear in the
/// models' tokenizer.json; an unknown name is an error listing the known ones.
expected<std::vector<std::string>> pre_tokenizer_patterns(std::string_view gguf_name);

/// The GGUF `tokenizer.ggml.pre` name whose patterns these are, or "" when none matches.
std::string pre_tokenizer_name(const std::vector<std::string>& patterns);

/// GPT-2's pattern (HF ByteLevel with use_regex).
extern const char* const gpt2_pattern;

/// A sequence of compiled split patterns. Each pattern splits every piece the previous one made
/// into its matches and the text between them (HF Split with behavior "Isolated").
class pre_tokenizer {
 public:
  static expected<pre_tokenizer> create(const std::vector<std::string>& patterns);
  pre_tokenizer(pre_tokenizer&&) noexcept;
  pre_tokenizer& operator=(pre_tokenizer&&) noexcept;
  ~pre_tokenizer();

  /// Calls `word` for each piece of `text`, in order, without collecting them (a huge text costs
  /// no more than its longest piece). Invalid UTF-8 never matches and ends up in the gaps, so the
  /// pieces always join back to `text`. An error only when PCRE2 gives up (match limit).
  expected<void> split(std::string_view text, const std::function<void(std::string_view)>& word) const;

 private:
  struct impl;
  explicit pre_tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace mesh::models
