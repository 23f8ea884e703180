#include "models/model_weights.hpp"

#include <cassert>
#include <cstring>

#include <fmt/format.h>

#include "graph/quant.hpp"
#include "models/dequantize.hpp"
#include "models/transformer.hpp"

namespace mesh::models {

namespace {

using dims_t = std::vector<int64_t>;

class planner {
 public:
  planner(const checkpoint& c, const weight_options& o, std::vector<weight>& out,
          std::unordered_map<std::string, size_t>& index)
      : ckpt_(c), options_(o), out_(out), index_(index) {}

  /// Requires `name` with `expected` shape (skips an empty name: a role the model lacks).
  expected<void> need(const std::string& name, const dims_t& expected_shape) {
    if (name.empty() || index_.count(name)) return {};
    auto t = ckpt_.require(name, expected_shape);
    if (!t) return forward_error(t);
    weight w{"w." + name, {*t}, shape(expected_shape.begin(), expected_shape.end()), dtype::f32, layer_};
    if (expected_shape.size() == 2) {
      const tensor_type type = (*t)->type;
      if ((type == tensor_type::f16 && options_.keep_f16) || (type == tensor_type::bf16 && options_.keep_bf16) ||
          (is_quantized(type) && options_.keep_quantized))
        w.type = to_dtype(type);
    }
    index_.emplace(name, out_.size());
    out_.push_back(std::move(w));
    return {};
  }
  /// The layer the next tensors belong to (-1: none).
  void set_layer(int64_t layer) { layer_ = layer; }

