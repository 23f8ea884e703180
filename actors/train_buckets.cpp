#include "actors/train_buckets.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include "graph/ops.hpp"

namespace mesh {

std::vector<size_t> order_into_buckets(const graph& grad, std::vector<std::string>& grads, std::vector<int64_t>& sizes,
                                       std::vector<shape>& dims, uint64_t bucket_bytes, int max_buckets) {
  std::vector<size_t> order(grads.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Nodes are in topological order, and reverse mode computes the last layers' gradients first.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return grad.find_output(grads[a]) < grad.find_output(grads[b]); });
  std::vector<std::string> g2;
  std::vector<int64_t> s2;
  std::vector<shape> d2;
  for (size_t i : order) {
    g2.push_back(grads[i]);
    s2.push_back(sizes[i]);
    d2.push_back(dims[i]);
  }
  grads = std::move(g2);
  sizes = std::move(s2);
  dims = std::move(d2);
  std::vector<size_t> ends;
  uint64_t bytes = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    bytes += static_cast<uint64_t>(sizes[i]) * 4;
    if (bucket_bytes > 0 && bytes >= bucket_bytes && static_cast<int>(ends.size()) + 1 < max_buckets) {
      ends.push_back(i + 1);
      bytes = 0;
    }
  }
  if (ends.empty() || ends.back() != grads.size()) ends.push_back(grads.size());
  return ends;
}

namespace {

/// Ops whose value a later segment makes again from their input rather than read from a saved
/// copy: views, which a whole program need not write out at all, and a broadcast's input is
/// smaller than it. Saving them would write each out in full and copy it every step.
bool made_again(op_kind op) { return op == op_kind::reshape || op == op_kind::permute || op == op_kind::broadcast; }

}  // namespace

expected<segmented_program> segment_by_updates(const graph& g, const std::vector<std::vector<std::string>>& groups,
                                               const std::string& prefix) {
  const size_t n = g.nodes.size(), segs = groups.size();
  // Which segment makes each update.
  std::vector<std::vector<size_t>> updates_of(segs);
  for (size_t k = 0; k < segs; ++k)
    for (const auto& name : groups[k]) {
      auto it = std::find_if(g.updates.begin(), g.updates.end(), [&](const update& u) { return g[u.target].attrs.name == name; });
      if (it == g.updates.end()) return make_error(error_code::invalid_argument, "segment_by_updates: the program does not update \"" + name + "\"");
      updates_of[k].push_back(static_cast<size_t>(it - g.updates.begin()));
    }
  // Each computed node goes to the first segment that needs it.
  std::vector<int> seg(n, -1);
  for (size_t k = 0; k < segs; ++k) {
    std::vector<node_index> stack;
    for (size_t u : updates_of[k]) stack.push_back(g.updates[u].value);
    if (k == 0)
      for (const auto& o : g.outputs) stack.push_back(o.id);
    while (!stack.empty()) {
      const node_index id = stack.back();
      stack.pop_back();
      if (seg[static_cast<size_t>(id)] >= 0 || family_of(g[id].op) == op_family::leaf) continue;
      seg[static_cast<size_t>(id)] = static_cast<int>(k);
      for (auto in : g[id].inputs) stack.push_back(in);
    }
  }
  const auto saved_name = [&](node_index id) { return prefix + "x." + std::to_string(id); };
  // Values read by a later segment than the one computing them: saved, but for the views made
  // again there, whose computed inputs are then read instead (an input's segment is at most its
  // user's, so those are earlier too).
  std::vector<bool> crosses(n, false);
  const std::function<void(size_t)> read_later = [&](size_t id) {
    if (!made_again(g.nodes[id].op)) {
      crosses[id] = true;
      return;
    }
    for (auto in : g.nodes[id].inputs)
      if (seg[static_cast<size_t>(in)] >= 0) read_later(static_cast<size_t>(in));
  };
  for (size_t id = 0; id < n; ++id) {
    if (seg[id] < 0) continue;
    for (auto in : g.nodes[id].inputs)
      if (seg[static_cast<size_t>(in)] >= 0 && seg[static_cast<size_t>(in)] < seg[id]) read_later(static_cast<size_t>(in));
  }
  for (size_t k = 0; k < segs; ++k)
    for (size_t u : updates_of[k]) {
      const auto v = static_cast<size_t>(g.updates[u].value);
      if (seg[v] >= 0 && seg[v] < static_cast<int>(k)) read_later(v);
    }

  segmented_program out;
  for (size_t id = 0; id < n; ++id)
    if (crosses[id]) out.saved[saved_name(static_cast<node_index>(id))] = tensor::zeros(g.nodes[id].type, g.nodes[id].dims);
  for (size_t k = 0; k < segs; ++k) {
    graph f;
    std::map<node_index, node_index> local;
    const auto leaf = [&](node n) {
      f.nodes.push_back(std::move(n));
      return f.size() - 1;
    };
    std::function<node_index(node_index)> bring = [&](node_index id) -> node_index {
      if (auto it = local.find(id); it != local.end()) return it->second;
      const node& src = g[id];
      if (family_of(src.op) == op_family::leaf) return local[id] = leaf(src);
      if (made_again(src.op)) {  // a view of an earlier segment's value (or a leaf): made here again
        node copy = src;
        for (auto& in : copy.inputs) in = bring(in);
        return local[id] = leaf(std::move(copy));
      }
      node p;  // computed by an earlier segment: read back where it saved it
      p.op = op_kind::parameter;
      p.type = src.type;
      p.dims = src.dims;
      p.attrs.name = saved_name(id);
      return local[id] = leaf(std::move(p));
    };
    for (size_t id = 0; id < n; ++id) {
      if (seg[id] != static_cast<int>(k)) continue;
      node copy = g.nodes[id];
      for (auto& in : copy.inputs) in = bring(in);
      f.nodes.push_back(std::move(copy));
      local[static_cast<node_index>(id)] = f.size() - 1;
    }
    if (k == 0)
      for (const auto& o : g.outputs) f.outputs.push_back({o.name, bring(o.id)});
    for (size_t u : updates_of[k]) f.updates.push_back({bring(g.updates[u].target), bring(g.updates[u].value)});
    // What later segments read of this one's values.
    for (size_t id = 0; id < n; ++id) {
      if (seg[id] != static_cast<int>(k) || !crosses[id]) continue;
      node p;
      p.op = op_kind::parameter;
      p.type = g.nodes[id].type;
      p.dims = g.nodes[id].dims;
      p.attrs.name = saved_name(static_cast<node_index>(id));
      const node_index target = leaf(std::move(p));
      f.updates.push_back({target, local.at(static_cast<node_index>(id))});
    }
    std::vector<std::string> reads;
    for (const auto& nd : f.nodes)
      if (nd.op == op_kind::input) reads.push_back(nd.attrs.name);
    out.inputs.push_back(std::move(reads));
    out.segments.push_back(std::move(f));
  }
  return out;
}

}  // namespace mesh
