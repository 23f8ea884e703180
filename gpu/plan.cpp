#include "gpu/plan.hpp"

#include <algorithm>
#include <set>

namespace mesh::gpu {

bool is_splat(const node& n) { return n.op == op_kind::constant && n.attrs.values.size() == 1; }

namespace {

bool is_anchor(op_kind op) {
  return op == op_kind::matmul || op == op_kind::linear || op == op_kind::reduce_sum || op == op_kind::reduce_max ||
         op == op_kind::scatter_add || op == op_kind::kv_write || op == op_kind::attention;
}

bool is_leaf_buffer(const node& n) {
  return n.op == op_kind::input || n.op == op_kind::parameter || (n.op == op_kind::constant && !is_splat(n));
}

/// Consumers that read an operand at an index other than their own output index.
bool reindexes(op_kind op) {
  const auto f = family_of(op);
  return f == op_family::movement || f == op_family::gather;
}

/// The kernel(s) of reduction kernel `k`: itself, or its two passes when splitting pays.
void add_reduction(const graph& g, const kernel& k, const split_options& split, plan& p) {
  const reduction_layout l = layout_of(g, k.anchor);
  const int64_t slices = split_slices(l, split);
  if (slices == 0) {
    p.kernels.push_back(k);
    return;
  }
  kernel first = k;
  first.pass = 1;
  first.slices = slices;
  first.scratch = static_cast<int>(p.scratch.size());
  // Partials stay in the accumulator's type: an f16 sum is rounded once, at the end.
  p.scratch.push_back({g[k.anchor].type == dtype::i32 ? dtype::i32 : dtype::f32, slices * l.outputs});
  kernel second = first;
  second.pass = 2;
  p.kernels.push_back(first);
  p.kernels.push_back(second);
}

/// Attention runs as two kernels (flash decoding): pass 1 takes slices of the keys of every
/// query row and head (its own maximum, weight sum and weighted sum of v into the scratch
/// buffer: d + 2 floats), pass 2 combines a row's slices. Many slices share the keys of a long
/// cache even when a decode step has few rows and heads: a slice is one tile of
/// attention_slice_keys keys, or as many tiles as keep the partials within
/// attention_partials_max floats (the buffer is the plan's, outside the graph's byte limits: a
/// graph from a peer cannot make it grow with the keys).
void add_attention(const graph& g, const kernel& k, plan& p) {
  const shape& kd = g[g[k.root].inputs[1]].dims;
  const int64_t d = kd.back(), t = kd[kd.size() - 3], rows = d ? element_count(g[k.root].dims) / d : 0;
  const shape& qd = g[g[k.root].inputs[0]].dims;
  if (qd[qd.size() - 3] >= attention_tiled_min_rows && d <= attention_tiled_max_dim) {
    p.kernels.push_back(k);  // one kernel, pass 0 (`attnt`)
    return;
  }
  kernel first = k;
  first.pass = 1;
  const int64_t tiles = std::max<int64_t>(1, (t + attention_slice_keys - 1) / attention_slice_keys);
  first.slices = std::clamp<int64_t>(attention_partials_max / std::max<int64_t>(1, rows * (d + 2)), 1, tiles);
  first.scratch = static_cast<int>(p.scratch.size());
  p.scratch.push_back({dtype::f32, std::max<int64_t>(1, rows * first.slices * (d + 2))});
  kernel second = first;
  second.pass = 2;
  p.kernels.push_back(first);
  p.kernels.push_back(second);
}

}  // namespace

reduction_layout layout_of(const graph& g, node_index reduce) {
  const node& r = g[reduce];
  const shape& xd = g[r.inputs[0]].dims;
  std::vector<bool> reduced(xd.size(), false);
  for (auto a : r.attrs.axes) reduced[static_cast<size_t>(a)] = true;
  reduction_layout l;
  l.outputs = l.reduced = 1;
  for (size_t a = 0; a < xd.size(); ++a) (reduced[a] ? l.reduced : l.outputs) *= xd[a];
  size_t first_red = xd.size();
  while (first_red > 0 && reduced[first_red - 1]) --first_red;
  l.trailing = true;
  for (size_t a = 0; a < first_red; ++a) l.trailing = l.trailing && !reduced[a];
  size_t last_red = 0;
  while (last_red < xd.size() && reduced[last_red]) ++last_red;
  l.leading = !l.trailing && last_red > 0;
  for (size_t a = last_red; a < xd.size(); ++a) l.leading = l.leading && !reduced[a];
  return l;
}

int64_t slice_length(int64_t reduced, int64_t slices) {
  const int64_t len = (reduced + slices - 1) / std::max<int64_t>(slices, 1);
  return (len + 63) / 64 * 64;
}

int64_t split_slices(const reduction_layout& l, const split_options& o) {
  // Elements a one-pass thread folds, at most: a column workgroup's 256 threads share 32
  // outputs, a row workgroup has 64 threads or more.
  const int64_t per_thread = l.columns() ? l.reduced / 8 : l.reduced / 64;
  const bool must = o.must_split_above > 0 && per_thread > o.must_split_above;
  if ((!o.enabled && !must) || l.outputs <= 0 || l.reduced < std::max<int64_t>(o.min_reduced, 2)) return 0;
  // Workgroups of the one-pass kernel; one thread per output (redt) is never split.
  const int64_t groups = l.columns() ? (l.outputs + 31) / 32 : l.per_group() ? l.outputs : 0;
  if (groups == 0 || (groups >= o.max_groups && !must)) return 0;
  int64_t slices = (o.target_groups + groups - 1) / groups;
  if (must) slices = std::max(slices, (per_thread + o.must_split_above / 2 - 1) / (o.must_split_above / 2));
  // A column workgroup reads 32 outputs at each reduced index, a row workgroup one.
  const int64_t per_index = l.columns() ? 32 : 1;
  // A forced split may pass max_slices (pass 2 loops over the partials; pass 1's slices are a
  // dispatch dimension of up to 65535): a column sum of 640M elements in 1024 slices still left
  // 78,128 iterations per thread on lavapipe.
  slices = std::min({slices, l.reduced * per_index / std::max<int64_t>(o.min_slice, 1), must ? int64_t{65535} : o.max_slices});
  if (slices < 2) return 0;
  // Slices are whole multiples of 64 elements: count only the non-empty ones.
  const int64_t len = slice_length(l.reduced, slices);
  slices = (l.reduced + len - 1) / len;
  return slices >= 2 ? slices : 0;
}

namespace {

/// The [..., L] shape a kernel folds row by row: a one-pass float reduction over the last axis
/// only (of at least 2 elements) with a float result. Empty for any other kernel.
shape row_shape_of(const graph& g, const kernel& k) {
  if (k.kind != kernel_kind::reduce || k.pass != 0) return {};
  const node& r = g[k.anchor];
  const shape& xd = g[r.inputs[0]].dims;
  // Results pass between members as floats (shared memory, registers): integer ones would lose
  // bits past 2^24 or fail to compile, so an i32 reduction or epilogue is never a member.
  if (r.type == dtype::i32 || g[k.root].type == dtype::i32 || xd.empty() || xd.back() < 2 || r.attrs.axes.size() != 1)
    return {};
  int64_t axis = r.attrs.axes[0];
  if (axis < 0) axis += static_cast<int64_t>(xd.size());
  return axis == static_cast<int64_t>(xd.size()) - 1 ? xd : shape{};
}

/// Whether the inline expression below `id` reads one of `results`.
bool touches(const graph& g, const plan& p, node_index id, const std::set<node_index>& results) {
  std::vector<node_index> stack{id};
  std::set<node_index> seen;
  while (!stack.empty()) {
    const node_index x = stack.back();
    stack.pop_back();
    if (!seen.insert(x).second) continue;
    if (results.count(x)) return true;
    if (p.materialised[x] || is_splat(g[x])) continue;
    stack.insert(stack.end(), g[x].inputs.begin(), g[x].inputs.end());
  }
  return false;
}

/// Whether b broadcasts one value per row to `rows`: its input is `rows` with the last axis 1
/// (or that without leading 1s), so the input is evaluated at the row's own flat index.
bool is_row_broadcast(const graph& g, node_index b, const shape& rows) {
  const node& n = g[b];
  if (n.op != op_kind::broadcast || n.dims != rows) return false;
  const shape& d = g[n.inputs[0]].dims;
  if (d.empty() || d.size() > rows.size() || d.back() != 1) return false;
  const size_t off = rows.size() - d.size();
  for (size_t a = 0; a + 1 < d.size(); ++a)
    if (d[a] != rows[off + a]) return false;
  return element_count(d) * rows.back() == element_count(rows);  // no axis broadcast across rows
}

/// Whether the inline expression at `start` reads `results` (one value per row) only at its own
/// row. The expression is evaluated at an element (row, l) of `rows`, or with `row_space` at the
/// row itself (a reduction's epilogue, which stops at `stop`). Elementwise ops keep the index,
/// a row broadcast takes an element to its row, a reshape keeps a row's flat index; any other
/// re-indexing must not lead to a result. `own` is the kernel's root (computed, not read).
bool reads_own_row_only(const graph& g, const plan& p, node_index start, node_index own, node_index stop, const shape& rows,
                        const std::set<node_index>& results, bool row_space) {
  std::vector<std::pair<node_index, bool>> stack{{start, row_space}};
  std::set<std::pair<node_index, bool>> seen;
  while (!stack.empty()) {
    const auto [id, at_row] = stack.back();
    stack.pop_back();
    if (!seen.insert({id, at_row}).second || id == stop) continue;
    if (results.count(id)) {
      if (!at_row) return false;  // read at an element index, not its row
      continue;
    }
    if (id != own && (p.materialised[id] || is_splat(g[id]))) continue;
    const node& n = g[id];
    if (is_elementwise(n.op) || (at_row && n.op == op_kind::reshape)) {
      for (auto in : n.inputs) stack.push_back({in, at_row});
    } else if (!at_row && is_row_broadcast(g, id, rows)) {
      stack.push_back({n.inputs[0], true});
    } else {
      for (auto in : n.inputs)
        if (touches(g, p, in, results)) return false;  // re-indexed: the index may leave the row
    }
  }
  return true;
}

}  // namespace

void fuse_row_kernels(const graph& g, plan& p, int64_t min_length) {
  std::vector<kernel> out;
  for (size_t i = 0; i < p.kernels.size();) {
    const shape rows = row_shape_of(g, p.kernels[i]);
    if (rows.empty() || rows.back() < min_length) {
      out.push_back(p.kernels[i++]);
      continue;
    }
    kernel group;
    group.kind = kernel_kind::rows;
    group.members.push_back(p.kernels[i]);
    std::set<node_index> results{p.kernels[i].root};
    size_t j = i + 1;
    for (; j < p.kernels.size(); ++j) {
      const kernel& k = p.kernels[j];
      if (row_shape_of(g, k) == rows &&
          reads_own_row_only(g, p, g[k.anchor].inputs[0], -1, -1, rows, results, false) &&
          reads_own_row_only(g, p, k.root, k.root, k.anchor, rows, results, true)) {
        group.members.push_back(k);
        results.insert(k.root);
        continue;
      }
      if (k.kind == kernel_kind::elementwise && g[k.root].dims == rows &&
          reads_own_row_only(g, p, k.root, k.root, -1, rows, results, false)) {
        group.members.push_back(k);
        ++j;
      }
      break;
    }
    if (group.members.size() < 2) {
      out.push_back(p.kernels[i++]);
      continue;
    }
    group.root = group.members.back().root;
    out.push_back(std::move(group));
    i = j;
  }
  p.kernels = std::move(out);
}

plan lower(const graph& g, const split_options& split, int64_t fuse_rows_from) {
  const auto n = static_cast<size_t>(g.size());
  std::vector<std::vector<node_index>> users(n);
  for (node_index id = 0; id < g.size(); ++id)
    for (auto in : g[id].inputs) users[static_cast<size_t>(in)].push_back(id);

  plan p;
  p.materialised.assign(n, false);
  std::vector<bool> pinned(n, false);  // results the caller sees: never absorbed into a kernel
  for (node_index id = 0; id < g.size(); ++id)
    if (is_leaf_buffer(g[id]) || is_anchor(g[id].op)) p.materialised[id] = true;
  for (const auto& o : g.outputs) p.materialised[o.id] = pinned[o.id] = true;
  for (const auto& u : g.updates) p.materialised[u.value] = pinned[u.value] = true;

  // Cheap nodes only re-index buffers: recomputing them in several kernels costs nothing.
  std::vector<bool> cheap(n, false);
  for (node_index id = 0; id < g.size(); ++id) {
    const node& x = g[id];
    if (is_splat(x)) {
      cheap[id] = true;
    } else if (reindexes(x.op)) {
      bool ok = true;
      for (auto in : x.inputs) ok = ok && (p.materialised[in] || cheap[in]);
      cheap[id] = ok;
    }
  }

  // Small elementwise subexpressions are recomputed by every kernel that needs them instead of
  // being written and read back: on memory-bound hardware a pass over memory costs more than a
  // few ALU ops (softmax's exp(x - max) feeds both the sum and the division). cost = inline ops
  // in the expression (an upper bound: shared subexpressions count twice).
  std::vector<int> cost(n, 0);
  for (node_index id = 0; id < g.size(); ++id) {
    if (p.materialised[id] || is_splat(g[id])) continue;
    int c = 1;
    for (auto in : g[id].inputs) c += cost[in];
    cost[id] = std::min(c, 1 << 20);
  }
  constexpr int max_recompute_cost = 6;
  constexpr size_t max_recompute_kernels = 3;

  // Reverse pass: a node needed by several kernels (unless small enough to recompute), re-read
  // many times by a matmul or scatter_add, or read at several indices, gets its own buffer
  // unless it is cheap.
  std::vector<std::set<node_index>> roots(n);
  for (node_index id = g.size() - 1; id >= 0; --id) {
    if (p.materialised[id]) continue;
    bool heavy_user = false, reindexed = false;
    for (auto u : users[id]) {
      if (p.materialised[u]) roots[id].insert(u);
      else roots[id].insert(roots[u].begin(), roots[u].end());
      heavy_user = heavy_user || g[u].op == op_kind::matmul || g[u].op == op_kind::linear || g[u].op == op_kind::scatter_add;
      reindexed = reindexed || reindexes(g[u].op);
    }
    if (cheap[id]) continue;
    const bool recompute = (is_elementwise(g[id].op) || reindexes(g[id].op)) && cost[id] <= max_recompute_cost &&
                           roots[id].size() <= max_recompute_kernels;
    if ((roots[id].size() > 1 && !recompute) || heavy_user || (reindexed && users[id].size() > 1))
      p.materialised[id] = true;
  }

  // Epilogue absorption: matmul/reduce -> single-use elementwise chain -> materialised root.
  std::vector<node_index> claimed(n, -1);
  for (node_index id = 0; id < g.size(); ++id) {
    const op_kind op = g[id].op;
    if (op != op_kind::matmul && op != op_kind::linear && op != op_kind::reduce_sum && op != op_kind::reduce_max) continue;
    if (pinned[id]) continue;
    // Every path from the anchor must stay elementwise (same index) until one materialised
    // root; fan-out on the way is fine (the epilogue computes each node once per element).
    std::set<node_index> reached, seen;
    std::vector<node_index> stack(users[id].begin(), users[id].end());
    bool ok = !stack.empty();
    while (ok && !stack.empty()) {
      const node_index u = stack.back();
      stack.pop_back();
      if (!seen.insert(u).second) continue;
      if (!is_elementwise(g[u].op)) ok = false;
      else if (p.materialised[u]) reached.insert(u);
      else stack.insert(stack.end(), users[u].begin(), users[u].end());
    }
    if (!ok || reached.size() != 1) continue;
    const node_index root = *reached.begin();
    if (claimed[root] >= 0 || is_anchor(g[root].op)) continue;
    claimed[root] = id;
    p.materialised[id] = false;
  }

  for (node_index id = 0; id < g.size(); ++id) {
    const node& x = g[id];
    if (!p.materialised[id] || is_leaf_buffer(x)) continue;
    kernel k;
    k.root = id;
    k.anchor = claimed[id] >= 0 ? claimed[id] : id;
    switch (g[k.anchor].op) {
      case op_kind::matmul: k.kind = kernel_kind::matmul; break;
      case op_kind::reduce_sum:
      case op_kind::reduce_max: k.kind = kernel_kind::reduce; break;
      case op_kind::scatter_add: k.kind = kernel_kind::scatter_add; break;
      case op_kind::linear: k.kind = kernel_kind::linear; break;
      case op_kind::kv_write: k.kind = kernel_kind::kv_write; break;
      case op_kind::attention: k.kind = kernel_kind::attention; break;
      default: k.kind = kernel_kind::elementwise; k.anchor = -1; break;
    }
    if (k.kind == kernel_kind::reduce) add_reduction(g, k, split, p);
    else if (k.kind == kernel_kind::attention) add_attention(g, k, p);
    else p.kernels.push_back(k);
  }
  if (fuse_rows_from > 0) fuse_row_kernels(g, p, fuse_rows_from);
  return p;
}

std::string describe(const graph& g, const plan& p) {
  std::string s;
  for (const auto& k : p.kernels) {
    if (!s.empty()) s += ' ';
    if (k.kind == kernel_kind::rows) {
      plan inner;
      inner.kernels = k.members;
      s += "rows[" + describe(g, inner) + "]";
      continue;
    }
    switch (k.kind) {
      case kernel_kind::elementwise: s += "ew"; break;
      case kernel_kind::reduce: s += k.pass ? "red" + std::to_string(k.pass) : "red"; break;
      case kernel_kind::matmul: s += "mm"; break;
      case kernel_kind::scatter_add: s += "scat"; break;
      case kernel_kind::linear: s += k.pass ? "lin" + std::to_string(k.pass) : "lin"; break;
      case kernel_kind::kv_write: s += "kvw"; break;
      case kernel_kind::attention: s += "attn"; break;
      case kernel_kind::weight_decode: s += "dqw"; break;
      case kernel_kind::rows: break;
    }
    s += "(%" + std::to_string(k.root);
    if (k.anchor >= 0 && k.anchor != k.root) s += "<-%" + std::to_string(k.anchor);
    if (k.pass == 1) s += " x" + std::to_string(k.slices);
    if (k.weight >= 0) s += " w=s" + std::to_string(k.weight);
    s += ")";
  }
  return s;
}

}  // namespace mesh::gpu
