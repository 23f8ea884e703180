#include "graph/graph.hpp"

namespace mesh {

node_id graph::find_leaf(const std::string& name) const {
  for (node_id i = 0; i < size(); ++i) {
    const auto& n = nodes[static_cast<size_t>(i)];
    if ((n.op == op_kind::input || n.op == op_kind::parameter) && n.attrs.name == name) return i;
  }
  return -1;
}

node_id graph::find_output(const std::string& name) const {
  for (const auto& o : outputs)
    if (o.name == name) return o.id;
  return -1;
}

std::string to_string(const graph& g) {
  std::string out;
  for (node_id i = 0; i < g.size(); ++i) {
    const auto& n = g[i];
    out += "%" + std::to_string(i) + " = " + std::string(to_string(n.op)) + "(";
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (k) out += ", ";
      out += "%" + std::to_string(n.inputs[k]);
    }
    out += ")";
    if (!n.attrs.name.empty()) out += " \"" + n.attrs.name + "\"";
    out += " : " + std::string(to_string(n.type)) + to_string(n.dims) + "\n";
  }
  for (const auto& o : g.outputs) out += "output " + o.name + " = %" + std::to_string(o.id) + "\n";
  for (const auto& u : g.updates)
    out += "update %" + std::to_string(u.target) + " <- %" + std::to_string(u.value) + "\n";
  return out;
}

}  // namespace mesh
