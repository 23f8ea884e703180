#include "models/finetune.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "graph/nn.hpp"
#include "models/layers.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models {
namespace {

/// The config with Hugging Face naming: what the parameters are called.
model_config hf_naming(model_config c) {
  c.naming = tensor_naming::hf;
  c.name_prefix.clear();
  return c;
}

/// A checkpoint tensor as a host tensor of its own dtype (bytes copied), or widened to f32.
tensor host_tensor(const tensor_view& v, bool as_f32) {
  tensor t;
  t.type = to_dtype(v.type);
  t.dims = v.shape;
  t.bytes.assign(v.data.begin(), v.data.end());
  if (!as_f32 || t.type == dtype::f32) return t;
  return tensor::from_floats(t.dims, t.to_floats());
}

struct builder_state {
  builder& b;
  const model_config& c;
  const finetune_options& o;
  tensor_map& state;
  std::vector<std::string>& trainable;
  std::mt19937_64 rng;

  /// A parameter of the checkpoint, under its Hugging Face name, trained or frozen.
  expr weight(const std::string& hf_name, const tensor& value, bool train) {
    state[hf_name] = value;
    if (train) trainable.push_back(hf_name);
    return b.parameter(hf_name, value.type, value.dims);
  }
  expr f32(const expr& x) const { return x.type() == dtype::f32 ? x : cast(x, dtype::f32); }
  /// An operand of a product in the compute dtype (a quantized weight stays as its blocks).
  expr low(const expr& x) const {
    return o.compute == dtype::f32 || x.type() == o.compute || is_quantized(x.type()) ? x : cast(x, o.compute);
  }
  /// x W^T in the compute dtype, widened to f32.
  expr product(const expr& x, const expr& w) const { return f32(mesh::linear(low(x), low(w))); }

  /// x W^T (+ bias), with a LoRA adapter when `module` is a target.
  expr proj(const expr& x, const expr& w, const std::string& module, const std::string& role) {
    expr y = product(x, w);
    const auto& t = o.lora.targets;
    if (o.lora.rank <= 0 || std::find(t.begin(), t.end(), role) == t.end()) return y;
    const int64_t out = w.dims()[0], in = w.dims()[1], r = o.lora.rank;
    std::vector<float> a(static_cast<size_t>(r * in));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    std::uniform_real_distribution<double> u(-bound, bound);
    for (auto& v : a) v = static_cast<float>(u(rng));
    const expr A = weight(module + ".lora_A.weight", tensor::from_floats({r, in}, a), true);
    const expr B = weight(module + ".lora_B.weight", tensor::zeros(dtype::f32, {out, r}), true);
    return y + product(product(x, A), B) * (o.lora.alpha / static_cast<double>(r));
  }
};

}  // namespace

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<uint8_t> reorder_rope_rows(std::span<const uint8_t> bytes, int64_t heads, int64_t rows_total, int64_t row_bytes,
                                       bool to_hf) {
  std::vector<uint8_t> out(bytes.size());
  const int64_t per_head = rows_total / heads, half = per_head / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        // The converter's row 2i + j of a head is Hugging Face's row j * half + i.
        const int64_t interleaved = h * per_head + 2 * i + j, hf = h * per_head + j * half + i;
        const int64_t from = to_hf ? interleaved : hf, to = to_hf ? hf : interleaved;
        std::memcpy(out.data() + to * row_bytes, bytes.data() + from * row_bytes, static_cast<size_t>(row_bytes));
      }
  return out;
}

