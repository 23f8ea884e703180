#pragma once
// What models::generate gives in this process on the CPU executor (1 thread) for a checkpoint and
// a prompt: the text a node or a server must reproduce.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "gpu/executor.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/generate.hpp"
#include "models/peft.hpp"
#include "models/session.hpp"

namespace mesh::models::test {

/// With `adapter`: a PEFT LoRA directory merged into the checkpoint first (models/peft.hpp).
inline generation reference_generation(const std::filesystem::path& path, const std::string& prompt,
                                       const generate_options& o, const std::filesystem::path& adapter = {}) {
  auto ckpt = checkpoint::open(path);
  REQUIRE(ckpt);
  if (!adapter.empty()) {
    auto config = read_model_config(*ckpt);
    REQUIRE(config);
    auto a = read_lora_adapter(adapter);
    REQUIRE(a);
    REQUIRE(merge_lora_adapter(*ckpt, *config, *a));
  }
  auto cpu = gpu::make_cpu_executor(1);
  auto s = session::create(*cpu, *ckpt);
  REQUIRE(s);
  auto vocab = load_tokenizer(*ckpt, s->config());
  REQUIRE(vocab);
  auto tok = tokenizer::create(vocab->vocab);
  REQUIRE(tok);
  auto ids = tok->encode(prompt);
  REQUIRE(ids);
  auto g = generate(*s, *tok, *ids, o);
  REQUIRE(g);
  return *g;
}

}  // namespace mesh::models::test
