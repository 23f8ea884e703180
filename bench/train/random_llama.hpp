#pragma once
/// A random Llama checkpoint as a Hugging Face directory (config.json + model.safetensors), for the
/// training benchmarks (bench_finetune.cpp, bench_shaped.cpp): N(0, 0.02) matrices, unit norms.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "graph/safetensors.hpp"
#include "models/checkpoint.hpp"

namespace mesh::bench {

struct llama_shape {
  int64_t hidden = 768, layers = 12, heads = 12, kv_heads = 4, ffn = 2048, vocab = 16384;
  int64_t context = 2048;  ///< max_position_embeddings
};

inline expected<void> write_random_llama(const std::filesystem::path& dir, const llama_shape& s, uint32_t seed = 1) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << "{\"model_type\": \"llama\", \"vocab_size\": " << s.vocab << ", \"hidden_size\": " << s.hidden
      << ", \"num_hidden_layers\": " << s.layers << ", \"num_attention_heads\": " << s.heads
      << ", \"num_key_value_heads\": " << s.kv_heads << ", \"intermediate_size\": " << s.ffn
      << ", \"max_position_embeddings\": " << s.context
      << ", \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}";
  mesh::checkpoint c;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = normal(rng);
    c.tensors[name] = tensor::from_floats({rows, cols}, v);
  };
  const auto ones = [&](const std::string& name, int64_t n) {
    c.tensors[name] = tensor::from_floats({n}, std::vector<float>(static_cast<size_t>(n), 1.0f));
  };
  const int64_t hd = s.hidden / s.heads;
  matrix("model.embed_tokens.weight", s.vocab, s.hidden);
  matrix("lm_head.weight", s.vocab, s.hidden);
  ones("model.norm.weight", s.hidden);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ones(p + "input_layernorm.weight", s.hidden);
    ones(p + "post_attention_layernorm.weight", s.hidden);
    matrix(p + "self_attn.q_proj.weight", s.heads * hd, s.hidden);
    matrix(p + "self_attn.k_proj.weight", s.kv_heads * hd, s.hidden);
    matrix(p + "self_attn.v_proj.weight", s.kv_heads * hd, s.hidden);
    matrix(p + "self_attn.o_proj.weight", s.hidden, s.heads * hd);
    matrix(p + "mlp.gate_proj.weight", s.ffn, s.hidden);
    matrix(p + "mlp.up_proj.weight", s.ffn, s.hidden);
    matrix(p + "mlp.down_proj.weight", s.hidden, s.ffn);
  }
  return save_safetensors(dir / "model.safetensors", c);
}

}  // namespace mesh::bench
