#pragma once
// Small random checkpoints of each architecture, as Hugging Face directories (f32, f16, bf16) and
// GGUF files (F32, F16, Q8_0, Q4_0, Q4_K, Q6_K matrices; norms, biases and rope factors in F32, as
// llama.cpp's converter writes them), with a byte-level vocabulary in the GGUF metadata.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "checkpoint_writer.hpp"
#include "models/model_config.hpp"
#include "models/utf8.hpp"

namespace mesh::models::test {

struct model_spec {
  architecture arch = architecture::llama;
  int64_t vocab = 300, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, ffn = 128, context = 128;
  bool tied = false;
  bool llama3_scaling = false;  ///< rope_scaling llama3 (HF) / rope_freqs.weight (GGUF)
  double theta = 10000.0;
  double eps = 1e-5;
  uint32_t seed = 1;
  std::string chat_template;  ///< GGUF: written as tokenizer.chat_template when not empty
  /// GGUF vocabulary: byte-level BPE with this pre-tokenizer (tokenizer.ggml.pre), or
  /// SentencePiece-style (add_gguf_sentencepiece_vocabulary).
  std::string pre_tokenizer = "gpt2";
  bool sentencepiece = false;
};

/// One tensor in HF naming and layout ([out, in]; GPT-2's Conv1D [in, out]).
struct spec_tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  bool matrix = false;
};

inline std::vector<float> normal_values(std::mt19937& rng, size_t n, double mean, double stddev) {
  std::normal_distribution<double> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

/// Llama 3.1's frequency divisors (what llama.cpp's converter writes to rope_freqs.weight) for the
/// test's scaling: factor 8, low 1, high 4, original context 32 (small enough that a 16-dim head
/// has kept, smoothed and divided frequencies).
inline std::vector<float> llama3_divisors(const model_spec& s) {
  std::vector<float> out;
  const double factor = 8, low = 1, high = 4, old_ctx = 32;
  for (int64_t i = 0; i < s.head_dim / 2; ++i) {
    const double f = std::pow(s.theta, -2.0 * static_cast<double>(i) / static_cast<double>(s.head_dim));
    const double wavelen = 2 * M_PI / f;
    double scaled = f;
    if (wavelen > old_ctx / low) scaled = f / factor;
    else if (wavelen >= old_ctx / high) {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      scaled = (1 - smooth) * f / factor + smooth * f;
    }
    out.push_back(static_cast<float>(f / scaled));
  }
  return out;
}

/// The tensors of a model, named as Hugging Face names them.
inline std::vector<spec_tensor> model_tensors(const model_spec& s) {
  std::mt19937 rng(s.seed);
  std::vector<spec_tensor> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double mean, double stddev, bool matrix) {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    out.push_back({name, shape, normal_values(rng, n, mean, stddev), matrix});
  };
  const int64_t d = s.hidden, f = s.ffn, qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  const double wd = 1.0 / std::sqrt(static_cast<double>(d)), wf = 1.0 / std::sqrt(static_cast<double>(f));
  if (s.arch == architecture::gpt2) {
    add("wte.weight", {s.vocab, d}, 0, 1, true);
    add("wpe.weight", {s.context, d}, 0, 0.3, true);
    for (int64_t l = 0; l < s.layers; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      add(p + "ln_1.weight", {d}, 1, 0.1, false);
      add(p + "ln_1.bias", {d}, 0, 0.1, false);
      add(p + "attn.c_attn.weight", {d, 3 * d}, 0, wd, true);
      add(p + "attn.c_attn.bias", {3 * d}, 0, 0.1, false);
      add(p + "attn.c_proj.weight", {d, d}, 0, wd, true);
      add(p + "attn.c_proj.bias", {d}, 0, 0.1, false);
      add(p + "ln_2.weight", {d}, 1, 0.1, false);
      add(p + "ln_2.bias", {d}, 0, 0.1, false);
      add(p + "mlp.c_fc.weight", {d, f}, 0, wd, true);
      add(p + "mlp.c_fc.bias", {f}, 0, 0.1, false);
      add(p + "mlp.c_proj.weight", {f, d}, 0, wf, true);
      add(p + "mlp.c_proj.bias", {d}, 0, 0.1, false);
    }
    add("ln_f.weight", {d}, 1, 0.1, false);
    add("ln_f.bias", {d}, 0, 0.1, false);
    return out;
  }
  add("model.embed_tokens.weight", {s.vocab, d}, 0, 1, true);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d}, 1, 0.1, false);
    add(p + "self_attn.q_proj.weight", {qd, d}, 0, wd, true);
    add(p + "self_attn.k_proj.weight", {kvd, d}, 0, wd, true);
    add(p + "self_attn.v_proj.weight", {kvd, d}, 0, wd, true);
    if (s.arch == architecture::qwen2) {
      add(p + "self_attn.q_proj.bias", {qd}, 0, 0.3, false);
      add(p + "self_attn.k_proj.bias", {kvd}, 0, 0.3, false);
      add(p + "self_attn.v_proj.bias", {kvd}, 0, 0.3, false);
    }
    if (s.arch == architecture::qwen3) {
      add(p + "self_attn.q_norm.weight", {s.head_dim}, 1, 0.1, false);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, 1, 0.1, false);
    }
    add(p + "self_attn.o_proj.weight", {d, qd}, 0, 1.0 / std::sqrt(static_cast<double>(qd)), true);
    add(p + "post_attention_layernorm.weight", {d}, 1, 0.1, false);
    add(p + "mlp.gate_proj.weight", {f, d}, 0, wd, true);
    add(p + "mlp.up_proj.weight", {f, d}, 0, wd, true);
    add(p + "mlp.down_proj.weight", {d, f}, 0, wf, true);
  }
  add("model.norm.weight", {d}, 1, 0.1, false);
  if (!s.tied) add("lm_head.weight", {s.vocab, d}, 0, wd, true);
  return out;
}

