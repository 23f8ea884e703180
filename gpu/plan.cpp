#include "gpu/plan.hpp"

#include <algorithm>
#include <set>

namespace mesh::gpu {

bool is_splat(const node& n) { return n.op == op_kind::constant && n.attrs.values.size() == 1; }

namespace {

bool is_anchor(op_kind op) {
  return op == op_kind::matmul || op == op_kind::reduce_sum || op == op_kind::reduce_max ||
         op == op_kind::scatter_add;
}

bool is_leaf_buffer(const node& n) {
  return n.op == op_kind::input || n.op == op_kind::parameter || (n.op == op_kind::constant && !is_splat(n));
}

/// Consumers that read an operand at an index other than their own output index.
bool reindexes(op_kind op) {
  const auto f = family_of(op);
  return f == op_family::movement || f == op_family::gather;
}

}  // namespace

plan lower(const graph& g) {
  const auto n = static_cast<size_t>(g.size());
  std::vector<std::vector<node_id>> users(n);
  for (node_id id = 0; id < g.size(); ++id)
    for (auto in : g[id].inputs) users[static_cast<size_t>(in)].push_back(id);

  plan p;
  p.materialised.assign(n, false);
  std::vector<bool> pinned(n, false);  // results the caller sees: never absorbed into a kernel
  for (node_id id = 0; id < g.size(); ++id)
    if (is_leaf_buffer(g[id]) || is_anchor(g[id].op)) p.materialised[id] = true;
  for (const auto& o : g.outputs) p.materialised[o.id] = pinned[o.id] = true;
  for (const auto& u : g.updates) p.materialised[u.value] = pinned[u.value] = true;

  // Cheap nodes only re-index buffers: recomputing them in several kernels costs nothing.
  std::vector<bool> cheap(n, false);
  for (node_id id = 0; id < g.size(); ++id) {
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
  for (node_id id = 0; id < g.size(); ++id) {
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
  std::vector<std::set<node_id>> roots(n);
  for (node_id id = g.size() - 1; id >= 0; --id) {
    if (p.materialised[id]) continue;
    bool heavy_user = false, reindexed = false;
    for (auto u : users[id]) {
      if (p.materialised[u]) roots[id].insert(u);
      else roots[id].insert(roots[u].begin(), roots[u].end());
      heavy_user = heavy_user || g[u].op == op_kind::matmul || g[u].op == op_kind::scatter_add;
      reindexed = reindexed || reindexes(g[u].op);
    }
    if (cheap[id]) continue;
    const bool recompute = (is_elementwise(g[id].op) || reindexes(g[id].op)) && cost[id] <= max_recompute_cost &&
                           roots[id].size() <= max_recompute_kernels;
    if ((roots[id].size() > 1 && !recompute) || heavy_user || (reindexed && users[id].size() > 1))
      p.materialised[id] = true;
  }

  // Epilogue absorption: matmul/reduce -> single-use elementwise chain -> materialised root.
  std::vector<node_id> claimed(n, -1);
  for (node_id id = 0; id < g.size(); ++id) {
    const op_kind op = g[id].op;
    if (op != op_kind::matmul && op != op_kind::reduce_sum && op != op_kind::reduce_max) continue;
    if (pinned[id]) continue;
    // Every path from the anchor must stay elementwise (same index) until one materialised
    // root; fan-out on the way is fine (the epilogue computes each node once per element).
    std::set<node_id> reached, seen;
    std::vector<node_id> stack(users[id].begin(), users[id].end());
    bool ok = !stack.empty();
    while (ok && !stack.empty()) {
      const node_id u = stack.back();
      stack.pop_back();
      if (!seen.insert(u).second) continue;
      if (!is_elementwise(g[u].op)) ok = false;
      else if (p.materialised[u]) reached.insert(u);
      else stack.insert(stack.end(), users[u].begin(), users[u].end());
    }
    if (!ok || reached.size() != 1) continue;
    const node_id root = *reached.begin();
    if (claimed[root] >= 0 || is_anchor(g[root].op)) continue;
    claimed[root] = id;
    p.materialised[id] = false;
  }

  for (node_id id = 0; id < g.size(); ++id) {
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
      default: k.kind = kernel_kind::elementwise; k.anchor = -1; break;
    }
    p.kernels.push_back(k);
  }
  return p;
}

std::string describe(const graph&, const plan& p) {
  std::string s;
  for (const auto& k : p.kernels) {
    if (!s.empty()) s += ' ';
    switch (k.kind) {
      case kernel_kind::elementwise: s += "ew"; break;
      case kernel_kind::reduce: s += "red"; break;
      case kernel_kind::matmul: s += "mm"; break;
      case kernel_kind::scatter_add: s += "scat"; break;
    }
    s += "(%" + std::to_string(k.root);
    if (k.anchor >= 0 && k.anchor != k.root) s += "<-%" + std::to_string(k.anchor);
    s += ")";
  }
  return s;
}

}  // namespace mesh::gpu
