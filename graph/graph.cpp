#include "graph/graph.hpp"

#include <sstream>

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
  // A stream rather than string concatenation: g++ 12 at -O2 misreports `"%" + std::to_string(i)`
  // chains with -Wrestrict (GCC bug 105329).
  std::ostringstream out;
  for (node_id i = 0; i < g.size(); ++i) {
    const auto& n = g[i];
    out << '%' << i << " = " << to_string(n.op) << '(';
    for (size_t k = 0; k < n.inputs.size(); ++k) out << (k ? ", %" : "%") << n.inputs[k];
    out << ')';
    if (!n.attrs.name.empty()) out << " \"" << n.attrs.name << '"';
    out << " : " << to_string(n.type) << to_string(n.dims) << '\n';
  }
  for (const auto& o : g.outputs) out << "output " << o.name << " = %" << o.id << '\n';
  for (const auto& u : g.updates) out << "update %" << u.target << " <- %" << u.value << '\n';
  return out.str();
}

}  // namespace mesh