inline const char* model_type(architecture a) { return to_string(a); }

inline std::string hf_config_json(const model_spec& s) {
  const std::string common = "\"vocab_size\": " + std::to_string(s.vocab) + ", \"bos_token_id\": 256, \"eos_token_id\": 257";
  if (s.arch == architecture::gpt2)
    return "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", " + common +
           ", \"n_embd\": " + std::to_string(s.hidden) + ", \"n_layer\": " + std::to_string(s.layers) +
           ", \"n_head\": " + std::to_string(s.heads) + ", \"n_positions\": " + std::to_string(s.context) +
           ", \"n_inner\": " + std::to_string(s.ffn) + ", \"layer_norm_epsilon\": " + std::to_string(s.eps) + "}";
  std::string j = "{\"model_type\": \"" + std::string(model_type(s.arch)) + "\", " + common +
                  ", \"hidden_size\": " + std::to_string(s.hidden) + ", \"num_hidden_layers\": " + std::to_string(s.layers) +
                  ", \"num_attention_heads\": " + std::to_string(s.heads) + ", \"num_key_value_heads\": " +
                  std::to_string(s.kv_heads) + ", \"head_dim\": " + std::to_string(s.head_dim) +
                  ", \"intermediate_size\": " + std::to_string(s.ffn) + ", \"max_position_embeddings\": " +
                  std::to_string(s.context) + ", \"rms_norm_eps\": " + std::to_string(s.eps) +
                  ", \"rope_theta\": " + std::to_string(s.theta) + ", \"tie_word_embeddings\": " + (s.tied ? "true" : "false");
  if (s.llama3_scaling)
    j += ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": "
         "4.0, \"original_max_position_embeddings\": 32}";
  return j + "}";
}

