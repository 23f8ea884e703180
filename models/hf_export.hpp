#pragma once
/// What a Hugging Face directory needs beside its weights, written from what a GGUF file says: the
/// model's config.json from a model_config, and tokenizer.json + tokenizer_config.json from the
/// GGUF vocabulary, so that a full fine-tune of a GGUF base loads in the ecosystem's tools and back
/// into meshnode (model_config.hpp's parse_hf_config, tokenizer_json.hpp's parse_hf_tokenizer).
///
/// Only what is written exactly is written; the rest is refused with what it is:
/// - config.json: the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
///   Qwen3ForCausalLM) and GPT-2 (GPT2LMHeadModel, activation gelu_new). A Llama with a sliding
///   window is written as Mistral (Mistral's GGUF files say "llama"). Refused: partial rotary
///   embeddings, Llama 3 rope scaling given only as a
///   rope_freqs.weight tensor (its four numbers are not in the file), q/k/v biases on a Llama,
///   Mistral or Qwen3 (transformers' attention_bias adds an o_proj bias too).
///   The weights beside it are in Hugging Face's order (finetune.hpp), so rope is rotate-half
///   whatever the file's rope style was.
/// - tokenizer.json: byte-level BPE (GGUF "gpt2") as a BPE model with the pre-tokenizer's regexes
///   as Split steps before ByteLevel (as Llama 3's and Qwen2's files have them), and
///   SentencePiece-style vocabularies (GGUF "llama") as Hugging Face's Llama conversion writes
///   them: a BPE model with byte_fallback, a Prepend("▁") + Replace(" ", "▁") normalizer, and
///   merges of two tokens into each piece, ordered by the piece's score. Control and user-defined
///   tokens are added tokens (special or not); BOS/EOS around the text are a TemplateProcessing
///   post-processor and tokenizer_config.json's add_bos_token / add_eos_token. Unused padding
///   tokens at the end of the vocabulary (llama.cpp's converter pads with them) are left out: a
///   Hugging Face model may have more embedding rows than its tokenizer has tokens. The text is
///   read back through parse_hf_tokenizer and compared with the vocabulary; what would read back
///   differently is refused (an unused token before the end, two pieces with the same score that
///   merges would have to order, a piece no merge of two tokens makes, ...).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/model_config.hpp"
#include "models/vocabulary.hpp"

namespace mesh::models {

/// config.json's text for `c` (torch_dtype float32: the tensors beside it are f32).
expected<std::string> config_json_of(const model_config& c);

/// The tokenizer files of a Hugging Face directory.
struct hf_tokenizer_files {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

/// tokenizer.json and tokenizer_config.json for `v`, with `chat_template` when given and
/// `model_max_length` when positive.
expected<hf_tokenizer_files> tokenizer_json_of(const vocabulary& v, const std::optional<std::string>& chat_template,
                                               int64_t model_max_length = 0);

/// Checks that config_json_of(c) and tokenizer_json_of(t) are written exactly; the error names what
/// is not (before training, so that nothing is trained that could not be saved).
expected<void> check_hf_export(const model_config& c, const checkpoint_tokenizer& t);

/// Writes config.json, tokenizer.json and tokenizer_config.json into `dir` (which must exist).
expected<void> write_hf_export(const std::filesystem::path& dir, const model_config& c, const checkpoint_tokenizer& t);

}  // namespace mesh::models
