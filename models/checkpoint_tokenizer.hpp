#pragma once
/// The tokenizer a checkpoint brings: a GGUF file's `tokenizer.ggml.*` metadata, or a Hugging Face
/// directory's tokenizer.json; either way checked against the model's vocabulary size.
#include <optional>
#include <string>

#include "base/error.hpp"
#include "models/checkpoint.hpp"
#include "models/gguf.hpp"
#include "models/model_config.hpp"
#include "models/vocabulary.hpp"

namespace mesh::models {

/// What a checkpoint says about text.
struct checkpoint_tokenizer {
  vocabulary vocab;
  std::optional<std::string> chat_template;  ///< `tokenizer.chat_template` / tokenizer_config.json
};

/// Reads the vocabulary from GGUF metadata, as llama.cpp does: `tokenizer.ggml.model` "gpt2"
/// (byte-level BPE) or "llama" (SentencePiece-style), `.tokens`, `.scores`, `.token_type`,
/// `.merges` ("a b" strings), `.pre` (the pre-tokenizer's name; missing or "default": GPT-2's),
/// `.bos_token_id`, `.eos_token_id`, `.unknown_token_id`, `.padding_token_id`, `.add_bos_token`,
/// `.add_eos_token`, `.add_space_prefix`, and `tokenizer.chat_template`. Defaults where a key is
/// missing are llama.cpp's: "llama" adds BOS, "gpt2" does not; "llama-bpe" ignores merges for
/// whole-token words (Llama 3). The result has passed vocabulary::validate(); errors name the file
/// and the key.
expected<checkpoint_tokenizer> read_gguf_tokenizer(const gguf_view& g);

/// Checks that a tokenizer fits the model: no token id at or past the model's vocabulary (HF
/// configs may pad the embedding past the tokenizer's last id, so fewer tokens are fine there;
/// GGUF files carry exactly one token per row, as llama.cpp requires). `source` names the
/// checkpoint in the message.
expected<void> check_tokenizer_fits(const vocabulary& v, const model_config& config, const std::string& source);

/// The tokenizer of an opened checkpoint (GGUF metadata, or the directory's tokenizer.json and
/// tokenizer_config.json), checked with check_tokenizer_fits. A lone .safetensors file has none
/// (not_found).
expected<checkpoint_tokenizer> load_tokenizer(const checkpoint& c, const model_config& config);

}  // namespace mesh::models