/// A Hugging Face directory: config.json and model.safetensors in `dtype` ("F32", "F16", "BF16");
/// with `shards` > 1, the tensors dealt in turn into model-0000I-of-0000N.safetensors and
/// model.safetensors.index.json mapping each to its file.
inline void write_hf_model(const std::filesystem::path& dir, const model_spec& s, const std::string& dtype, int shards = 1) {
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", hf_config_json(s));
  std::vector<safetensors_writer> w(static_cast<size_t>(std::max(shards, 1)));
  std::string weight_map;
  size_t i = 0;
  const auto shard_name = [&](size_t k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05d.safetensors", k + 1, shards);
    return std::string(name);
  };
  for (const auto& t : model_tensors(s)) {
    const bytes b = dtype == "F16" ? f16_bytes(t.values) : dtype == "BF16" ? bf16_bytes(t.values) : f32_bytes(t.values);
    const size_t k = i++ % w.size();
    w[k].add(t.name, dtype, t.shape, b);
    weight_map += (weight_map.empty() ? "" : ", ") + ("\"" + t.name + "\": \"" + shard_name(k) + "\"");
  }
  if (shards <= 1) return write_file(dir / "model.safetensors", w.front().build());
  for (size_t k = 0; k < w.size(); ++k) write_file(dir / shard_name(k), w[k].build());
  write_file(dir / "model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {" + weight_map + "}}");
}

/// Random blocks of a quantized type for `rows` rows of `cols` elements, values of roughly
/// +-`scale` (every block's scales drawn at random, so blocks differ in range).
inline bytes random_quantized(tensor_type t, int64_t rows, int64_t cols, double scale, std::mt19937& rng) {
  const int64_t blocks = rows * cols / block_elements(t);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  std::uniform_int_distribution<int> byte(0, 255);
  bytes out;
  auto put_f16 = [&](double v) { put_le(out, f32_to_f16(static_cast<float>(v)), 2); };
  auto put_random = [&](int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(byte(rng)));
  };
  for (int64_t b = 0; b < blocks; ++b) {
    switch (t) {
      case tensor_type::q8_0: put_f16(scale * u(rng) / 127); put_random(32); break;
      case tensor_type::q4_0: put_f16(scale * u(rng) / 8); put_random(16); break;
      case tensor_type::q5_0: put_f16(scale * u(rng) / 16); put_random(4 + 16); break;
      case tensor_type::q4_1:  // x = d * q + m: q < 16 spans [m, m + 15d], m about -scale
      case tensor_type::q5_1:
        put_f16(2 * scale * u(rng) / (t == tensor_type::q4_1 ? 15 : 31));
        put_f16(-scale * u(rng));
        put_random(t == tensor_type::q4_1 ? 16 : 4 + 16);
        break;
      case tensor_type::q4_k:  // x = d*sc*q - dmin*m with q < 16, sc and m < 64
        put_f16(2 * scale * u(rng) / (63 * 15));
        put_f16(scale * u(rng) / 63);
        put_random(12 + 128);
        break;
      case tensor_type::q5_k:  // as q4_k with q < 32
        put_f16(2 * scale * u(rng) / (63 * 31));
        put_f16(scale * u(rng) / 63);
        put_random(12 + 32 + 128);
        break;
      case tensor_type::q6_k: {  // x = d * scale * (q - 32), int8 scales kept within +-64
        put_random(128 + 64);
        std::uniform_int_distribution<int> sc(-64, 64);
        for (int i = 0; i < 16; ++i) out.push_back(static_cast<uint8_t>(static_cast<int8_t>(sc(rng))));
        put_f16(scale * u(rng) / (64 * 32));
        break;
      }
      default: break;
    }
  }
  return out;
}

