#include "graph/validate.hpp"

#include <limits>
#include <set>
#include <string>

#include "graph/cost.hpp"
#include "graph/infer.hpp"
#include "graph/quant.hpp"

namespace mesh {
namespace {

std::string fmt_gflop(double flops) {
  std::string s = std::to_string(flops / 1e9);
  s.erase(s.find_last_not_of('0') + 1);  // "10000.000000" -> "10000."
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

tl::unexpected<error> at_node(node_index id, const node& n, error e) {
  e.message = "node %" + std::to_string(id) + " (" + std::string(to_string(n.op)) + "): " + e.message;
  return tl::unexpected(std::move(e));
}

/// kv_write writes its cache in place, so the cache is a parameter that nothing else reads (no
/// other node, no output: they would see the cache half-written) and that the graph updates with
/// the kv_write's result (the in-place write is then exactly the update).
expected<void> check_kv_writes(const graph& g) {
  std::vector<int> readers(g.nodes.size(), 0);
  for (const auto& n : g.nodes)
    for (auto i : n.inputs) ++readers[static_cast<size_t>(i)];
  for (const auto& o : g.outputs) ++readers[static_cast<size_t>(o.id)];
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    if (n.op != op_kind::kv_write) continue;
    const node_index cache = n.inputs[0];
    if (g[cache].op != op_kind::parameter)
      return at_node(id, n, {error_code::invalid_graph, "the cache (%" + std::to_string(cache) + ") must be a parameter"});
    if (readers[static_cast<size_t>(cache)] != 1)
      return at_node(id, n, {error_code::invalid_graph, "the cache parameter \"" + g[cache].attrs.name +
                                                           "\" is read by another node or returned: kv_write writes it in place"});
    bool updated = false;
    for (const auto& u : g.updates) updated = updated || (u.target == cache && u.value == id);
    if (!updated)
      return at_node(id, n, {error_code::invalid_graph, "the graph must update parameter \"" + g[cache].attrs.name +
                                                           "\" with this kv_write (it is written in place)"});
  }
  return {};
}

}  // namespace

expected<void> validate(const graph& g, const graph_limits& limits) {
  if (static_cast<int64_t>(g.nodes.size()) > limits.max_nodes)
    return make_error(error_code::limit_exceeded, "graph has " + std::to_string(g.nodes.size()) +
                                                      " nodes, the limit is " + std::to_string(limits.max_nodes));
  int64_t total_bytes = 0, constant_values = 0;
  double total_flops = 0;
  std::set<std::string> leaf_names;
  std::vector<value_type> types;
  types.reserve(g.nodes.size());
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    if (static_cast<int>(n.op) >= op_count)
      return make_error(error_code::invalid_graph, "node %" + std::to_string(id) + ": unknown op " +
                                                       std::to_string(static_cast<int>(n.op)));
    if (static_cast<int64_t>(n.inputs.size()) > limits.max_inputs_per_node)
      return at_node(id, n, {error_code::limit_exceeded, "too many inputs"});
    if (n.dims.size() > static_cast<size_t>(max_rank))
      return at_node(id, n, {error_code::limit_exceeded, "rank " + std::to_string(n.dims.size()) + " exceeds " + std::to_string(max_rank)});
    const int64_t count = bounded_element_count(n.dims, limits.max_elements);
    if (count < 0)
      return at_node(id, n, {error_code::limit_exceeded, "shape " + to_string(n.dims) + " is negative or exceeds " +
                                                             std::to_string(limits.max_elements) + " elements"});
    // A quantized shape that does not hold whole blocks is infer()'s error; count it as f32 here.
    // A kv_write's result is its cache parameter's memory (written in place, check_kv_writes),
    // which the parameter already counts.
    const int64_t bytes = n.op == op_kind::kv_write ? 0 : byte_size(n.type, n.dims);
    total_bytes += bytes >= 0 ? bytes : count * 4;
    if (total_bytes > limits.max_total_bytes)
      return at_node(id, n, {error_code::limit_exceeded, "graph needs more than " + std::to_string(limits.max_total_bytes) + " bytes"});
    std::vector<value_type> in;
    for (auto i : n.inputs) {
      if (i < 0 || i >= id)
        return at_node(id, n, {error_code::invalid_graph, "input %" + std::to_string(i) +
                                                              " does not precede its user (forward reference or cycle)"});
      in.push_back(types[static_cast<size_t>(i)]);
    }
    if (n.op == op_kind::constant) {
      constant_values += static_cast<int64_t>(n.attrs.values.size());
      if (constant_values > limits.max_constant_values)
        return at_node(id, n, {error_code::limit_exceeded, "constants carry more than " + std::to_string(limits.max_constant_values) + " values"});
    }
    if ((n.op == op_kind::input || n.op == op_kind::parameter) && !leaf_names.insert(n.attrs.name).second)
      return at_node(id, n, {error_code::invalid_graph, "name \"" + n.attrs.name + "\" is used twice"});
    auto t = infer(n, in);
    if (!t) return at_node(id, n, t.error());
    if (t->type != n.type || t->dims != n.dims)
      return at_node(id, n, {error_code::shape_mismatch, "declared " + std::string(to_string(n.type)) + to_string(n.dims) +
                                                             " but inputs give " + to_string(t->type) + to_string(t->dims)});
    types.push_back(*t);
    total_flops += node_flops(g, id);  // the node's and its inputs' shapes are checked by now
    if (!(total_flops <= limits.max_flops))
      return at_node(id, n, {error_code::limit_exceeded, "graph needs more than " + fmt_gflop(limits.max_flops) +
                                                             " GFLOP, the compute budget of one job"});
  }
  std::set<std::string> output_names;
  for (const auto& o : g.outputs) {
    if (o.id < 0 || o.id >= g.size())
      return make_error(error_code::invalid_graph, "output \"" + o.name + "\" refers to missing node %" + std::to_string(o.id));
    if (o.name.empty() || !output_names.insert(o.name).second)
      return make_error(error_code::invalid_graph, "output name \"" + o.name + "\" is empty or used twice");
    if (is_quantized(g[o.id].type))
      return at_node(o.id, g[o.id], {error_code::dtype_mismatch, "output \"" + o.name + "\" is " + to_string(g[o.id].type) +
                                                                     ": quantized tensors are read only by linear, never returned"});
  }
  std::set<node_index> updated;
  for (const auto& u : g.updates) {
    if (u.target < 0 || u.target >= g.size() || u.value < 0 || u.value >= g.size())
      return make_error(error_code::invalid_graph, "update refers to a missing node");
    const node &t = g[u.target], &v = g[u.value];
    if (t.op != op_kind::parameter)
      return make_error(error_code::invalid_graph, "update target %" + std::to_string(u.target) + " is not a parameter");
    if (t.type != v.type || t.dims != v.dims)
      return make_error(error_code::shape_mismatch, "update of \"" + t.attrs.name + "\": value is " + to_string(v.type) +
                                                        to_string(v.dims) + ", parameter is " + to_string(t.type) + to_string(t.dims));
    if (!updated.insert(u.target).second)
      return make_error(error_code::invalid_graph, "parameter \"" + t.attrs.name + "\" is updated twice");
    if (is_quantized(t.type))
      return make_error(error_code::dtype_mismatch, "update of \"" + t.attrs.name + "\": quantized parameters are frozen");
  }
  return check_kv_writes(g);
}

}  // namespace mesh
