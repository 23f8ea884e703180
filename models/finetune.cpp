#include "models/finetune.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "graph/nn.hpp"
#include "models/layers.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models {
namespace {

/// A 2-D f32 tensor transposed.
tensor transposed(const tensor& t) {
  const int64_t rows = t.dims[0], cols = t.dims[1];
  const auto v = t.to_floats();
  std::vector<float> out(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  return tensor::from_floats({cols, rows}, out);
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
  const checkpoint& ckpt;
  const finetune_options& o;
  finetune_model& m;
  std::mt19937_64 rng;
  std::optional<error> failed;  ///< the first tensor that could not be loaded

  /// Full fine-tuning (no LoRA rank): every tensor trained, as f32.
  bool full() const { return m.lora.rank == 0; }

  /// Checkpoint tensor `file_name` of shape `dims` as parameter `hf_name` (trained when full;
  /// a frozen matrix keeps the file's dtype). `rope_heads`: its rows are a GGUF Llama's
  /// interleaved q or k heads, put back in Hugging Face's order. `transpose`: a GGUF GPT-2
  /// projection [out, in] trained as Hugging Face's Conv1D [in, out].
  expr load(const std::string& file_name, const std::string& hf_name, std::vector<int64_t> dims, bool matrix,
            int64_t rope_heads = 0, bool transpose = false) {
    auto v = ckpt.require(file_name, dims);
    if (!v) {
      if (!failed) failed = v.error();
      return b.fill(0, dtype::f32, transpose ? std::vector<int64_t>{dims[1], dims[0]} : dims);
    }
    tensor t = host_tensor(**v, full() || !matrix || transpose);
    if (rope_heads > 0 && m.interleaved_qk) {
      const int64_t rows = dims[0], row_bytes = static_cast<int64_t>(t.bytes.size()) / rows;
      t.bytes = reorder_rope_rows(t.bytes, rope_heads, rows, row_bytes, true);
    }
    if (transpose) t = transposed(t);
    return weight(hf_name, t, full());
  }

  /// A parameter of the checkpoint, under its Hugging Face name, trained or frozen.
  expr weight(const std::string& hf_name, const tensor& value, bool train) {
    m.state[hf_name] = value;
    if (train) m.trainable.push_back(hf_name);
    return b.parameter(hf_name, value.type, value.dims);
  }
  expr f32(const expr& x) const { return x.type() == dtype::f32 ? x : cast(x, dtype::f32); }
  /// An operand of a product in the compute dtype (a quantized weight stays as its blocks).
  expr low(const expr& x) const {
    return o.compute == dtype::f32 || x.type() == o.compute || is_quantized(x.type()) ? x : cast(x, o.compute);
  }
  /// x W^T in the compute dtype, widened to f32.
  expr product(const expr& x, const expr& w) const { return f32(mesh::linear(low(x), low(w))); }

  /// x W^T, or x W for a weight stored [in, out] (`in_out`: GPT-2's Conv1D), with a LoRA adapter
  /// when `role` is a target.
  expr proj(const expr& x, const expr& w, const std::string& module, const std::string& role, bool in_out = false) {
    expr y;
    if (in_out) {  // matmul takes operands of one dtype: a 16-bit frozen weight is widened as it is read
      const expr xl = low(x), wl = low(w);
      y = f32(matmul(xl, wl.type() == xl.type() ? wl : cast(wl, xl.type())));
    } else {
      y = product(x, w);
    }
    const auto& t = m.lora.targets;
    if (m.lora.rank <= 0 || std::find(t.begin(), t.end(), role) == t.end()) return y;
    const int64_t out = w.dims()[in_out ? 1 : 0], in = w.dims()[in_out ? 0 : 1], r = m.lora.rank;
    std::vector<float> a(static_cast<size_t>(r * in));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    std::uniform_real_distribution<double> u(-bound, bound);
    for (auto& v : a) v = static_cast<float>(u(rng));
    const expr A = weight(module + ".lora_A.weight", tensor::from_floats({r, in}, a), true);
    const expr B = weight(module + ".lora_B.weight", tensor::zeros(dtype::f32, {out, r}), true);
    return y + product(product(x, A), B) * (m.lora.alpha / static_cast<double>(r));
  }

  /// Causal attention of q [rows, H, hd] over k, v [rows, KV, hd] within each of `batch`
  /// sequences, key t visible to query i where `visible` [T, T] is 1: [rows, H * hd].
  expr attention(const expr& q, const expr& k, const expr& v, int64_t batch, const expr& visible) {
    const shape qs = q.dims(), ks = k.dims();
    const int64_t rows = qs[0], H = qs[1], hd = qs[2], KV = ks[1], G = H / KV, T = rows / batch;
    // Queries grouped by their key/value head: [B, KV, G * T, hd] against keys [B, KV, T, hd].
    const expr qg = reshape(permute(reshape(q, {batch, T, KV, G, hd}), {0, 2, 3, 1, 4}), {batch, KV, G * T, hd});
    const expr kh = permute(reshape(k, {batch, T, KV, hd}), {0, 2, 1, 3});
    const expr vh = permute(reshape(v, {batch, T, KV, hd}), {0, 2, 1, 3});
    const expr scores =
        reshape(f32(matmul(low(qg), low(transpose(kh)))) * (1.0 / std::sqrt(static_cast<double>(hd))), {batch, KV, G, T, T});
    const expr probs = nn::softmax(select(visible, scores, -1e30), -1);
    const expr ctx = f32(matmul(low(reshape(probs, {batch, KV, G * T, T})), low(vh)));  // [B, KV, G * T, hd]
    return reshape(permute(reshape(ctx, {batch, KV, G, T, hd}), {0, 3, 1, 2, 4}), {rows, H * hd});
  }
};

/// Key t is visible to query i when t <= i (and t > i - window): [T, T].
expr causal_mask(builder& b, int64_t T, int64_t window) {
  const expr key = reshape(nn::iota(b, T), {1, T}), query = reshape(nn::iota(b, T), {T, 1});
  expr visible = compare(key, query, compare_kind::le);
  if (window > 0) visible = visible * compare(key, query - static_cast<double>(window), compare_kind::gt);
  return visible;
}

/// The Llama family's layers from x [rows, d] (embedded tokens) to the final norm's output.
expr llama_body(builder_state& s, const model_config& file_config, expr x) {
  builder& b = s.b;
  const model_config& c = s.m.config;
  const model_config hf = hf_naming(file_config);
  const int64_t B = s.o.batch, T = s.o.sequence, d = c.hidden_size, H = c.n_heads, KV = c.n_kv_heads, hd = c.head_dim,
                rows = B * T;
  // Rope at positions 0 .. T-1 of every sequence: constants [rows, 1, half].
  std::vector<float> divisors;
  if (file_config.rope_freqs_tensor) {
    const auto name = tensor_names(file_config).rope_freqs;
    auto v = s.ckpt.require(name, {c.rope_dims / 2});
    if (!v) {
      s.failed = v.error();
      return x;
    }
    if ((*v)->type != tensor_type::f32) {
      s.failed = error{error_code::invalid_argument, "fine-tuning: rope_freqs.weight must be F32"};
      return x;
    }
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
  const expr visible = causal_mask(b, T, c.sliding_window);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto fn = tensor_names(file_config, l), hn = tensor_names(hf, l);
    const std::string attn = fmt::format("model.layers.{}.self_attn.", l), mlp = fmt::format("model.layers.{}.mlp.", l);
    const auto vec = [&](const std::string& f, const std::string& h, int64_t n, int64_t rope_heads = 0) {
      return s.f32(s.load(f, h, {n}, false, rope_heads));
    };
    const auto mat = [&](const std::string& f, const std::string& h, int64_t out, int64_t in, int64_t rope_heads = 0) {
      return s.load(f, h, {out, in}, true, rope_heads);
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
    const expr merged = s.attention(q, k, reshape(v, {rows, KV, hd}), B, visible);
    x = x + s.proj(merged, mat(fn.o, hn.o, d, H * hd), attn + "o_proj", "o_proj");
    const expr h2 = layers::rms_norm(x, vec(fn.ffn_norm, hn.ffn_norm, d), c.norm_eps);
    const expr gate = s.proj(h2, mat(fn.gate, hn.gate, c.ffn_size, d), mlp + "gate_proj", "gate_proj");
    const expr up = s.proj(h2, mat(fn.up, hn.up, c.ffn_size, d), mlp + "up_proj", "up_proj");
    x = x + s.proj(gate * sigmoid(gate) * up, mat(fn.down, hn.down, d, c.ffn_size), mlp + "down_proj", "down_proj");
  }
  const auto file_top = tensor_names(file_config), hf_top = tensor_names(hf);
  return layers::rms_norm(x, s.f32(s.load(file_top.output_norm, hf_top.output_norm, {d}, false)), c.norm_eps);
}

/// GPT-2's layers from x [rows, d] (embedded tokens, positions added here) to the final norm.
expr gpt2_body(builder_state& s, const model_config& file_config, expr x) {
  builder& b = s.b;
  const model_config& c = s.m.config;
  const model_config hf = hf_naming(file_config);
  const bool gguf = file_config.naming == tensor_naming::gguf;
  const int64_t B = s.o.batch, T = s.o.sequence, d = c.hidden_size, H = c.n_heads, hd = c.head_dim, rows = B * T;
  const auto file_top = tensor_names(file_config), hf_top = tensor_names(hf);
  const auto vec = [&](const std::string& f, const std::string& h, int64_t n) { return s.f32(s.load(f, h, {n}, false)); };
  // A projection of `in` to `out` and whether it is stored [in, out] (Hugging Face's Conv1D;
  // GGUF's [out, in] turned so when trained in full).
  const auto mat = [&](const std::string& f, const std::string& h, int64_t in, int64_t out) -> std::pair<expr, bool> {
    if (!gguf) return {s.load(f, h, {in, out}, true), true};
    if (s.full()) return {s.load(f, h, {out, in}, true, 0, true), true};
    return {s.load(f, h, {out, in}, true), false};
  };
  const auto proj = [&](const expr& in, const std::pair<expr, bool>& w, const std::string& module, const std::string& role,
                        const expr& bias) { return s.proj(in, w.first, module, role, w.second) + bias; };

  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) positions[static_cast<size_t>(r)] = static_cast<int32_t>(r % T);
  const expr wpe = s.load(file_top.position_embd, hf_top.position_embd, {c.max_context, d}, true);
  x = x + gather(s.f32(wpe), b.constant(tensor::from_ints({rows}, positions)));
  const expr visible = causal_mask(b, T, 0);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto fn = tensor_names(file_config, l), hn = tensor_names(hf, l);
    const std::string block = fmt::format("transformer.h.{}.", l);
    const expr h1 = nn::layer_norm(x, vec(fn.attn_norm, hn.attn_norm, d), vec(fn.attn_norm_bias, hn.attn_norm_bias, d), c.norm_eps);
    const expr qkv = proj(h1, mat(fn.qkv, hn.qkv, d, 3 * d), block + "attn.c_attn", "c_attn", vec(fn.qkv_bias, hn.qkv_bias, 3 * d));
    const auto part = [&](int64_t i) { return reshape(slice_axis(qkv, 1, i * d, (i + 1) * d), {rows, H, hd}); };
    const expr merged = s.attention(part(0), part(1), part(2), B, visible);
    x = x + proj(merged, mat(fn.o, hn.o, d, d), block + "attn.c_proj", "c_proj", vec(fn.o_bias, hn.o_bias, d));
    const expr h2 = nn::layer_norm(x, vec(fn.ffn_norm, hn.ffn_norm, d), vec(fn.ffn_norm_bias, hn.ffn_norm_bias, d), c.norm_eps);
    const expr up = proj(h2, mat(fn.up, hn.up, d, c.ffn_size), block + "mlp.c_fc", "c_fc", vec(fn.up_bias, hn.up_bias, c.ffn_size));
    x = x + proj(nn::gelu(up), mat(fn.down, hn.down, c.ffn_size, d), block + "mlp.c_proj", "c_proj", vec(fn.down_bias, hn.down_bias, d));
  }
  return nn::layer_norm(x, vec(file_top.output_norm, hf_top.output_norm, d), vec(file_top.output_norm_bias, hf_top.output_norm_bias, d),
                        c.norm_eps);
}

}  // namespace

