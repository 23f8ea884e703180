#include "models/model_config.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

namespace mesh::models {
namespace {

using json = nlohmann::json;

constexpr const char* supported_list = "llama, mistral, qwen2, qwen3, gpt2";

// Bounds on what a config may ask for: a config is input, and the graph builder sizes buffers
// from it. Far above every real model (Llama 3.1 405B: 16384 wide, 126 layers, 128k vocabulary).
constexpr int64_t max_width = int64_t{1} << 20;
constexpr int64_t max_layers = 1 << 12;
constexpr int64_t max_vocab = int64_t{1} << 24;
constexpr int64_t max_positions = int64_t{1} << 30;

tl::unexpected<error> config_error(error_code code, const std::string& source, const std::string& what) {
  return make_error(code, source + ": " + what);
}

// ---- config.json ----

// Reads keys of a config.json object without throwing: every accessor checks the JSON type.
class hf_reader {
 public:
  hf_reader(const json& doc, const std::string& source) : doc_(doc), source_(source) {}

  const json* find(const char* key) const {
    const auto it = doc_.find(key);
    return it == doc_.end() || it->is_null() ? nullptr : &*it;
  }

  expected<int64_t> integer(const char* key) const {
    const json* v = find(key);
    if (!v) return config_error(error_code::not_found, source_, "key \"" + std::string(key) + "\" is missing");
    return integer_value(key, *v);
  }
  expected<int64_t> integer_or(const char* key, int64_t fallback) const {
    const json* v = find(key);
    return v ? integer_value(key, *v) : expected<int64_t>(fallback);
  }
  expected<double> number_or(const char* key, double fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    return number_value(key, *v);
  }
  expected<double> number(const char* key) const {
    const json* v = find(key);
    if (!v) return config_error(error_code::not_found, source_, "key \"" + std::string(key) + "\" is missing");
    return number_value(key, *v);
  }
  expected<bool> boolean_or(const char* key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) return config_error(error_code::dtype_mismatch, source_, "key \"" + std::string(key) + "\" is not true or false");
    return v->get<bool>();
  }

  expected<int64_t> integer_value(const std::string& key, const json& v) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        return config_error(error_code::invalid_argument, source_, "key \"" + key + "\" is out of range");
      return v.get<int64_t>();
    }
    // Some writers put 4096.0 where an integer belongs.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    return config_error(error_code::dtype_mismatch, source_, "key \"" + key + "\" is not an integer");
  }
  expected<double> number_value(const std::string& key, const json& v) const {
    if (!v.is_number()) return config_error(error_code::dtype_mismatch, source_, "key \"" + key + "\" is not a number");
    return v.get<double>();
  }

  const std::string& source() const { return source_; }

 private:
  const json& doc_;
  const std::string& source_;
};

expected<architecture> hf_architecture(const json& doc, const std::string& source) {
  std::string name;
  if (const auto it = doc.find("model_type"); it != doc.end() && it->is_string()) {
    name = it->get<std::string>();
  } else if (const auto a = doc.find("architectures"); a != doc.end() && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    const auto cls = (*a)[0].get<std::string>();
    if (cls == "LlamaForCausalLM") name = "llama";
    else if (cls == "MistralForCausalLM") name = "mistral";
    else if (cls == "Qwen2ForCausalLM") name = "qwen2";
    else if (cls == "Qwen3ForCausalLM") name = "qwen3";
    else if (cls == "GPT2LMHeadModel" || cls == "GPT2Model") name = "gpt2";
    else name = cls;
  } else {
    return config_error(error_code::not_found, source, "key \"model_type\" is missing (and no \"architectures\" entry names the model)");
  }
  if (name == "llama") return architecture::llama;
  if (name == "mistral") return architecture::mistral;
  if (name == "qwen2") return architecture::qwen2;
  if (name == "qwen3") return architecture::qwen3;
  if (name == "gpt2") return architecture::gpt2;
  return config_error(error_code::unsupported, source,
                      "architecture " + quote_name(name) + " is not supported (supported: " + supported_list + ")");
}

