#include "graph/simplify.hpp"

#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "graph/evaluate.hpp"

namespace mesh {
namespace {

/// Results larger than this are not folded unless they are splats (one repeated value).
constexpr int64_t fold_limit = 4096;

bool is_splat(const node& n) { return n.op == op_kind::constant && n.attrs.values.size() == 1; }
bool is_splat_of(const node& n, double v) { return is_splat(n) && n.attrs.values[0] == v; }

/// Rewrites one graph into another, node by node, through `remap` (old id -> new id).
class rewriter {
 public:
  explicit rewriter(simplify_stats& st) : st_(st) {}

  graph run(const graph& g) {
    remap_.assign(g.nodes.size(), -1);
    for (node_index id = 0; id < g.size(); ++id) {
      node n = g[id];
      for (auto& i : n.inputs) i = remap_[static_cast<size_t>(i)];
      remap_[static_cast<size_t>(id)] = place(std::move(n));
    }
    for (auto o : g.outputs) out_.outputs.push_back({o.name, remap_[static_cast<size_t>(o.id)]});
    for (auto u : g.updates) out_.updates.push_back({remap_[static_cast<size_t>(u.target)], remap_[static_cast<size_t>(u.value)]});
    return std::move(out_);
  }

 private:
  const node& at(node_index id) const { return out_.nodes[static_cast<size_t>(id)]; }

  /// Adds n (or an equivalent existing node) to the new graph and returns its id.
  node_index place(node n) {
    if (auto same = identity_of(n); same >= 0) {
      ++st_.rewritten;
      return same;
    }
    if (auto folded = fold(n)) {
      ++st_.folded;
      n = std::move(*folded);
    }
    if (n.op != op_kind::input && n.op != op_kind::parameter) {
      auto key = std::make_tuple(n.op, n.type, n.dims, n.inputs, n.attrs.axes, n.attrs.starts, n.attrs.stops,
                                 n.attrs.axis, n.attrs.cmp, n.attrs.keep_dims, n.attrs.values);
      auto [it, fresh] = seen_.emplace(std::move(key), out_.size());
      if (!fresh) {
        ++st_.merged;
        return it->second;
      }
    }
    out_.nodes.push_back(std::move(n));
    return out_.size() - 1;
  }

  /// If n computes the same value as one of its inputs, that input's id; else -1.
  node_index identity_of(node& n) {
    if (n.inputs.empty()) return -1;
    const node_index a = n.inputs[0];
    const node& x = at(a);
    const bool same_as_x = x.type == n.type && x.dims == n.dims;
    switch (n.op) {
      case op_kind::add:
        if (is_splat_of(at(n.inputs[1]), 0.0)) return a;
        if (is_splat_of(x, 0.0)) return n.inputs[1];
        return -1;
      case op_kind::sub: return is_splat_of(at(n.inputs[1]), 0.0) ? a : -1;
      case op_kind::mul:
        if (is_splat_of(at(n.inputs[1]), 1.0)) return a;
        if (is_splat_of(x, 1.0)) return n.inputs[1];
        return -1;
      case op_kind::div: return is_splat_of(at(n.inputs[1]), 1.0) ? a : -1;
      case op_kind::neg: return x.op == op_kind::neg ? x.inputs[0] : -1;
      case op_kind::cast:
      case op_kind::broadcast:
      case op_kind::reshape:
      case op_kind::slice: {
        if (same_as_x) return a;
        if (n.op == op_kind::reshape && x.op == op_kind::reshape) {  // reshape(reshape(y)) = reshape(y)
          n.inputs[0] = x.inputs[0];
          if (at(x.inputs[0]).dims == n.dims) return x.inputs[0];
        }
        return -1;
      }
      case op_kind::permute: {
        std::vector<int64_t> id(n.attrs.axes.size());
        std::iota(id.begin(), id.end(), 0);
        return n.attrs.axes == id ? a : -1;
      }
      case op_kind::reduce_sum:
      case op_kind::reduce_max: return n.attrs.axes.empty() && !n.attrs.keep_dims ? a : -1;
      default: return -1;
    }
  }

