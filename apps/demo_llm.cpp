#include "apps/demo_llm.hpp"

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/safetensors.hpp"
#include "models/utf8.hpp"

namespace mesh::demo {

namespace {

constexpr int64_t vocab = 258, hidden = 128, layers = 4, heads = 4, kv_heads = 2, head_dim = 32, ffn = 256, context = 512;
constexpr int64_t im_start = 256, im_end = 257;

expected<void> write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) return make_error(error_code::io_error, "cannot write " + path.string());
  return {};
}

/// Normal(mean, stddev) values, as the tensor of `shape`.
tensor random(std::mt19937& rng, shape s, double mean, double stddev) {
  std::normal_distribution<double> d(mean, stddev);
  int64_t n = 1;
  for (auto x : s) n *= x;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(d(rng));
  return tensor::from_floats(std::move(s), v);
}

std::string config_json() {
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", vocab},
                      {"hidden_size", hidden}, {"num_hidden_layers", layers}, {"num_attention_heads", heads},
                      {"num_key_value_heads", kv_heads}, {"head_dim", head_dim}, {"intermediate_size", ffn},
                      {"max_position_embeddings", context}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                      {"tie_word_embeddings", false}, {"bos_token_id", im_start}, {"eos_token_id", im_end}};
  return c.dump(2);
}

/// Byte-level BPE with no merges: every byte is a token (GPT-2's byte-to-character table), and
/// the two ChatML markers are special tokens.
std::string tokenizer_json() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[models::utf8::gpt2_bytes().to_text[static_cast<size_t>(b)]] = b;
  nlohmann::json t = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", im_start}, {"content", "<|im_start|>"}, {"special", true}},
        {{"id", im_end}, {"content", "<|im_end|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", nlohmann::json::array()}}}};
  return t.dump();
}

std::string tokenizer_config_json() {
  // ChatML as Qwen writes it (the node recognises the family from this text).
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  nlohmann::json c = {{"bos_token", nullptr}, {"eos_token", "<|im_end|>"}, {"add_bos_token", false}, {"chat_template", chatml}};
  return c.dump(2);
}

}  // namespace

expected<void> write_random_chat_model(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(error_code::io_error, "cannot create " + dir.string() + ": " + ec.message());
  std::mt19937 rng(2026);
  checkpoint c;
  const double wd = 1.0 / std::sqrt(static_cast<double>(hidden)), wf = 1.0 / std::sqrt(static_cast<double>(ffn));
  const double wq = 1.0 / std::sqrt(static_cast<double>(heads * head_dim));
  c.tensors["model.embed_tokens.weight"] = random(rng, {vocab, hidden}, 0, 1);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    c.tensors[p + "input_layernorm.weight"] = random(rng, {hidden}, 1, 0.1);
    c.tensors[p + "self_attn.q_proj.weight"] = random(rng, {heads * head_dim, hidden}, 0, wd);
    c.tensors[p + "self_attn.k_proj.weight"] = random(rng, {kv_heads * head_dim, hidden}, 0, wd);
    c.tensors[p + "self_attn.v_proj.weight"] = random(rng, {kv_heads * head_dim, hidden}, 0, wd);
    c.tensors[p + "self_attn.o_proj.weight"] = random(rng, {hidden, heads * head_dim}, 0, wq);
    c.tensors[p + "post_attention_layernorm.weight"] = random(rng, {hidden}, 1, 0.1);
    c.tensors[p + "mlp.gate_proj.weight"] = random(rng, {ffn, hidden}, 0, wd);
    c.tensors[p + "mlp.up_proj.weight"] = random(rng, {ffn, hidden}, 0, wd);
    c.tensors[p + "mlp.down_proj.weight"] = random(rng, {hidden, ffn}, 0, wf);
  }
  c.tensors["model.norm.weight"] = random(rng, {hidden}, 1, 0.1);
  c.tensors["lm_head.weight"] = random(rng, {vocab, hidden}, 0, wd);
  if (auto ok = save_safetensors(dir / "model.safetensors", c); !ok) return ok;
  if (auto ok = write_text(dir / "config.json", config_json()); !ok) return ok;
  if (auto ok = write_text(dir / "tokenizer.json", tokenizer_json()); !ok) return ok;
  return write_text(dir / "tokenizer_config.json", tokenizer_config_json());
}

}  // namespace mesh::demo