// rope_scaling (transformers <= 4.x) or rope_parameters (5.x) of a Llama-family config.
expected<void> hf_rope_scaling(const hf_reader& r, model_config& c) {
  const json* s = r.find("rope_scaling");
  if (!s) s = r.find("rope_parameters");
  if (!s) return {};
  if (!s->is_object()) return config_error(error_code::dtype_mismatch, r.source(), "key \"rope_scaling\" is not an object");
  const std::string scaling_source = r.source() + " rope_scaling";
  hf_reader scaling(*s, scaling_source);
  std::string type = "default";
  if (const json* t = scaling.find("rope_type"); t && t->is_string()) type = t->get<std::string>();
  else if (const json* t2 = scaling.find("type"); t2 && t2->is_string()) type = t2->get<std::string>();
  if (auto theta = scaling.number_or("rope_theta", c.rope_theta); theta) c.rope_theta = *theta;
  else return forward_error(theta);
  if (type == "default") return {};
  if (type == "linear") {
    auto f = scaling.number("factor");
    if (!f) return forward_error(f);
    c.scaling.type = rope_scaling::kind::linear;
    c.scaling.factor = *f;
    return {};
  }
  if (type == "llama3") {
    auto f = scaling.number("factor");
    auto lo = scaling.number("low_freq_factor");
    auto hi = scaling.number("high_freq_factor");
    auto orig = scaling.integer("original_max_position_embeddings");
    if (!f) return forward_error(f);
    if (!lo) return forward_error(lo);
    if (!hi) return forward_error(hi);
    if (!orig) return forward_error(orig);
    if (!(*f > 0) || !(*lo > 0) || !(*hi > *lo) || *orig <= 0)
      return config_error(error_code::invalid_argument, scaling_source,
                          "llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                          "original_max_position_embeddings > 0");
    c.scaling = {rope_scaling::kind::llama3, *f, *lo, *hi, *orig};
    return {};
  }
  return config_error(error_code::unsupported, r.source(),
                      "rope scaling " + quote_name(type) + " is not supported (supported: default, linear, llama3)");
}

expected<void> hf_token_ids(const hf_reader& r, model_config& c) {
  if (const json* b = r.find("bos_token_id")) {
    auto v = r.integer_value("bos_token_id", *b);
    if (!v) return forward_error(v);
    c.bos_token_id = *v;
  }
  if (const json* e = r.find("eos_token_id")) {
    if (e->is_array()) {
      for (const auto& x : *e) {
        auto v = r.integer_value("eos_token_id", x);
        if (!v) return forward_error(v);
        c.eos_token_ids.push_back(*v);
      }
    } else {
      auto v = r.integer_value("eos_token_id", *e);
      if (!v) return forward_error(v);
      c.eos_token_ids.push_back(*v);
    }
  }
  return {};
}

// ---- shared ----

expected<void> check_bounds(const model_config& c, const std::string& source) {
  auto in = [&](const char* what, int64_t v, int64_t hi) -> expected<void> {
    if (v <= 0 || v > hi)
      return config_error(error_code::invalid_argument, source,
                          std::string(what) + " is " + std::to_string(v) + ", outside 1.." + std::to_string(hi));
    return {};
  };
  for (auto ok : {in("vocab size", c.vocab_size, max_vocab), in("hidden size", c.hidden_size, max_width),
                  in("layer count", c.n_layers, max_layers), in("head count", c.n_heads, max_width),
                  in("key/value head count", c.n_kv_heads, max_width), in("head dimension", c.head_dim, max_width),
                  in("feed-forward size", c.ffn_size, max_width), in("context length", c.max_context, max_positions)})
    if (!ok) return ok;
  if (c.n_heads % c.n_kv_heads != 0)
    return config_error(error_code::invalid_argument, source,
                        "head count " + std::to_string(c.n_heads) + " is not a multiple of the key/value head count " +
                            std::to_string(c.n_kv_heads));
  if (c.rope != rope_style::none && (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0))
    return config_error(error_code::invalid_argument, source,
                        "rope dimension count " + std::to_string(c.rope_dims) + " must be even and at most the head dimension " +
                            std::to_string(c.head_dim));
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
    return config_error(error_code::invalid_argument, source, "the normalization epsilon must be positive");
  if (c.rope != rope_style::none && (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)))
    return config_error(error_code::invalid_argument, source, "the rope base (theta) must be positive");
  return {};
}

}  // namespace

