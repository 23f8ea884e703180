#include "models/transformer.hpp"

#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "graph/nn.hpp"
#include "models/layers.hpp"

namespace mesh::models {

namespace {

struct context {
  builder& b;
  const model_config& c;
  const model_weights& w;
  const std::string& prefix;
  /// Parameters made so far, by parameter name: tied embeddings read one tensor in two roles, and
  /// the projections of a fused weight read one parameter.
  mutable std::unordered_map<std::string, expr> params = {};
  /// Products of a fused weight made so far, by parameter name and input node: q, k and v (or
  /// gate and up) take their rows of one product.
  mutable std::map<std::pair<std::string, node_index>, expr> stacked = {};

  /// The parameter of a checkpoint tensor (its dtype and shape as planned; a fused tensor's is
  /// the whole stack).
  expr param(const std::string& tensor_name) const {
    const weight& x = w.at(tensor_name);
    if (auto it = params.find(x.param); it != params.end()) return it->second;
    return params[x.param] = b.parameter(prefix + x.param, x.type, x.dims);
  }
  /// A vector parameter (norm weights, biases) as f32.
  expr vec(const std::string& tensor_name) const {
    const expr p = param(tensor_name);
    return p.type() == dtype::f32 ? p : cast(p, dtype::f32);
  }
  expr proj(const expr& x, const std::string& weight_name, const std::string& bias_name = {}) const {
    const weight& wt = w.at(weight_name);
    expr y;
    if (wt.sources.size() == 1) {
      y = layers::linear(x, param(weight_name), c.weights_in_out);
    } else {  // a fused weight: this tensor's columns of the stack's product ([rows, out] for 2-D x)
      auto key = std::make_pair(wt.param, x.id());
      auto it = stacked.find(key);
      if (it == stacked.end()) it = stacked.emplace(key, layers::linear(x, param(weight_name), false)).first;
      const row_span r = w.rows_of(weight_name);
      y = slice_axis(it->second, -1, r.first, r.first + r.count);
    }
    return bias_name.empty() ? y : y + vec(bias_name);
  }
  expr norm(const expr& x, const std::string& weight_name, const std::string& bias_name) const {
    if (c.layer_norm) return nn::layer_norm(x, vec(weight_name), vec(bias_name), c.norm_eps);
    return layers::rms_norm(x, vec(weight_name), c.norm_eps);
  }
};

struct step_inputs {
  expr tokens, start, count;
  expr positions;  // i32 [l]: each row's position, clamped into the cache
  expr dest;       // i32 [l]: the cache row each row's keys and values go to (-1: none)
  expr slot;       // i32 [1]: the sequence of an unbatched step (several slots only)
  expr row_slots;  // i32 [l]: the sequence of each row of a batched step
};

// Attention of one layer given its q [l, heads, d], k and v [l, kv_heads * d]: writes the cache,
// attends, returns [l, heads * d].
expr cached_attention(const context& cx, const step_shape& s, const step_inputs& in, int64_t layer, const expr& q,
                      const expr& k, const expr& v) {
  const int64_t width = cx.c.n_kv_heads * cx.c.head_dim, rows = s.slots * s.context;
  const expr k_cache = cx.b.parameter(kv_cache_name(cx.prefix, layer, false), dtype::f32, {rows, width});
  const expr v_cache = cx.b.parameter(kv_cache_name(cx.prefix, layer, true), dtype::f32, {rows, width});
  const expr k_new = layers::write_cache(k_cache, k, in.dest);
  const expr v_new = layers::write_cache(v_cache, v, in.dest);
  const int64_t kv = cx.c.n_kv_heads, window = cx.c.sliding_window;
  if (s.batched) return layers::batched_attention(q, k_new, v_new, in.positions, in.row_slots, kv, s.context, s.attended, window);
  if (s.slots == 1) return layers::attention(q, k_new, v_new, in.positions, kv, s.attended, window);
  const auto rows_of = [&](const expr& cache) { return layers::slot_rows(cache, in.slot, s.context, s.attended); };
  return layers::attention(q, rows_of(k_new), rows_of(v_new), in.positions, kv, s.attended, window);
}

expr llama_layer(const context& cx, const step_shape& s, const step_inputs& in, const expr& rope_cos,
                 const expr& rope_sin, int64_t layer, const expr& x) {
  const auto& c = cx.c;
  const auto n = tensor_names(c, layer);
  const int64_t l = s.tokens;
  const expr h = cx.norm(x, n.attn_norm, n.attn_norm_bias);
  expr q = reshape(cx.proj(h, n.q, n.q_bias), {l, c.n_heads, c.head_dim});
  expr k = reshape(cx.proj(h, n.k, n.k_bias), {l, c.n_kv_heads, c.head_dim});
  const expr v = cx.proj(h, n.v, n.v_bias);
  if (c.qk_norm) {  // Qwen3: RMSNorm over each head, before rope
    q = layers::rms_norm(q, cx.vec(n.q_norm), c.norm_eps);
    k = layers::rms_norm(k, cx.vec(n.k_norm), c.norm_eps);
  }
  q = layers::rope(q, rope_cos, rope_sin, c.rope_dims, c.rope);
  k = layers::rope(k, rope_cos, rope_sin, c.rope_dims, c.rope);
  const expr attn = cached_attention(cx, s, in, layer, q, reshape(k, {l, c.n_kv_heads * c.head_dim}), v);
  const expr x1 = x + cx.proj(attn, n.o, n.o_bias);
  const expr h2 = cx.norm(x1, n.ffn_norm, n.ffn_norm_bias);
  const expr gate = cx.proj(h2, n.gate);
  const expr mlp = cx.proj(gate * sigmoid(gate) * cx.proj(h2, n.up), n.down);  // SwiGLU
  return x1 + mlp;
}

expr gpt2_layer(const context& cx, const step_shape& s, const step_inputs& in, int64_t layer, const expr& x) {
  const auto& c = cx.c;
  const auto n = tensor_names(c, layer);
  const int64_t l = s.tokens, d = c.hidden_size;
  const expr h = cx.norm(x, n.attn_norm, n.attn_norm_bias);
  const expr qkv = cx.proj(h, n.qkv, n.qkv_bias);  // [l, 3d]: q, k, v side by side
  const expr q = reshape(slice_axis(qkv, 1, 0, d), {l, c.n_heads, c.head_dim});
  const expr attn = cached_attention(cx, s, in, layer, q, slice_axis(qkv, 1, d, 2 * d), slice_axis(qkv, 1, 2 * d, 3 * d));
  const expr x1 = x + cx.proj(attn, n.o, n.o_bias);
  const expr h2 = cx.norm(x1, n.ffn_norm, n.ffn_norm_bias);
  return x1 + cx.proj(nn::gelu(cx.proj(h2, n.up, n.up_bias)), n.down, n.down_bias);
}

}  // namespace

std::string kv_cache_name(const std::string& prefix, int64_t layer, bool value) {
  return fmt::format("{}kv.{}.{}", prefix, layer, value ? 'v' : 'k');
}

int64_t kv_cache_bytes(const model_config& c, int64_t context) {
  return 2 * context * c.n_kv_heads * c.head_dim * static_cast<int64_t>(sizeof(float));
}

std::string greedy_token_name(const std::string& prefix) { return prefix + "greedy.token"; }
std::string greedy_position_name(const std::string& prefix) { return prefix + "greedy.position"; }
std::string greedy_history_name(const std::string& prefix) { return prefix + "greedy.history"; }

namespace {

/// The first index of the largest of logits [1, vocab], as i32 [1]; vocab where none equals the
/// maximum (NaN), which the caller reports.
expr first_argmax(const expr& logits, int64_t vocab) {
  builder& b = *logits.owner();
  const expr top = max_over(logits, {-1}, true);  // [1, 1]
  const expr index = reshape(nn::iota(b, vocab), {1, vocab});
  // The largest of -index among the maxima is minus the first index.
  const expr candidates = select(compare(logits, top, compare_kind::eq), -cast(index, dtype::f32),
                                 -static_cast<double>(vocab));
  return cast(-max_over(candidates, {-1}), dtype::i32);  // [1]
}

}  // namespace

expected<graph> build_step_graph(const model_config& c, const model_weights& w, const step_shape& s,
                                 const std::string& prefix) {
  if (s.tokens < 1 || s.context < 1 || s.attended < 1 || s.attended > s.context || s.slots < 1 ||
      (s.batched && s.tokens > s.slots))
    return make_error(error_code::invalid_argument,
                      fmt::format("step graph: {} tokens, {} attended rows of a {}-row cache of {} slots do not fit",
                                  s.tokens, s.attended, s.context, s.slots));
  if (c.arch == architecture::gpt2 && s.context > c.max_context)
    return make_error(error_code::invalid_argument,
                      fmt::format("step graph: GPT-2 has {} learned positions, fewer than the {} asked for",
                                  c.max_context, s.context));
  auto range = resolve_layers(s.layers, c.n_layers);
  if (!range) return make_error(range.error().code, "step graph: " + range.error().message);
  if (s.greedy && (s.tokens != 1 || s.batched || s.all_logits || !range->takes_tokens() ||
                   !range->returns_logits(c.n_layers)))
    return make_error(error_code::invalid_argument,
                      "step graph: a greedy step is one token of one sequence through the whole model");
  builder b;
  const context cx{b, c, w, prefix};
  const auto top = tensor_names(c);
  const bool gpt2 = c.arch == architecture::gpt2;
  step_inputs in;
  // The first input is the tokens (the first stage) or the stream from the previous stage.
  expr x;
  expr greedy_token, greedy_position;
  if (s.greedy) {
    greedy_token = b.parameter(greedy_token_name(prefix), dtype::i32, {1});
    greedy_position = b.parameter(greedy_position_name(prefix), dtype::i32, {1});
    in.tokens = greedy_token;
  } else if (range->takes_tokens()) {
    in.tokens = b.input("tokens", dtype::i32, {s.tokens});
  } else {
    x = b.input("hidden", dtype::f32, {s.tokens, c.hidden_size});
  }
  const expr row = nn::iota(b, s.tokens);
  if (s.batched) {
    // Row i is the next token of the sequence in slot slots[i]; an idle row (position -1)
    // attends to position 0 of its slot and writes nothing.
    const expr given = b.input("positions", dtype::i32, {s.tokens});
    in.row_slots = b.input("slots", dtype::i32, {s.tokens});
    in.positions = maximum(given, 0.0);
    in.dest = select(compare(given, 0.0, compare_kind::ge), in.row_slots * static_cast<double>(s.context) + given, -1.0);
  } else {
    in.start = s.greedy ? greedy_position : b.input("start", dtype::i32, {1});
    in.count = s.greedy ? b.constant(tensor::from_ints({1}, {1})) : b.input("count", dtype::i32, {1});
    // Padding rows may run past the cache: their positions are clamped, and they write nothing.
    in.positions = minimum(row + in.start, static_cast<double>(s.context - 1));
    expr first_row = in.start;  // the cache row of the step's first position
    if (s.slots > 1) {
      in.slot = b.input("slot", dtype::i32, {1});
      first_row = first_row + in.slot * static_cast<double>(s.context);
    }
    in.dest = select(compare(row, in.count, compare_kind::lt), row + first_row, -1.0);
  }

  if (range->takes_tokens()) {
    x = layers::embedding(cx.param(top.token_embd), in.tokens);
    if (gpt2) x = x + gather(cx.vec(top.position_embd), in.positions);
  }
  if (gpt2) {
    for (int64_t l = range->first; l < range->end; ++l) x = gpt2_layer(cx, s, in, l, x);
  } else {
    expr rope_cos, rope_sin;
    if (c.rope != rope_style::none) {
      const auto freqs = layers::rope_frequencies(c, w.rope_freqs());
      const int64_t half = c.rope_dims / 2;
      const expr f = b.constant(tensor::from_values(dtype::f32, {1, half}, freqs));
      const expr angle = reshape(cast(in.positions, dtype::f32), {s.tokens, 1}) * f;  // [l, half]
      rope_cos = reshape(cos(angle), {s.tokens, 1, half});
      rope_sin = reshape(sin(angle), {s.tokens, 1, half});
    }
    for (int64_t l = range->first; l < range->end; ++l) x = llama_layer(cx, s, in, rope_cos, rope_sin, l, x);
  }
  if (range->returns_logits(c.n_layers)) {
    if (!s.all_logits && !s.batched) x = gather(x, in.count - 1.0);  // the last real row: [1, d]
    x = cx.norm(x, top.output_norm, top.output_norm_bias);
    const expr logits = layers::linear(x, cx.param(top.output));
    if (s.greedy) {
      const expr next = first_argmax(logits, c.vocab_size);
      const expr history = b.parameter(greedy_history_name(prefix), dtype::f32, {s.slots * s.context, 1});
      b.update(history, kv_write(history, reshape(cast(next, dtype::f32), {1, 1}), in.dest, 0));
      // The history keeps `vocab` for a step without a maximum (the host reports it); the next
      // step's embedding reads a row that exists.
      b.update(greedy_token, minimum(next, static_cast<double>(c.vocab_size - 1)));
      b.update(greedy_position, greedy_position + 1.0);
      b.output("token", next);
    } else {
      b.output("logits", logits);
    }
  } else {
    b.output("hidden", x);  // every row: the next stage's batch has the same rows
  }
  auto g = b.finish();
  if (!g) return make_error(error_code::internal, "step graph of " + std::string(to_string(c.arch)) + ": " + g.error().message);
  return g;
}

}  // namespace mesh::models
