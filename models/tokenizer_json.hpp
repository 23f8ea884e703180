#pragma once
/// Hugging Face `tokenizer.json` (+ `tokenizer_config.json`) into a vocabulary: byte-level BPE
/// (GPT-2, Llama 3, Qwen2, SmolLM) and Llama-2-style BPE with byte fallback and "▁" (read as the
/// sentencepiece kind). JSON stays inside the .cpp.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "models/vocabulary.hpp"

namespace mesh::models {

/// What a Hugging Face tokenizer directory says about text.
struct hf_tokenizer {
  vocabulary vocab;
  /// tokenizer_config.json `chat_template` (the "default" one when it lists several).
  std::optional<std::string> chat_template;
};

/// Bytes of a tokenizer.json (or tokenizer_config.json) we read at most.
inline constexpr size_t max_tokenizer_json_bytes = size_t{256} << 20;

/// Parses the text of tokenizer.json and, when not empty, of tokenizer_config.json. Errors name
/// what is wrong (an unsupported model or pre-tokenizer type by its name, a merge naming an
/// unknown token); the result has passed vocabulary::validate().
expected<hf_tokenizer> parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view config_json = {});

/// Reads `dir`/tokenizer.json and, if present, `dir`/tokenizer_config.json.
expected<hf_tokenizer> load_hf_tokenizer(const std::filesystem::path& dir);

}  // namespace mesh::models
