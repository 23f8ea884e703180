#include "graph/graph.hpp"

#include <sstream>

namespace mesh {

node_index graph::find_leaf(const std::string& name) const {
  for (node_index i = 0; i < size(); ++i) {
    const auto& n = nodes[static_cast<size_t>(i)];
    if ((n.op == op_kind::input || n.op == op_kind::parameter) && n.attrs.name == name) return i;
  }
  return -1;
}

node_index graph::find_output(const std::string& name) const {
  for (const auto& o : outputs)
    if (o.name == name) return o.id;
  return -1;
}

std::string to_string(const graph& g) {
  // A stream rather than string concatenation: g++ 12 at -O2 misreports `"%" + std::to_string(i)`
  // chains with -Wrestrict (GCC bug 105329).
  std::ostringstream out;
  for (node_index i = 0; i < g.size(); ++i) {
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

movement_index::movement_index(const node& n, const shape& in_dims) {
  const auto os = strides_of(n.dims);
  const auto xs = strides_of(in_dims);
  switch (n.op) {
    case op_kind::broadcast: {  // numpy alignment: size-1 input axes read index 0
      const size_t off = n.dims.size() - in_dims.size();
      for (size_t a = 0; a < in_dims.size(); ++a)
        if (in_dims[a] != 1) axes_.push_back({os[off + a], n.dims[off + a], xs[a], 0});
      break;
    }
    case op_kind::permute:
      for (size_t a = 0; a < n.dims.size(); ++a)
        axes_.push_back({os[a], n.dims[a], xs[static_cast<size_t>(n.attrs.axes[a])], 0});
      break;
    case op_kind::slice:
      for (size_t a = 0; a < n.dims.size(); ++a) axes_.push_back({os[a], n.dims[a], xs[a], n.attrs.starts[a]});
      break;
    default: break;
  }
}

int64_t movement_index::operator()(int64_t k) const {
  int64_t in = 0;
  for (const auto& a : axes_) in += ((k / a.out_stride) % a.out_size + a.offset) * a.in_stride;
  return in;
}

}  // namespace mesh