const char* to_string(architecture a) {
  switch (a) {
    case architecture::llama: return "llama";
    case architecture::mistral: return "mistral";
    case architecture::qwen2: return "qwen2";
    case architecture::qwen3: return "qwen3";
    case architecture::gpt2: return "gpt2";
  }
  return "?";
}

const char* to_string(rope_style s) {
  switch (s) {
    case rope_style::none: return "none";
    case rope_style::normal: return "normal";
    case rope_style::neox: return "neox";
  }
  return "?";
}

expected<model_config> parse_hf_config(std::string_view text, const std::string& source) {
  const json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return config_error(error_code::decode_error, source, "not a JSON object");
  auto arch = hf_architecture(doc, source);
  if (!arch) return forward_error(arch);
  hf_reader r(doc, source);
  model_config c;
  c.arch = *arch;
  c.naming = tensor_naming::hf;

#define MESH_READ(field, expr)              \
  do {                                      \
    auto value_ = (expr);                   \
    if (!value_) return forward_error(value_); \
    c.field = *value_;                      \
  } while (0)

  if (c.arch == architecture::gpt2) {
    MESH_READ(vocab_size, r.integer("vocab_size"));
    MESH_READ(hidden_size, r.integer("n_embd"));
    MESH_READ(n_layers, r.integer("n_layer"));
    MESH_READ(n_heads, r.integer("n_head"));
    c.n_kv_heads = c.n_heads;
    MESH_READ(ffn_size, r.integer_or("n_inner", 4 * c.hidden_size));
    MESH_READ(max_context, r.integer("n_positions"));
    MESH_READ(norm_eps, r.number_or("layer_norm_epsilon", 1e-5));
    MESH_READ(tied_embeddings, r.boolean_or("tie_word_embeddings", true));
    c.head_dim = c.n_heads > 0 ? c.hidden_size / c.n_heads : 0;
    if (c.n_heads > 0 && c.hidden_size % c.n_heads != 0)
      return config_error(error_code::invalid_argument, source, "n_embd is not a multiple of n_head");
    c.layer_norm = true;
    c.rope = rope_style::none;
    c.qkv_bias = true;
    c.weights_in_out = true;
  } else {
    MESH_READ(vocab_size, r.integer("vocab_size"));
    MESH_READ(hidden_size, r.integer("hidden_size"));
    MESH_READ(n_layers, r.integer("num_hidden_layers"));
    MESH_READ(n_heads, r.integer("num_attention_heads"));
    MESH_READ(n_kv_heads, r.integer_or("num_key_value_heads", c.n_heads));
    MESH_READ(ffn_size, r.integer("intermediate_size"));
    MESH_READ(max_context, r.integer("max_position_embeddings"));
    MESH_READ(norm_eps, r.number("rms_norm_eps"));
    MESH_READ(rope_theta, r.number_or("rope_theta", 10000.0));
    MESH_READ(tied_embeddings, r.boolean_or("tie_word_embeddings", false));
    if (r.find("head_dim")) {
      MESH_READ(head_dim, r.integer("head_dim"));
    } else {
      if (c.n_heads <= 0 || c.hidden_size % c.n_heads != 0)
        return config_error(error_code::invalid_argument, source, "hidden_size is not a multiple of num_attention_heads (and no head_dim)");
      c.head_dim = c.hidden_size / c.n_heads;
    }
    c.rope_dims = c.head_dim;
    // HF keeps q/k rows in rotate_half order for every architecture here (see the header).
    c.rope = rope_style::neox;
    if (auto ok = hf_rope_scaling(r, c); !ok) return tl::unexpected(ok.error());
    // Qwen2's attention always has q/k/v biases; Llama's may (attention_bias), Qwen3's does not.
    if (c.arch == architecture::qwen2) c.qkv_bias = true;
    else MESH_READ(qkv_bias, r.boolean_or("attention_bias", false));
    c.qk_norm = c.arch == architecture::qwen3;
    // Mistral declares its window; Qwen declares one it does not use unless use_sliding_window.
    auto sliding = r.boolean_or("use_sliding_window", c.arch == architecture::mistral);
    if (!sliding) return forward_error(sliding);
    if (*sliding && c.arch != architecture::llama) MESH_READ(sliding_window, r.integer_or("sliding_window", 0));
  }
#undef MESH_READ
  if (auto ok = hf_token_ids(r, c); !ok) return tl::unexpected(ok.error());
  if (auto ok = check_bounds(c, source); !ok) return tl::unexpected(ok.error());
  return c;
}

