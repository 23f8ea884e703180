#include "models/layers.hpp"

#include <cmath>

#include "graph/nn.hpp"

namespace mesh::models::layers {

expr linear(const expr& x, const expr& w, bool in_out) {
  if (!in_out) return mesh::linear(x, w);
  // HF GPT-2's Conv1D stores [in, out]: a plain matmul, a half-precision weight widened as the
  // matmul reads it (an inline cast, no copy on the Vulkan executor).
  return matmul(x, w.type() == dtype::f32 ? w : cast(w, dtype::f32));
}

expr embedding(const expr& table, const expr& ids) {
  // The cast fuses into the gather's reads, so only the rows asked for are decoded.
  return gather(table.type() == dtype::f32 ? table : cast(table, dtype::f32), ids);
}

expr rms_norm(const expr& x, const expr& w, double eps) {
  const expr w32 = w.type() == dtype::f32 ? w : cast(w, dtype::f32);
  return x * rsqrt(mean(x * x, {-1}, true) + eps) * w32;
}

std::vector<double> rope_frequencies(const model_config& c, const std::vector<float>& freq_divisors) {
  const int64_t half = c.rope_dims / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.rope_dims));
  const auto& s = c.scaling;
  if (s.type == rope_scaling::kind::llama3) {
    // Long wavelengths (low frequencies) are divided by factor, short ones kept, and the band
    // between interpolated smoothly (Llama 3.1's published scheme).
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
    for (auto& x : f) {
      const double wavelen = 2 * M_PI / x;
      if (wavelen > low_wavelen) {
        x /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        x = (1 - smooth) * x / s.factor + smooth * x;
      }
    }
  } else if (s.type == rope_scaling::kind::linear) {
    for (auto& x : f) x /= s.factor;
  }
  for (size_t i = 0; i < freq_divisors.size() && i < f.size(); ++i) f[i] /= static_cast<double>(freq_divisors[i]);
  return f;
}

expr rope(const expr& x, const expr& cos, const expr& sin, int64_t dims, rope_style style) {
  if (style == rope_style::none || dims == 0) return x;
  const shape s = x.dims();
  const int64_t rows = s[0], heads = s[1], head_dim = s[2], half = dims / 2;
  const expr rotated = dims == head_dim ? x : slice_axis(x, 2, 0, dims);
  expr out;
  if (style == rope_style::neox) {
    const expr a = slice_axis(rotated, 2, 0, half), b = slice_axis(rotated, 2, half, dims);
    out = concat({a * cos - b * sin, b * cos + a * sin}, 2);
  } else {
    const expr pairs = reshape(rotated, {rows, heads, half, 2});
    const expr a = reshape(slice_axis(pairs, 3, 0, 1), {rows, heads, half});
    const expr b = reshape(slice_axis(pairs, 3, 1, 2), {rows, heads, half});
    const expr ra = reshape(a * cos - b * sin, {rows, heads, half, 1});
    const expr rb = reshape(b * cos + a * sin, {rows, heads, half, 1});
    out = reshape(concat({ra, rb}, 3), {rows, heads, dims});
  }
  return dims == head_dim ? out : concat({out, slice_axis(x, 2, dims, head_dim)}, 2);
}

expr write_cache(const expr& cache, const expr& rows, const expr& dest) {
  const expr written = kv_write(cache, rows, dest, 0);
  cache.owner()->update(cache, written);
  return written;
}

expr slot_rows(const expr& cache, const expr& slot, int64_t context, int64_t attended) {
  // Rows by index (a gather the kernels read through, as they do slices): no node of the whole
  // cache's size besides the cache itself.
  return gather(cache, nn::iota(*cache.owner(), attended) + slot * static_cast<double>(context));
}