 private:
  const checkpoint& ckpt_;
  const weight_options& options_;
  std::vector<weight>& out_;
  std::unordered_map<std::string, size_t>& index_;
  int64_t layer_ = -1;
};

/// Stacks runs of neighbours in `names` (each run: two or more planned projections of one input
/// with the same device dtype, input width and checkpoint type) into one weight. The stack takes
/// the first member's place; `weights` is compacted and `index` points every member at it.
void stack_projections(std::vector<weight>& weights, std::unordered_map<std::string, size_t>& index,
                       const std::vector<std::vector<std::string>>& groups) {
  std::vector<bool> gone(weights.size(), false);
  auto fits = [&](const weight& a, const weight& b) {
    return a.dims.size() == 2 && b.dims.size() == 2 && a.dims[1] == b.dims[1] && a.type == b.type &&
           a.sources.front()->type == b.sources.front()->type && a.layer == b.layer;
  };
  for (const auto& names : groups) {
    size_t i = 0;
    while (i < names.size()) {
      auto at = [&](size_t k) -> weight& { return weights[index.at(names[k])]; };
      if (names[i].empty() || !index.count(names[i])) {
        ++i;
        continue;
      }
      size_t end = i + 1;
      while (end < names.size() && !names[end].empty() && index.count(names[end]) && fits(at(i), at(end))) ++end;
      if (end - i >= 2) {
        weight& head = at(i);
        for (size_t k = i + 1; k < end; ++k) {
          weight& member = at(k);
          head.param += "+" + names[k];
          head.sources.push_back(member.sources.front());
          head.dims[0] += member.dims[0];
          gone[index.at(names[k])] = true;
          index[names[k]] = index.at(names[i]);
        }
      }
      i = end;
    }
  }
  std::vector<size_t> moved(weights.size());
  std::vector<weight> kept;
  for (size_t k = 0; k < weights.size(); ++k) {
    moved[k] = kept.size();
    if (!gone[k]) kept.push_back(std::move(weights[k]));
  }
  for (auto& [name, k] : index) k = moved[k];
  weights = std::move(kept);
}

#define MESH_NEED(name, ...)                                     \
  do {                                                           \
    if (auto ok = p.need(name, dims_t{__VA_ARGS__}); !ok) return forward_error(ok); \
  } while (0)

}  // namespace

expected<model_weights> model_weights::plan(const model_config& c, const checkpoint& ckpt, const weight_options& options,
                                            const layer_range& layers) {
  auto range = resolve_layers(layers, c.n_layers);
  if (!range) return make_error(range.error().code, ckpt.path().string() + ": " + range.error().message);
  model_weights m;
  m.layers_ = *range;
  planner p(ckpt, options, m.weights_, m.index_);
  const int64_t d = c.hidden_size, v = c.vocab_size, f = c.ffn_size;
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  const auto top = tensor_names(c);
  const bool gpt2 = c.arch == architecture::gpt2;
  const bool in_out = c.weights_in_out;  // HF GPT-2's Conv1D layout
  // A projection from `in` to `out` features as the file stores it.
  auto proj = [&](int64_t out, int64_t in) { return in_out ? dims_t{in, out} : dims_t{out, in}; };

  if (range->takes_tokens()) {
    MESH_NEED(top.token_embd, v, d);
    if (gpt2) MESH_NEED(top.position_embd, c.max_context, d);
  }
  for (int64_t l = range->first; l < range->end; ++l) {
    const auto n = tensor_names(c, l);
    p.set_layer(l);
    MESH_NEED(n.attn_norm, d);
    MESH_NEED(n.attn_norm_bias, d);
    if (gpt2) {
      MESH_NEED(n.qkv, proj(3 * d, d));
      MESH_NEED(n.qkv_bias, 3 * d);
      MESH_NEED(n.o, proj(d, d));
      MESH_NEED(n.o_bias, d);
      MESH_NEED(n.up, proj(f, d));
      MESH_NEED(n.up_bias, f);
      MESH_NEED(n.down, proj(d, f));
      MESH_NEED(n.down_bias, d);
    } else {
      MESH_NEED(n.q, qd, d);
      MESH_NEED(n.k, kvd, d);
      MESH_NEED(n.v, kvd, d);
      if (c.qkv_bias) {
        MESH_NEED(n.q_bias, qd);
        MESH_NEED(n.k_bias, kvd);
        MESH_NEED(n.v_bias, kvd);
      }
      if (c.qk_norm) {
        MESH_NEED(n.q_norm, c.head_dim);
        MESH_NEED(n.k_norm, c.head_dim);
      }
      MESH_NEED(n.o, d, qd);
      MESH_NEED(n.gate, f, d);
      MESH_NEED(n.up, f, d);
      MESH_NEED(n.down, d, f);
    }
    MESH_NEED(n.ffn_norm, d);
    MESH_NEED(n.ffn_norm_bias, d);
  }
  p.set_layer(-1);
  if (options.fuse_projections && !gpt2) {
    std::vector<std::vector<std::string>> groups;
    for (int64_t l = range->first; l < range->end; ++l) {
      const auto n = tensor_names(c, l);
      groups.push_back({n.q, n.k, n.v});
      groups.push_back({n.gate, n.up});
    }
    stack_projections(m.weights_, m.index_, groups);
  }
  if (range->returns_logits(c.n_layers)) {
    MESH_NEED(top.output_norm, d);
    MESH_NEED(top.output_norm_bias, d);
    MESH_NEED(top.output, v, d);  // tied: the embedding's name, planned once
  }

  if (c.rope_freqs_tensor && !top.rope_freqs.empty()) {
    auto t = ckpt.require(top.rope_freqs, {c.rope_dims / 2});
    if (!t) return forward_error(t);
    if ((*t)->type != tensor_type::f32)
      return make_error(error_code::unsupported, fmt::format("{}: tensor {} is {}; rope frequency factors must be F32",
                                                             ckpt.path().string(), quote_name(top.rope_freqs),
                                                             to_string((*t)->type)));
    m.rope_freqs_.resize(static_cast<size_t>(c.rope_dims / 2));
    std::memcpy(m.rope_freqs_.data(), (*t)->data.data(), m.rope_freqs_.size() * sizeof(float));
  }
  return m;
}

#undef MESH_NEED

const weight& model_weights::at(std::string_view tensor_name) const {
  const auto it = index_.find(std::string(tensor_name));
  assert(it != index_.end());
  return weights_[it->second];
}

row_span model_weights::rows_of(std::string_view tensor_name) const {
  const weight& w = at(tensor_name);
  row_span r;
  for (const tensor_view* src : w.sources) {
    r.count = src->shape.empty() ? 1 : src->shape.front();
    if (src->name == tensor_name) return r;
    r.first += r.count;
  }
  assert(w.sources.size() == 1);  // a tensor planned under another name (never: names are the files')
  return {0, w.dims.empty() ? 1 : w.dims[0]};
}

int64_t model_weights::device_bytes() const {
  int64_t total = 0;
  for (const auto& w : weights_) total += byte_size(w.type, w.dims);
  return total;
}

expected<model_costs> plan_costs(const model_config& c, const checkpoint& ckpt, const weight_options& options,
                                 int64_t context, int64_t sequences) {
  auto whole = model_weights::plan(c, ckpt, options);
  if (!whole) return forward_error(whole);
  auto bytes = [&](const std::string& name) {
    if (name.empty() || !whole->has(name)) return int64_t{0};
    const weight& w = whole->at(name);
    return byte_size(w.type, w.dims);
  };
  model_costs out;
  out.layer_bytes.assign(static_cast<size_t>(c.n_layers), 0);
  for (const auto& w : whole->all())
    if (w.layer >= 0) out.layer_bytes[static_cast<size_t>(w.layer)] += byte_size(w.type, w.dims);
  out.kv_bytes_per_layer = sequences * kv_cache_bytes(c, context);
  const auto top = tensor_names(c);
  out.first_bytes = bytes(top.token_embd) + bytes(top.position_embd);
  out.last_bytes = bytes(top.output_norm) + bytes(top.output_norm_bias) + bytes(top.output);
  out.shared_bytes = top.output == top.token_embd ? bytes(top.output) : 0;
  return out;
}

expected<std::vector<std::vector<file_span>>> stage_file_ranges(const model_config& config, const checkpoint& ckpt,
                                                                 const layer_range& layers) {
  auto planned = model_weights::plan(config, ckpt, {}, layers);
  if (!planned) return forward_error(planned);
  std::vector<std::vector<file_span>> out;
  for (const uint64_t header : ckpt.header_bytes()) out.push_back({{0, header}});
  for (const auto& w : planned->all())
    for (const tensor_view* src : w.sources) {
      auto at = ckpt.locate(src->data);
      if (!at || at->file >= out.size())
        return make_error(error_code::internal, fmt::format("{}: tensor {} lies outside the checkpoint's files", ckpt.path().string(), src->name));
      out[at->file].push_back({at->offset, src->data.size()});
    }
  for (auto& spans : out) {  // sorted, touching or overlapping ones merged
    std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    std::vector<file_span> merged;
    for (const auto& x : spans) {
      if (x.length == 0) continue;
      if (!merged.empty() && x.offset <= merged.back().offset + merged.back().length)
        merged.back().length = std::max(merged.back().offset + merged.back().length, x.offset + x.length) - merged.back().offset;
      else
        merged.push_back(x);
    }
    spans = std::move(merged);
  }
  return out;
}

namespace {

bool source_as_is(const weight& w) { return w.type == to_dtype(w.sources.front()->type); }

}  // namespace

bool stored_as_is(const weight& w) { return w.sources.size() == 1 && source_as_is(w); }

mesh::tensor_view device_view(const weight& w) {
  assert(stored_as_is(w));
  return mesh::tensor_view{w.type, w.dims, w.sources.front()->data};
}

expected<tensor> load_weight(const weight& w) {
  tensor out;
  out.type = w.type;
  out.dims = w.dims;
  if (source_as_is(w)) {  // the bytes as they lie, a fused weight's one source after the other
    for (const tensor_view* src : w.sources) out.bytes.insert(out.bytes.end(), src->data.begin(), src->data.end());
    if (static_cast<int64_t>(out.bytes.size()) != byte_size(w.type, w.dims))
      return make_error(error_code::internal, "load_weight: " + w.param + ": its sources do not add up to its shape");
    return out;
  }
  if (w.type != dtype::f32)
    return make_error(error_code::internal, "load_weight: " + w.param + " cannot become " + to_string(w.type));
  out.bytes.resize(static_cast<size_t>(element_count(w.dims)) * sizeof(float));
  auto* dst = reinterpret_cast<float*>(out.bytes.data());
  for (const tensor_view* src : w.sources) {
    // Rows are the innermost dimension (ggml's ne[0]): quantized blocks never cross them.
    const int64_t n = src->elements();
    const int64_t row = src->shape.empty() ? 1 : src->shape.back();
    const int64_t rows = row == 0 ? 0 : n / row;
    auto rb = row_bytes(src->type, row);
    if (!rb) return forward_error(rb);
    for (int64_t r = 0; r < rows; ++r) {
      auto ok = dequantize_row(src->type, src->data.subspan(static_cast<size_t>(r * *rb), static_cast<size_t>(*rb)),
                               std::span<float>(dst + r * row, static_cast<size_t>(row)));
      if (!ok) return make_error(ok.error().code, "tensor " + quote_name(src->name) + ": " + ok.error().message);
    }
    dst += n;
  }
  return out;
}

}  // namespace mesh::models