expected<model_config> parse_gguf_config(const gguf_view& g) {
  const std::string& source = g.source();
  auto arch_name = g.get_string("general.architecture");
  if (!arch_name) return forward_error(arch_name);
  model_config c;
  c.naming = tensor_naming::gguf;
  const std::string a(*arch_name);
  if (a == "llama") c.arch = architecture::llama;
  else if (a == "qwen2") c.arch = architecture::qwen2;
  else if (a == "qwen3") c.arch = architecture::qwen3;
  else if (a == "gpt2") c.arch = architecture::gpt2;
  else
    return config_error(error_code::unsupported, source,
                        "architecture " + quote_name(a) + " is not supported (supported: llama (also Mistral's files), qwen2, qwen3, gpt2)");

  auto required = [&](const std::string& key) -> expected<int64_t> {
    auto v = g.get_u64(a + "." + key);
    if (!v) return forward_error(v);
    if (*v > static_cast<uint64_t>(INT64_MAX)) return config_error(error_code::invalid_argument, source, a + "." + key + " is out of range");
    return static_cast<int64_t>(*v);
  };
  auto optional = [&](const std::string& key, int64_t fallback) -> expected<int64_t> {
    return g.has(a + "." + key) ? required(key) : expected<int64_t>(fallback);
  };
  auto real = [&](const std::string& key, double fallback) -> expected<double> {
    return g.has(a + "." + key) ? g.get_f64(a + "." + key) : expected<double>(fallback);
  };

#define MESH_READ(field, expr)                 \
  do {                                         \
    auto value_ = (expr);                      \
    if (!value_) return forward_error(value_); \
    c.field = *value_;                         \
  } while (0)

  MESH_READ(hidden_size, required("embedding_length"));
  MESH_READ(n_layers, required("block_count"));
  MESH_READ(n_heads, required("attention.head_count"));
  MESH_READ(n_kv_heads, optional("attention.head_count_kv", c.n_heads));
  MESH_READ(ffn_size, required("feed_forward_length"));
  MESH_READ(max_context, required("context_length"));
  if (c.n_heads <= 0) return config_error(error_code::invalid_argument, source, a + ".attention.head_count must be positive");
  MESH_READ(head_dim, optional("attention.key_length", c.hidden_size / c.n_heads));

  // The vocabulary: the key when written, else the embedding's rows, else the tokenizer's list.
  const gguf_tensor_info* embd = g.find_tensor("token_embd.weight");
  if (g.has(a + ".vocab_size")) MESH_READ(vocab_size, required("vocab_size"));
  else if (embd) c.vocab_size = embd->ne[1];
  else if (const gguf_value* tokens = g.find("tokenizer.ggml.tokens"); tokens && tokens->type() == gguf_value_type::array)
    c.vocab_size = static_cast<int64_t>(std::min<uint64_t>(tokens->size(), static_cast<uint64_t>(INT64_MAX)));
  else
    return config_error(error_code::not_found, source, "no " + a + ".vocab_size, token_embd.weight or tokenizer.ggml.tokens gives the vocabulary size");

  if (c.arch == architecture::gpt2) {
    c.layer_norm = true;
    c.rope = rope_style::none;
    c.qkv_bias = true;
    auto eps = g.get_f64(a + ".attention.layer_norm_epsilon");
    if (!eps) return forward_error(eps);
    c.norm_eps = *eps;
  } else {
    auto eps = g.get_f64(a + ".attention.layer_norm_rms_epsilon");
    if (!eps) return forward_error(eps);
    c.norm_eps = *eps;
    // The converter un-permutes Llama's q/k (normal rope); Qwen keeps rotate_half order.
    c.rope = c.arch == architecture::llama ? rope_style::normal : rope_style::neox;
    MESH_READ(rope_theta, real("rope.freq_base", 10000.0));
    MESH_READ(rope_dims, optional("rope.dimension_count", c.head_dim));
    c.qkv_bias = c.arch == architecture::qwen2 || g.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.qk_norm = c.arch == architecture::qwen3;

    const std::string scaling_key = a + ".rope.scaling.type";
    std::string scaling = "none";
    if (g.has(scaling_key)) {
      auto s = g.get_string(scaling_key);
      if (!s) return forward_error(s);
      scaling = std::string(*s);
    } else if (g.has(a + ".rope.scale_linear")) {
      scaling = "linear";  // written by converters before rope.scaling.type existed
    }
    if (scaling == "linear") {
      c.scaling.type = rope_scaling::kind::linear;
      const std::string factor_key = g.has(a + ".rope.scaling.factor") ? a + ".rope.scaling.factor" : a + ".rope.scale_linear";
      auto f = g.get_f64(factor_key);
      if (!f) return forward_error(f);
      c.scaling.factor = *f;
    } else if (scaling != "none") {
      return config_error(error_code::unsupported, source, "rope scaling " + quote_name(scaling) + " (" + scaling_key +
                                                               ") is not supported (supported: none, linear, and Llama 3's rope_freqs tensor)");
    }
    if (g.has(a + ".rope.scaling.original_context_length"))
      MESH_READ(scaling.original_max_position_embeddings, required("rope.scaling.original_context_length"));
    if (const gguf_tensor_info* freqs = g.find_tensor("rope_freqs.weight")) {
      if (freqs->type != tensor_type::f32 || freqs->n_dims != 1 || freqs->ne[0] != c.rope_dims / 2)
        return config_error(error_code::shape_mismatch, source,
                            "tensor \"rope_freqs.weight\" must be F32 with " + std::to_string(c.rope_dims / 2) + " entries (rope dimensions / 2)");
      c.rope_freqs_tensor = true;
      c.scaling.type = rope_scaling::kind::llama3;
    }
  }
  MESH_READ(sliding_window, optional("attention.sliding_window", 0));
  c.tied_embeddings = g.find_tensor("output.weight") == nullptr;
  if (g.has("tokenizer.ggml.bos_token_id")) MESH_READ(bos_token_id, g.get_u32("tokenizer.ggml.bos_token_id"));
  if (g.has("tokenizer.ggml.eos_token_id")) {
    auto eos = g.get_u32("tokenizer.ggml.eos_token_id");
    if (!eos) return forward_error(eos);
    c.eos_token_ids.push_back(*eos);
  }
#undef MESH_READ
  if (auto ok = check_bounds(c, source); !ok) return tl::unexpected(ok.error());
  return c;
}