expr attention(const expr& q, const expr& k_cache, const expr& v_cache, const expr& positions, int64_t kv_heads,
               int64_t attended, int64_t window) {
  builder& b = *q.owner();
  const shape qs = q.dims();
  const int64_t l = qs[0], heads = qs[1], head_dim = qs[2], group = heads / kv_heads;
  if (l <= fused_attention_max_rows || head_dim <= fused_attention_max_head_dim) {
    auto rows_of = [&](const expr& cache) { return reshape(slice_axis(cache, 0, 0, attended), {attended, kv_heads, head_dim}); };
    return reshape(mesh::attention(q, rows_of(k_cache), rows_of(v_cache), positions, window), {l, heads * head_dim});
  }
  // Queries grouped by their key/value head: [kv, group * l, d].
  const expr qg = reshape(permute(reshape(q, {l, kv_heads, group, head_dim}), {1, 2, 0, 3}), {kv_heads, group * l, head_dim});
  auto heads_of = [&](const expr& cache) {
    return permute(reshape(slice_axis(cache, 0, 0, attended), {attended, kv_heads, head_dim}), {1, 0, 2});  // [kv, t, d]
  };
  const expr k = heads_of(k_cache), v = heads_of(v_cache);
  const expr scores = reshape(matmul(qg, transpose(k)) * (1.0 / std::sqrt(static_cast<double>(head_dim))),
                              {kv_heads, group, l, attended});
  // Row i sees key t when t <= positions[i] (and within the window). Masked scores get a large
  // negative number rather than -inf, so that a row that sees nothing (batch padding) stays
  // finite instead of making NaN that a later cache write could carry.
  const expr t = reshape(nn::iota(b, attended), {1, attended});
  const expr pos = reshape(positions, {l, 1});
  expr visible = compare(t, pos, compare_kind::le);
  if (window > 0) visible = visible * compare(t, pos - static_cast<double>(window), compare_kind::gt);
  const expr probs = nn::softmax(select(visible, scores, -1e30), -1);
  // probs x v: [kv, group * l, attended] x [kv, attended, d]. With few query rows (decode) that
  // product is one output tile per key/value head and a long loop over the attended rows; split
  // the rows into `parts` slices, multiplied as a batch, and add the slices' products up, so that
  // kv_heads x parts workgroups share the loop.
  const int64_t rows = group * l;
  int64_t parts = 1;
  if (rows <= 64)
    for (int64_t p : {16, 8, 4, 2})
      if (attended % p == 0 && attended / p >= 32) {
        parts = p;
        break;
      }
  expr out;  // [kv, group * l, d]
  if (parts == 1) {
    out = matmul(reshape(probs, {kv_heads, rows, attended}), v);
  } else {
    const int64_t slice = attended / parts;
    const expr ps = permute(reshape(probs, {kv_heads, rows, parts, slice}), {0, 2, 1, 3});  // [kv, parts, rows, slice]
    const expr vs = reshape(v, {kv_heads, parts, slice, head_dim});
    out = sum(matmul(ps, vs), {1});  // [kv, parts, rows, d] -> [kv, rows, d]
  }
  return reshape(permute(reshape(out, {kv_heads, group, l, head_dim}), {2, 0, 1, 3}), {l, heads * head_dim});
}

expr batched_attention(const expr& q, const expr& k_cache, const expr& v_cache, const expr& positions, const expr& row_slots,
                       int64_t kv_heads, int64_t context, int64_t attended, int64_t window) {
  builder& b = *q.owner();
  const shape qs = q.dims();
  const int64_t n = qs[0], heads = qs[1], head_dim = qs[2], group = heads / kv_heads;
  // Cache rows row_slots[i] * context + t, read by index (a gather the kernels read through, as
  // they do slices: no node of the whole cache's size).
  const expr rows = reshape(row_slots * static_cast<double>(context), {n, 1}) + reshape(nn::iota(b, attended), {1, attended});
  if (n <= fused_attention_max_rows) {
    auto rows_of = [&](const expr& cache) { return reshape(gather(cache, rows), {n, attended, kv_heads, head_dim}); };
    const expr out = mesh::attention(reshape(q, {n, 1, heads, head_dim}), rows_of(k_cache), rows_of(v_cache), reshape(positions, {n, 1}), window);
    return reshape(out, {n, heads * head_dim});
  }
  const expr qg = reshape(q, {n, kv_heads, group, head_dim});
  auto heads_of = [&](const expr& cache) {  // [n, kv, t, d]
    return permute(reshape(gather(cache, rows), {n, attended, kv_heads, head_dim}), {0, 2, 1, 3});
  };
  const expr k = heads_of(k_cache), v = heads_of(v_cache);
  const expr scores = matmul(qg, transpose(k)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));  // [n, kv, group, t]
  const expr t = reshape(nn::iota(b, attended), {1, 1, 1, attended});
  const expr pos = reshape(positions, {n, 1, 1, 1});
  expr visible = compare(t, pos, compare_kind::le);
  if (window > 0) visible = visible * compare(t, pos - static_cast<double>(window), compare_kind::gt);
  const expr probs = nn::softmax(select(visible, scores, -1e30), -1);
  // As in attention(): the long loop over the attended rows is split into slices that run as a
  // batch and are added up, so that more workgroups share it.
  int64_t parts = 1;
  for (int64_t p : {16, 8, 4, 2})
    if (attended % p == 0 && attended / p >= 32) {
      parts = p;
      break;
    }
  expr out;  // [n, kv, group, d]
  if (parts == 1) {
    out = matmul(probs, v);
  } else {
    const int64_t slice = attended / parts;
    const expr ps = permute(reshape(probs, {n, kv_heads, group, parts, slice}), {0, 1, 3, 2, 4});  // [n, kv, parts, group, slice]
    const expr vs = reshape(v, {n, kv_heads, parts, slice, head_dim});
    out = sum(matmul(ps, vs), {2});
  }
  return reshape(out, {n, heads * head_dim});
}

}  // namespace mesh::models::layers