  /// A constant equal to n, when n can be computed now.
  std::optional<node> fold(const node& n) {
    const auto fam = family_of(n.op);
    if (fam == op_family::leaf) return std::nullopt;
    // x * 0 = 0 (for finite x; training graphs do not rely on NaN propagation through zeros).
    if (n.op == op_kind::mul && is_float(n.type) &&
        (is_splat_of(at(n.inputs[0]), 0.0) || is_splat_of(at(n.inputs[1]), 0.0)))
      return splat(n, 0.0);
    bool all_const = true, all_splat = true;
    for (auto i : n.inputs) {
      all_const = all_const && at(i).op == op_kind::constant;
      all_splat = all_splat && is_splat(at(i));
    }
    if (!all_const) return std::nullopt;
    const bool splat_preserving = is_elementwise(n.op) || n.op == op_kind::broadcast || n.op == op_kind::reshape ||
                                  n.op == op_kind::permute || n.op == op_kind::slice;
    if (all_splat && splat_preserving) {
      // Compute one element on scalars and splat it.
      graph tiny;
      node m = n;
      m.dims = {};
      m.inputs.clear();
      if (n.op == op_kind::broadcast || n.op == op_kind::reshape || n.op == op_kind::permute || n.op == op_kind::slice)
        return splat(n, at(n.inputs[0]).attrs.values[0]);
      for (auto i : n.inputs) {
        node c = at(i);
        c.dims = {};
        m.inputs.push_back(tiny.size());
        tiny.nodes.push_back(std::move(c));
      }
      tiny.nodes.push_back(std::move(m));
      tensor_map none;
      auto vals = evaluate_nodes(tiny, {}, none);
      if (!vals) return std::nullopt;
      return splat(n, vals->back().at(0));
    }
    if (element_count(n.dims) > fold_limit) return std::nullopt;
    graph tiny;
    node m = n;
    m.inputs.clear();
    for (auto i : n.inputs) {
      m.inputs.push_back(tiny.size());
      tiny.nodes.push_back(at(i));
    }
    tiny.nodes.push_back(std::move(m));
    tensor_map none;
    auto vals = evaluate_nodes(tiny, {}, none);
    if (!vals) return std::nullopt;
    node c;
    c.op = op_kind::constant;
    c.type = n.type;
    c.dims = n.dims;
    c.attrs.values = vals->back().to_doubles();
    return c;
  }

  static node splat(const node& n, double v) {
    node c;
    c.op = op_kind::constant;
    c.type = n.type;
    c.dims = n.dims;
    c.attrs.values = {round_to(n.type, v)};
    return c;
  }

  simplify_stats& st_;
  graph out_;
  std::vector<node_index> remap_;
  std::map<std::tuple<op_kind, dtype, shape, std::vector<node_index>, std::vector<int64_t>, std::vector<int64_t>,
                      std::vector<int64_t>, int64_t, compare_kind, bool, std::vector<double>>,
           node_index>
      seen_;
};

/// Drops nodes that no output or update needs (keeping all inputs and parameters).
graph remove_dead(const graph& g, simplify_stats& st) {
  std::vector<bool> live(g.nodes.size(), false);
  for (auto o : g.outputs) live[static_cast<size_t>(o.id)] = true;
  for (auto u : g.updates) live[static_cast<size_t>(u.target)] = live[static_cast<size_t>(u.value)] = true;
  for (node_index id = g.size() - 1; id >= 0; --id) {
    const node& n = g[id];
    if (n.op == op_kind::input || n.op == op_kind::parameter) live[static_cast<size_t>(id)] = true;
    if (!live[static_cast<size_t>(id)]) continue;
    for (auto i : n.inputs) live[static_cast<size_t>(i)] = true;
  }
  graph out;
  std::vector<node_index> remap(g.nodes.size(), -1);
  for (node_index id = 0; id < g.size(); ++id) {
    if (!live[static_cast<size_t>(id)]) {
      ++st.removed;
      continue;
    }
    node n = g[id];
    for (auto& i : n.inputs) i = remap[static_cast<size_t>(i)];
    remap[static_cast<size_t>(id)] = out.size();
    out.nodes.push_back(std::move(n));
  }
  for (auto o : g.outputs) out.outputs.push_back({o.name, remap[static_cast<size_t>(o.id)]});
  for (auto u : g.updates) out.updates.push_back({remap[static_cast<size_t>(u.target)], remap[static_cast<size_t>(u.value)]});
  return out;
}

}  // namespace

graph simplify(const graph& g, simplify_stats* stats) {
  simplify_stats local;
  simplify_stats& st = stats ? *stats : local;
  graph cur = g;
  // A rewrite can expose another (a folded constant enables an identity): iterate to a fixpoint.
  for (int round = 0; round < 4; ++round) {
    const auto before = cur.nodes.size();
    const simplify_stats prev = st;
    cur = remove_dead(rewriter(st).run(cur), st);
    if (cur.nodes.size() == before && st.folded == prev.folded && st.rewritten == prev.rewritten) break;
  }
  return cur;
}

}  // namespace mesh
