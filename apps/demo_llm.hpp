#pragma once
/// The demo's servable model: a small Llama-architecture checkpoint with random weights, written as
/// a Hugging Face directory (config.json, model.safetensors, a byte-level tokenizer.json and a
/// tokenizer_config.json with a ChatML chat template). No download exists on the machines the demo
/// runs on; this lets `mesh-demo --serve` show the HTTP API, the dashboard and the metrics end to
/// end. Its text is noise: pass a real checkpoint (`--model PATH`) for words.
#include <filesystem>

#include "base/error.hpp"

namespace mesh::demo {

/// Writes the checkpoint into `dir` (created; files replaced). 4 layers, hidden 128, vocabulary of
/// the 256 bytes plus <|im_start|> and <|im_end|>, context 512.
expected<void> write_random_chat_model(const std::filesystem::path& dir);

}  // namespace mesh::demo