expected<model_config> read_model_config(const checkpoint& ckpt) {
  switch (ckpt.format()) {
    case checkpoint_format::gguf: return parse_gguf_config(*ckpt.gguf());
    case checkpoint_format::safetensors:
      return make_error(error_code::not_found, ckpt.path().string() +
                                                   ": a lone safetensors file has no config.json; open the directory that holds both");
    case checkpoint_format::hf_directory: break;
  }
  auto c = parse_hf_config(ckpt.config_json(), ckpt.config_path().string());
  if (!c) return c;
  // GPT-2 checkpoints saved by recent transformers versions prefix every name.
  if (c->arch == architecture::gpt2 && !ckpt.find("wte.weight") && ckpt.find("transformer.wte.weight")) c->name_prefix = "transformer.";
  return c;
}

layer_tensor_names tensor_names(const model_config& c, int64_t layer) {
  layer_tensor_names n;
  const std::string i = std::to_string(layer);
  if (c.naming == tensor_naming::gguf) {
    const std::string b = "blk." + i + ".";
    n.attn_norm = b + "attn_norm.weight";
    n.o = b + "attn_output.weight";
    n.ffn_norm = b + "ffn_norm.weight";
    n.up = b + "ffn_up.weight";
    n.down = b + "ffn_down.weight";
    if (c.arch == architecture::gpt2) {
      n.attn_norm_bias = b + "attn_norm.bias";
      n.qkv = b + "attn_qkv.weight";
      n.qkv_bias = b + "attn_qkv.bias";
      n.o_bias = b + "attn_output.bias";
      n.ffn_norm_bias = b + "ffn_norm.bias";
      n.up_bias = b + "ffn_up.bias";
      n.down_bias = b + "ffn_down.bias";
      return n;
    }
    n.q = b + "attn_q.weight";
    n.k = b + "attn_k.weight";
    n.v = b + "attn_v.weight";
    n.gate = b + "ffn_gate.weight";
    if (c.qkv_bias) {
      n.q_bias = b + "attn_q.bias";
      n.k_bias = b + "attn_k.bias";
      n.v_bias = b + "attn_v.bias";
    }
    if (c.qk_norm) {
      n.q_norm = b + "attn_q_norm.weight";
      n.k_norm = b + "attn_k_norm.weight";
    }
    return n;
  }
  if (c.arch == architecture::gpt2) {
    const std::string b = c.name_prefix + "h." + i + ".";
    n.attn_norm = b + "ln_1.weight";
    n.attn_norm_bias = b + "ln_1.bias";
    n.qkv = b + "attn.c_attn.weight";
    n.qkv_bias = b + "attn.c_attn.bias";
    n.o = b + "attn.c_proj.weight";
    n.o_bias = b + "attn.c_proj.bias";
    n.ffn_norm = b + "ln_2.weight";
    n.ffn_norm_bias = b + "ln_2.bias";
    n.up = b + "mlp.c_fc.weight";
    n.up_bias = b + "mlp.c_fc.bias";
    n.down = b + "mlp.c_proj.weight";
    n.down_bias = b + "mlp.c_proj.bias";
    return n;
  }
  const std::string b = c.name_prefix + "model.layers." + i + ".";
  n.attn_norm = b + "input_layernorm.weight";
  n.q = b + "self_attn.q_proj.weight";
  n.k = b + "self_attn.k_proj.weight";
  n.v = b + "self_attn.v_proj.weight";
  n.o = b + "self_attn.o_proj.weight";
  if (c.qkv_bias) {
    n.q_bias = b + "self_attn.q_proj.bias";
    n.k_bias = b + "self_attn.k_proj.bias";
    n.v_bias = b + "self_attn.v_proj.bias";
  }
  if (c.qk_norm) {
    n.q_norm = b + "self_attn.q_norm.weight";
    n.k_norm = b + "self_attn.k_norm.weight";
  }
  n.ffn_norm = b + "post_attention_layernorm.weight";
  n.gate = b + "mlp.gate_proj.weight";
  n.up = b + "mlp.up_proj.weight";
  n.down = b + "mlp.down_proj.weight";
  return n;
}

model_tensor_names tensor_names(const model_config& c) {
  model_tensor_names n;
  if (c.naming == tensor_naming::gguf) {
    n.token_embd = "token_embd.weight";
    n.output_norm = "output_norm.weight";
    n.output = c.tied_embeddings ? n.token_embd : "output.weight";
    if (c.arch == architecture::gpt2) {
      n.position_embd = "position_embd.weight";
      n.output_norm_bias = "output_norm.bias";
    }
    if (c.rope_freqs_tensor) n.rope_freqs = "rope_freqs.weight";
    return n;
  }
  if (c.arch == architecture::gpt2) {
    n.token_embd = c.name_prefix + "wte.weight";
    n.position_embd = c.name_prefix + "wpe.weight";
    n.output_norm = c.name_prefix + "ln_f.weight";
    n.output_norm_bias = c.name_prefix + "ln_f.bias";
    n.output = c.tied_embeddings ? n.token_embd : "lm_head.weight";
    return n;
  }
  n.token_embd = c.name_prefix + "model.embed_tokens.weight";
  n.output_norm = c.name_prefix + "model.norm.weight";
  n.output = c.tied_embeddings ? n.token_embd : "lm_head.weight";
  return n;
}

}  // namespace mesh::models
