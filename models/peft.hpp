#pragma once
/// What fine-tuning leaves, in the layouts the ecosystem reads:
///
/// - LoRA adapters in PEFT's layout: a directory with adapter_config.json (peft_type "LORA", r,
///   lora_alpha, target_modules, ...) and adapter_model.safetensors holding
///   "base_model.model.<module>.lora_A.weight" [r, in] and "...lora_B.weight" [out, r] per target
///   projection (f32), module being the projection's Hugging Face name ("model.layers.0.self_attn.
///   q_proj"; GPT-2's "transformer.h.0.attn.c_attn", with fan_in_fan_out true as PEFT sets it for
///   Conv1D). PEFT's `PeftModel.from_pretrained` loads it onto the Hugging Face model; meshnode
///   merges it into the base at load (merge_lora_adapter).
/// - A full fine-tune as a Hugging Face directory: model.safetensors (f32) under the Hugging Face
///   tensor names beside config.json and the tokenizer files: the base directory's copied (its
///   config's torch_dtype set to float32), or, for a GGUF base, written from its metadata and
///   vocabulary (hf_export.hpp).
///
/// Reading an adapter is reading outside input: adapter_config.json (at most 1 MiB, 16 levels of
/// nesting) is parsed strictly (fuzzed: fuzz_peft_config), and what meshnode cannot apply exactly
/// is refused with the reason (DoRA, per-module rank or alpha patterns, trained biases or
/// modules_to_save, target modules given as a regular expression). fan_in_fan_out is not read:
/// PEFT decides it by the module's kind, and the merge by the base's layout.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "models/checkpoint.hpp"
#include "models/finetune.hpp"
#include "models/model_config.hpp"

namespace mesh::models {

/// adapter_config.json's settings that meshnode applies.
struct lora_config {
  int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;  ///< scale alpha / sqrt(rank) instead of alpha / rank
  std::vector<std::string> targets;
  std::string base_model;  ///< base_model_name_or_path (informational)

  double scale() const;
};

/// Parses the text of adapter_config.json; `source` names it in errors.
expected<lora_config> parse_lora_config(std::string_view json_text, const std::string& source);

/// An adapter read from a PEFT directory: its config and its tensors by Hugging Face module name
/// ("model.layers.0.self_attn.q_proj" -> A [r, in], B [out, r], f32).
struct lora_adapter {
  lora_config config;
  struct pair {
    tensor a, b;
  };
  std::map<std::string, pair> modules;
};

/// Reads `dir`/adapter_config.json and `dir`/adapter_model.safetensors. Errors name the file and
/// what is wrong (a missing A or B, shapes that disagree with the rank, an unexpected tensor).
expected<lora_adapter> read_lora_adapter(const std::filesystem::path& dir);

/// Merges the adapter into the base's weights: W += scale * B A for each module, the merged
/// tensor stored as f32 (a quantized or 16-bit W is widened) and held by the checkpoint
/// (checkpoint::replace). A GGUF Llama's q and k rows are interleaved as the file's are; a Hugging
/// Face GPT-2's Conv1D weights [in, out] get the delta transposed. Errors
/// name the module the base lacks or whose shape differs.
expected<void> merge_lora_adapter(checkpoint& base, const model_config& config, const lora_adapter& adapter);

/// Saves the adapters of a trained `state` (names as finetune_model's) in PEFT's layout.
expected<void> save_lora_adapter(const std::filesystem::path& dir, const finetune_model& m, const tensor_map& state,
                                 const std::string& base_model);

/// Saves every parameter of a fully fine-tuned `state` as a Hugging Face directory: beside a copy
/// of a Hugging Face base's config.json and tokenizer files, or beside config.json and tokenizer
/// files written from a GGUF base's config (m.config) and vocabulary (write_hf_export; what they
/// cannot hold exactly is refused before anything is written: check_hf_export says so before
/// training).
expected<void> save_full_model(const std::filesystem::path& dir, const finetune_model& m, const tensor_map& state,
                               const checkpoint& base);

}  // namespace mesh::models