expected<finetune_model> build_finetune_model(const model_config& config, const checkpoint& ckpt, const finetune_options& o) {
  const auto bad = [](std::string why) { return make_error(error_code::invalid_argument, "fine-tuning: " + why); };
  if (config.arch == architecture::gpt2) return bad("GPT-2 is not supported (the Llama family is: Llama, Mistral, Qwen2, Qwen3)");
  if (o.batch < 1 || o.sequence < 1) return bad(fmt::format("batch {} x sequence {} is empty", o.batch, o.sequence));
  if (config.max_context > 0 && o.sequence > config.max_context)
    return bad(fmt::format("sequence {} is longer than the model's context ({})", o.sequence, config.max_context));
  if (o.lora.rank < 0) return bad("the LoRA rank must not be negative");
  if (!is_float(o.compute))
    return bad(std::string("products compute in f32, f16 or bf16, not ") + to_string(o.compute));
  for (const auto& t : o.lora.targets)
    if (std::find(lora_target_names().begin(), lora_target_names().end(), t) == lora_target_names().end())
      return bad("unknown LoRA target \"" + t + "\" (known: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  if (config.rope_dims != config.head_dim && config.rope != rope_style::none)
    return bad("partial rotary embeddings are not supported for training");

  finetune_model m;
  m.lora = o.lora;
  m.interleaved_qk = config.naming == tensor_naming::gguf && config.rope == rope_style::normal;
  m.config = config;
  if (m.interleaved_qk) m.config.rope = rope_style::neox;
  const model_config& c = m.config;
  const model_config hf = hf_naming(config);
  const bool full = o.lora.rank == 0;

  builder b;
  builder_state s{b, c, o, m.state, m.trainable, std::mt19937_64(o.lora.seed)};
  // Loads one checkpoint tensor (its file name from the file's naming) as parameter `hf_name`.
  std::optional<error> failed;
  const auto load = [&](const std::string& file_name, const std::string& hf_name, std::vector<int64_t> dims, bool matrix,
                        int64_t rope_heads = 0) -> expr {
    auto v = ckpt.require(file_name, dims);
    if (!v) {
      if (!failed) failed = v.error();
      return b.fill(0, dtype::f32, dims);
    }
    tensor t = host_tensor(**v, full || !matrix);
    if (rope_heads > 0 && m.interleaved_qk) {
      const int64_t rows = dims[0], row_bytes = static_cast<int64_t>(t.bytes.size()) / rows;
      t.bytes = reorder_rope_rows(t.bytes, rope_heads, rows, row_bytes, true);
    }
    return s.weight(hf_name, t, full);
  };

  const int64_t B = o.batch, T = o.sequence, d = c.hidden_size, H = c.n_heads, KV = c.n_kv_heads, hd = c.head_dim,
                G = H / KV, rows = B * T;
  const expr tokens = b.input("tokens", dtype::i32, {B, T});
  const expr targets = b.input("targets", dtype::i32, {B, T});
  const expr mask = b.input("mask", dtype::f32, {B, T});

  const auto file_top = tensor_names(config);
  const auto hf_top = tensor_names(hf);
  const expr embed = load(file_top.token_embd, hf_top.token_embd, {c.vocab_size, d}, true);
  expr x = gather(s.f32(embed), reshape(tokens, {rows}));  // [rows, d]

  // Rope at positions 0 .. T-1 of every sequence: constants [rows, 1, half].
  std::vector<float> divisors;
  if (config.rope_freqs_tensor) {
    auto v = ckpt.require(file_top.rope_freqs, {c.rope_dims / 2});
    if (!v) return tl::unexpected(v.error());
    if ((*v)->type != tensor_type::f32) return bad("rope_freqs.weight must be F32");
    divisors = host_tensor(**v, true).to_floats();
  }
  const auto freqs = layers::rope_frequencies(c, divisors);
  const int64_t half = c.rope_dims / 2;
  std::vector<float> cos_v(static_cast<size_t>(rows * half)), sin_v(cos_v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(r % T) * freqs[static_cast<size_t>(i)];
      cos_v[static_cast<size_t>(r * half + i)] = static_cast<float>(std::cos(angle));
      sin_v[static_cast<size_t>(r * half + i)] = static_cast<float>(std::sin(angle));
    }
  const expr rope_cos = b.constant(tensor::from_floats({rows, 1, half}, cos_v));
  const expr rope_sin = b.constant(tensor::from_floats({rows, 1, half}, sin_v));
  // Key t is visible to query i when t <= i (and t > i - window).
  const expr key = reshape(nn::iota(b, T), {1, T}), query = reshape(nn::iota(b, T), {T, 1});
  expr visible = compare(key, query, compare_kind::le);
  if (c.sliding_window > 0) visible = visible * compare(key, query - static_cast<double>(c.sliding_window), compare_kind::gt);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto fn = tensor_names(config, l), hn = tensor_names(hf, l);
    const std::string attn = fmt::format("model.layers.{}.self_attn.", l), mlp = fmt::format("model.layers.{}.mlp.", l);
    const auto vec = [&](const std::string& f, const std::string& h, int64_t n, int64_t rope_heads = 0) {
      return s.f32(load(f, h, {n}, false, rope_heads));
    };
    const auto mat = [&](const std::string& f, const std::string& h, int64_t out, int64_t in, int64_t rope_heads = 0) {
      return load(f, h, {out, in}, true, rope_heads);
    };
    const expr h1 = layers::rms_norm(x, vec(fn.attn_norm, hn.attn_norm, d), c.norm_eps);
    expr q = s.proj(h1, mat(fn.q, hn.q, H * hd, d, H), attn + "q_proj", "q_proj");
    expr k = s.proj(h1, mat(fn.k, hn.k, KV * hd, d, KV), attn + "k_proj", "k_proj");
    expr v = s.proj(h1, mat(fn.v, hn.v, KV * hd, d), attn + "v_proj", "v_proj");
    if (c.qkv_bias) {
      // The bias of interleaved q/k rows is interleaved too: reordered as a column of rows.
      q = q + vec(fn.q_bias, hn.q_bias, H * hd, H);
      k = k + vec(fn.k_bias, hn.k_bias, KV * hd, KV);
      v = v + vec(fn.v_bias, hn.v_bias, KV * hd);
    }
    q = reshape(q, {rows, H, hd});
    k = reshape(k, {rows, KV, hd});
    if (c.qk_norm) {
      q = layers::rms_norm(q, vec(fn.q_norm, hn.q_norm, hd), c.norm_eps);
      k = layers::rms_norm(k, vec(fn.k_norm, hn.k_norm, hd), c.norm_eps);
    }
    q = layers::rope(q, rope_cos, rope_sin, c.rope_dims, c.rope);
    k = layers::rope(k, rope_cos, rope_sin, c.rope_dims, c.rope);
    // Queries grouped by their key/value head: [B, KV, G * T, hd] against keys [B, KV, T, hd].
    const expr qg = reshape(permute(reshape(q, {B, T, KV, G, hd}), {0, 2, 3, 1, 4}), {B, KV, G * T, hd});
    const expr kh = permute(reshape(k, {B, T, KV, hd}), {0, 2, 1, 3});
    const expr vh = permute(reshape(v, {B, T, KV, hd}), {0, 2, 1, 3});
    const expr scores =
        reshape(s.f32(matmul(s.low(qg), s.low(transpose(kh)))) * (1.0 / std::sqrt(static_cast<double>(hd))), {B, KV, G, T, T});
    const expr probs = nn::softmax(select(visible, scores, -1e30), -1);
    const expr ctx = s.f32(matmul(s.low(reshape(probs, {B, KV, G * T, T})), s.low(vh)));  // [B, KV, G * T, hd]
    const expr merged = reshape(permute(reshape(ctx, {B, KV, G, T, hd}), {0, 3, 1, 2, 4}), {rows, H * hd});
    x = x + s.proj(merged, mat(fn.o, hn.o, d, H * hd), attn + "o_proj", "o_proj");
    const expr h2 = layers::rms_norm(x, vec(fn.ffn_norm, hn.ffn_norm, d), c.norm_eps);
    const expr gate = s.proj(h2, mat(fn.gate, hn.gate, c.ffn_size, d), mlp + "gate_proj", "gate_proj");
    const expr up = s.proj(h2, mat(fn.up, hn.up, c.ffn_size, d), mlp + "up_proj", "up_proj");
    x = x + s.proj(gate * sigmoid(gate) * up, mat(fn.down, hn.down, d, c.ffn_size), mlp + "down_proj", "down_proj");
  }
  x = layers::rms_norm(x, s.f32(load(file_top.output_norm, hf_top.output_norm, {d}, false)), c.norm_eps);
  const expr head = c.tied_embeddings ? embed : load(file_top.output, hf_top.output, {c.vocab_size, d}, true);
  const expr logits = s.product(x, head);  // [rows, vocab]
  if (failed) return tl::unexpected(*failed);

  // Mean cross-entropy over the counted targets.
  const expr nll = neg(sum(nn::log_softmax(logits, -1) * nn::one_hot(reshape(targets, {rows}), c.vocab_size), {-1}));
  const expr m_rows = reshape(mask, {rows});
  const expr counted = sum(m_rows, {0});
  b.output("loss", sum(nll * m_rows, {0}) / maximum(counted, 1.0));
  auto g = b.finish();
  if (!g) return make_error(error_code::internal, "fine-tuning graph: " + g.error().message);
  m.g = std::move(*g);
  if (m.trainable.empty()) return bad("nothing to train (no LoRA target projection in the model)");
  return m;
}

}  // namespace mesh::models