model_config hf_naming(model_config c) {
  c.naming = tensor_naming::hf;
  c.name_prefix = c.arch == architecture::gpt2 ? "transformer." : "";
  return c;
}

const std::vector<std::string>& lora_target_names(architecture arch) {
  static const std::vector<std::string> llama = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  static const std::vector<std::string> gpt2 = {"c_attn", "c_proj", "c_fc"};
  return arch == architecture::gpt2 ? gpt2 : llama;
}

const std::vector<std::string>& default_lora_targets(architecture arch) {
  static const std::vector<std::string> llama = {"q_proj", "k_proj", "v_proj", "o_proj"};
  static const std::vector<std::string> gpt2 = {"c_attn"};
  return arch == architecture::gpt2 ? gpt2 : llama;
}

bool is_lora_target_name(std::string_view name) {
  for (const architecture a : {architecture::llama, architecture::gpt2})
    for (const auto& t : lora_target_names(a))
      if (t == name) return true;
  return false;
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
  if (o.batch < 1 || o.sequence < 1) return bad(fmt::format("batch {} x sequence {} is empty", o.batch, o.sequence));
  if (config.max_context > 0 && o.sequence > config.max_context)
    return bad(fmt::format("sequence {} is longer than the model's context ({})", o.sequence, config.max_context));
  if (o.lora.rank < 0) return bad("the LoRA rank must not be negative");
  if (!is_float(o.compute))
    return bad(std::string("products compute in f32, f16 or bf16, not ") + to_string(o.compute));
  const auto& known = lora_target_names(config.arch);
  for (const auto& t : o.lora.targets)
    if (std::find(known.begin(), known.end(), t) == known.end())
      return bad(fmt::format("unknown LoRA target \"{}\" for {} (its projections: {})", t, to_string(config.arch), fmt::join(known, ", ")));
  if (config.rope_dims != config.head_dim && config.rope != rope_style::none)
    return bad("partial rotary embeddings are not supported for training");

  finetune_model m;
  m.lora = o.lora;
  if (m.lora.targets.empty()) m.lora.targets = default_lora_targets(config.arch);
  m.interleaved_qk = config.naming == tensor_naming::gguf && config.rope == rope_style::normal;
  m.config = config;
  if (m.interleaved_qk) m.config.rope = rope_style::neox;
  const model_config& c = m.config;

  builder b;
  builder_state s{b, ckpt, o, m, std::mt19937_64(o.lora.seed), std::nullopt};
  const int64_t rows = o.batch * o.sequence, d = c.hidden_size;
  const expr tokens = b.input("tokens", dtype::i32, {o.batch, o.sequence});
  const expr targets = b.input("targets", dtype::i32, {o.batch, o.sequence});
  const expr mask = b.input("mask", dtype::f32, {o.batch, o.sequence});

  const auto file_top = tensor_names(config), hf_top = tensor_names(hf_naming(config));
  const expr embed = s.load(file_top.token_embd, hf_top.token_embd, {c.vocab_size, d}, true);
  const expr embedded = gather(s.f32(embed), reshape(tokens, {rows}));  // [rows, d]
  const expr x = c.arch == architecture::gpt2 ? gpt2_body(s, config, embedded) : llama_body(s, config, embedded);
  const expr head = c.tied_embeddings ? embed : s.load(file_top.output, hf_top.output, {c.vocab_size, d}, true);
  const expr logits = s.product(x, head);  // [rows, vocab]
  if (s.failed) return tl::unexpected(*s.failed);

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