/// A byte-level vocabulary of `n` tokens: GPT-2's 256 byte characters, "<s>" (256, BOS), "</s>"
/// (257, EOS) and pieces "ab", "cd", ... made by merges.
inline void add_gguf_vocabulary(gguf_writer& w, int64_t n, const std::string& pre = "gpt2") {
  std::vector<std::string> tokens;
  const auto& bytes_map = utf8::gpt2_bytes();
  for (int i = 0; i < 256; ++i) tokens.push_back(bytes_map.to_text[static_cast<size_t>(i)]);
  tokens.push_back("<s>");
  tokens.push_back("</s>");
  std::vector<std::string> merges;
  for (int i = 0; static_cast<int64_t>(tokens.size()) < n; ++i) {
    const std::string a(1, static_cast<char>('a' + i % 26)), b(1, static_cast<char>('a' + (i / 26 + i) % 26));
    std::string piece = a + b + (i >= 26 * 26 ? std::to_string(i) : "");
    if (i >= 26 * 26) break;
    if (std::find(tokens.begin(), tokens.end(), piece) != tokens.end()) continue;
    tokens.push_back(piece);
    merges.push_back(a + " " + b);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  types[256] = types[257] = 3;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_array_strings("tokenizer.ggml.tokens", tokens);
  w.add_array_i32("tokenizer.ggml.token_type", types);
  w.add_array_strings("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 256);
  w.add_u32("tokenizer.ggml.eos_token_id", 257);
}

/// A SentencePiece-style vocabulary of `n` tokens (at least 300), as llama.cpp's converter writes
/// Llama 2's: "<unk>" (0), "<s>" (1, BOS), "</s>" (2, EOS), the byte pieces <0x00>..<0xFF>, the
/// characters "▁", a-z, 0-9 and ".,!", then pieces made of two earlier ones (never "▁" inside),
/// each scoring below the one before, as BPE-trained SentencePiece models score them; and a
/// user-defined "<|tool|>".
inline void add_gguf_sentencepiece_vocabulary(gguf_writer& w, int64_t n) {
  const std::string mark = "\xE2\x96\x81";
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
    scores.push_back(0);
  }
  tokens.push_back("<|tool|>");
  types.push_back(4);
  scores.push_back(0);
  std::vector<std::string> pieces = {mark};
  for (char c = 'a'; c <= 'z'; ++c) pieces.emplace_back(1, c);
  for (char c = '0'; c <= '9'; ++c) pieces.emplace_back(1, c);
  for (char c : std::string(".,!")) pieces.emplace_back(1, c);
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens.push_back(pieces[i]);
    types.push_back(1);
    scores.push_back(-1000.0f - static_cast<float>(i));
  }
  const size_t singles = pieces.size();
  std::mt19937 rng(11);
  float score = 0;
  for (int tries = 0; static_cast<int64_t>(tokens.size()) < n && tries < 100000; ++tries) {
    // Early pieces: "▁" or a letter, then a letter; later ones join any two (the right one without "▁").
    const size_t pool = std::min(pieces.size(), singles + static_cast<size_t>(tries / 8));
    const std::string& l = pieces[std::uniform_int_distribution<size_t>(0, pool - 1)(rng)];
    const std::string& r = pieces[std::uniform_int_distribution<size_t>(1, pool - 1)(rng)];
    const std::string piece = l + r;
    if (r.rfind(mark, 0) == 0 || piece.find(mark, 1) != std::string::npos || piece.size() > 8 ||
        std::find(tokens.begin(), tokens.end(), piece) != tokens.end())
      continue;
    pieces.push_back(piece);
    tokens.push_back(piece);
    types.push_back(1);
    scores.push_back(score);
    score -= 1;
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_array_strings("tokenizer.ggml.tokens", tokens);
  w.add_array_f32("tokenizer.ggml.scores", scores);
  w.add_array_i32("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
}

/// The GGUF name of an HF tensor name (the converter's renaming).
inline std::string gguf_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> map = {
      {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}, {"wte.weight", "token_embd.weight"}, {"wpe.weight", "position_embd.weight"},
      {"ln_f.weight", "output_norm.weight"}, {"ln_f.bias", "output_norm.bias"}};
  for (const auto& [a, b] : map)
    if (hf == a) return b;
  static const std::vector<std::pair<std::string, std::string>> layer = {
      {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.", "attn_q."}, {"self_attn.k_proj.", "attn_k."},
      {"self_attn.v_proj.", "attn_v."}, {"self_attn.o_proj.", "attn_output."}, {"self_attn.q_norm.", "attn_q_norm."},
      {"self_attn.k_norm.", "attn_k_norm."}, {"post_attention_layernorm.", "ffn_norm."}, {"mlp.gate_proj.", "ffn_gate."},
      {"mlp.up_proj.", "ffn_up."}, {"mlp.down_proj.", "ffn_down."}, {"ln_1.", "attn_norm."}, {"attn.c_attn.", "attn_qkv."},
      {"attn.c_proj.", "attn_output."}, {"ln_2.", "ffn_norm."}, {"mlp.c_fc.", "ffn_up."}, {"mlp.c_proj.", "ffn_down."}};
  std::string rest = hf;
  for (const std::string p : {"model.layers.", "h."})
    if (rest.rfind(p, 0) == 0) rest = rest.substr(p.size());
  const size_t dot = rest.find('.');
  const std::string n = rest.substr(0, dot), role = rest.substr(dot + 1);
  for (const auto& [a, b] : layer)
    if (role.rfind(a, 0) == 0) return "blk." + n + "." + b + role.substr(a.size());
  return hf;
}

/// A GGUF file with matrices of type `t` (quantized ones as random blocks, not a quantization of
/// the HF values) and everything else F32. GPT-2's Conv1D weights are transposed to [out, in] as
/// the converter does; the tied GPT-2 output gets a copy of the embedding, as the converter
/// writes, and other tied models leave output.weight out.
inline void write_gguf_model(const std::filesystem::path& path, const model_spec& s, tensor_type t) {
  gguf_writer w;
  const std::string a = model_type(s.arch);
  w.add_string("general.architecture", a);
  w.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.hidden));
  w.add_u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.ffn));
  w.add_u32(a + ".context_length", static_cast<uint32_t>(s.context));
  if (s.arch == architecture::gpt2) {
    w.add_f32(a + ".attention.layer_norm_epsilon", static_cast<float>(s.eps));
  } else {
    w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
    w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
    w.add_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(s.eps));
    w.add_f32(a + ".rope.freq_base", static_cast<float>(s.theta));
  }
  if (s.sentencepiece) add_gguf_sentencepiece_vocabulary(w, s.vocab);
  else add_gguf_vocabulary(w, s.vocab, s.pre_tokenizer);
  if (!s.chat_template.empty()) w.add_string("tokenizer.chat_template", s.chat_template);
  std::mt19937 rng(s.seed + 1000);
  auto tensors = model_tensors(s);
  if (s.arch == architecture::gpt2) {
    spec_tensor out = tensors[0];  // wte
    out.name = "lm_head.weight";
    tensors.push_back(out);
  }
  for (auto& x : tensors) {
    std::vector<int64_t> shape = x.shape;
    std::vector<float> values = x.values;
    const bool conv1d = s.arch == architecture::gpt2 && x.matrix && x.name.find(".weight") != std::string::npos &&
                        x.name.rfind("h.", 0) == 0;
    if (conv1d) {  // [in, out] -> [out, in]
      const int64_t in = shape[0], outf = shape[1];
      std::vector<float> tr(values.size());
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < outf; ++o) tr[static_cast<size_t>(o * in + i)] = values[static_cast<size_t>(i * outf + o)];
      values = std::move(tr);
      shape = {outf, in};
    }
    std::vector<uint64_t> ne(shape.rbegin(), shape.rend());
    const std::string name = gguf_name(x.name);
    const tensor_type type = x.matrix && x.name != "wpe.weight" ? t : tensor_type::f32;
    bytes data;
    if (type == tensor_type::f32) data = f32_bytes(values);
    else if (type == tensor_type::f16) data = f16_bytes(values);
    else if (type == tensor_type::bf16) data = bf16_bytes(values);
    else {
      double sd = 0;
      for (float v : values) sd += static_cast<double>(v) * v;
      data = random_quantized(type, shape[0], shape[1], 2 * std::sqrt(sd / static_cast<double>(values.size())), rng);
    }
    w.add_tensor(name, type, ne, data);
  }
  if (s.llama3_scaling) w.add_tensor("rope_freqs.weight", tensor_type::f32, {static_cast<uint64_t>(s.head_dim / 2)}, f32_bytes(llama3_divisors(s)));
  write_file(path, w.build());
}

}  // namespace mesh::models::test
