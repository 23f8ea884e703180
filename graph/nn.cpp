#include "graph/nn.hpp"

#include <cmath>
#include <random>

namespace mesh::nn {

expr softmax(const expr& x, int64_t axis, source_loc loc) {
  // Subtracting the row max keeps exp() finite; it cancels in the ratio.
  const expr e = exp(x - max_over(x, {axis}, true, loc), loc);
  return e / sum(e, {axis}, true, loc);
}

expr log_softmax(const expr& x, int64_t axis, source_loc loc) {
  const expr shifted = x - max_over(x, {axis}, true, loc);
  return shifted - log(sum(exp(shifted, loc), {axis}, true, loc), loc);
}

expr iota(builder& b, int64_t n, source_loc loc) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i);
  return b.constant(tensor::from_values(dtype::i32, {n}, v), loc);
}

expr one_hot(const expr& labels, int64_t classes, dtype t, source_loc loc) {
  if (!labels.owner()) return {};
  builder& b = *labels.owner();
  const expr classes_iota = iota(b, classes, loc);
  // A label outside [0, classes) would compare equal to no class and get a row of zeros, which
  // cross_entropy would count as a perfect prediction. Passing the labels through a gather from
  // iota (the identity for labels in range) makes such a label an error in the reference
  // evaluator, which names it; on an executor it reads 0, like any unchecked gather.
  const expr checked = gather(classes_iota, labels, loc);
  shape s = checked.dims();
  s.push_back(1);
  const expr eq = compare(reshape(checked, s, loc), classes_iota, compare_kind::eq);
  return cast(eq, t, loc);
}

expr cross_entropy(const expr& logits, const expr& labels, source_loc loc) {
  if (!logits.ok()) return logits;
  const expr picked = sum(log_softmax(logits, -1, loc) * one_hot(labels, logits.dims().back(), logits.type(), loc), {-1},
                          false, loc);
  return neg(mean_all(picked, loc), loc);
}

expr mse(const expr& prediction, const expr& target, source_loc loc) {
  const expr d = prediction - target;
  return mean_all(d * d, loc);
}

expr layer_norm(const expr& x, const expr& gamma, const expr& beta, double eps, source_loc loc) {
  const expr centred = x - mean(x, {-1}, true, loc);
  const expr var = mean(centred * centred, {-1}, true, loc);
  return centred * rsqrt(var + eps, loc) * gamma + beta;
}

expr gelu(const expr& x, source_loc loc) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x), loc));
}

expr linear::operator()(const expr& x, source_loc loc) const { return matmul(x, w, loc) + b; }

linear make_linear(builder& b, const std::string& name, int64_t in, int64_t out, dtype t) {
  return {b.parameter(name + ".w", t, {in, out}), b.parameter(name + ".b", t, {out})};
}

expr mlp::operator()(const expr& x, source_loc loc) const {
  expr h = x;
  for (size_t i = 0; i < layers.size(); ++i) {
    h = layers[i](h, loc);
    if (i + 1 < layers.size()) h = tanh(h, loc);
  }
  return h;
}

mlp make_mlp(builder& b, const std::string& name, const std::vector<int64_t>& sizes, dtype t) {
  mlp m;
  for (size_t i = 0; i + 1 < sizes.size(); ++i)
    m.layers.push_back(make_linear(b, name + "." + std::to_string(i), sizes[i], sizes[i + 1], t));
  return m;
}

expr attention::operator()(const expr& x, source_loc loc) const {
  if (!x.ok() || x.rank() != 3) return x.owner() ? x.owner()->fail({error_code::shape_mismatch, "attention: input must be [batch, time, channels]"}, loc) : x;
  builder& b = *x.owner();
  const int64_t B = x.dims()[0], T = x.dims()[1], C = x.dims()[2], D = C / heads;
  if (heads <= 0 || C % heads) return b.fail({error_code::shape_mismatch, "attention: channels not divisible by heads"}, loc);
  const auto split = [&](const expr& w) {  // [B,T,C] -> [B,H,T,D]
    return permute(reshape(matmul(x, w, loc), {B, T, heads, D}, loc), {0, 2, 1, 3}, loc);
  };
  const expr q = split(wq), k = split(wk), v = split(wv);
  // Causal mask: -1e9 above the diagonal, so softmax gives those positions ~0 weight.
  std::vector<double> mask(static_cast<size_t>(T * T), 0.0);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) mask[static_cast<size_t>(i * T + j)] = -1e9;
  const expr scores = matmul(q, transpose(k, loc), loc) * (1.0 / std::sqrt(static_cast<double>(D))) +
                      b.constant(tensor::from_values(x.type(), {T, T}, mask), loc);
  const expr ctx = matmul(softmax(scores, -1, loc), v, loc);  // [B,H,T,D]
  return matmul(reshape(permute(ctx, {0, 2, 1, 3}, loc), {B, T, C}, loc), wo, loc);
}

attention make_attention(builder& b, const std::string& name, int64_t channels, int64_t heads, dtype t) {
  return {b.parameter(name + ".wq", t, {channels, channels}), b.parameter(name + ".wk", t, {channels, channels}),
          b.parameter(name + ".wv", t, {channels, channels}), b.parameter(name + ".wo", t, {channels, channels}), heads};
}

expr transformer_block::operator()(const expr& x, source_loc loc) const {
  const expr h = x + attn(layer_norm(x, ln1_gamma, ln1_beta, 1e-5, loc), loc);
  return h + down(gelu(up(layer_norm(h, ln2_gamma, ln2_beta, 1e-5, loc), loc), loc), loc);
}

transformer_block make_transformer_block(builder& b, const std::string& name, int64_t channels, int64_t heads, dtype t) {
  transformer_block blk;
  blk.ln1_gamma = b.parameter(name + ".ln1.gamma", t, {channels});
  blk.ln1_beta = b.parameter(name + ".ln1.beta", t, {channels});
  blk.attn = make_attention(b, name + ".attn", channels, heads, t);
  blk.ln2_gamma = b.parameter(name + ".ln2.gamma", t, {channels});
  blk.ln2_beta = b.parameter(name + ".ln2.beta", t, {channels});
  blk.up = make_linear(b, name + ".up", channels, 4 * channels, t);
  blk.down = make_linear(b, name + ".down", 4 * channels, channels, t);
  return blk;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

tensor_map init_parameters(const graph& g, uint64_t seed) {
  tensor_map out;
  std::mt19937_64 rng(seed);
  for (const auto& n : g.nodes) {
    if (n.op != op_kind::parameter) continue;
    const std::string& name = n.attrs.name;
    const int64_t count = element_count(n.dims);
    std::vector<double> v(static_cast<size_t>(count), 0.0);
    if (name.rfind("opt.", 0) == 0 || ends_with(name, ".b") || ends_with(name, ".beta")) {
      // zeros
    } else if (ends_with(name, ".gamma")) {
      std::fill(v.begin(), v.end(), 1.0);
    } else {
      double limit = 0.1;
      if (n.dims.size() >= 2) {
        const double fan_in = static_cast<double>(n.dims[n.dims.size() - 2]), fan_out = static_cast<double>(n.dims.back());
        limit = std::sqrt(6.0 / (fan_in + fan_out));
      }
      std::uniform_real_distribution<double> dist(-limit, limit);
      for (auto& x : v) x = dist(rng);
    }
    out[name] = tensor::from_values(n.type, n.dims, v);
  }
  return out;
}

}  // namespace mesh::nn
