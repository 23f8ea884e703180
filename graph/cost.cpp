#include "graph/cost.hpp"

#include <algorithm>
#include <cmath>

namespace mesh {

double usable_rate(double r) { return std::isfinite(r) && r > 1e-9 ? r : 1e-9; }

int64_t result_bytes(const node& n) { return element_count(n.dims) * static_cast<int64_t>(size_of(n.type)); }

double node_flops(const graph& g, node_index id) {
  const node& n = g[id];
  const double out = static_cast<double>(element_count(n.dims));
  switch (family_of(n.op)) {
    case op_family::leaf:
    case op_family::movement: return 0;
    case op_family::unary:
      switch (n.op) {
        case op_kind::exp:
        case op_kind::log:
        case op_kind::tanh:
        case op_kind::sin:
        case op_kind::cos:
        case op_kind::sigmoid: return 8 * out;  // transcendental functions cost several FLOPs
        default: return out;
      }
    case op_family::binary:
    case op_family::ternary: return out;
    case op_family::matmul: {
      const shape& a = g[n.inputs[0]].dims;
      return 2.0 * out * static_cast<double>(a.back());
    }
    case op_family::reduce: return static_cast<double>(element_count(g[n.inputs[0]].dims));
    case op_family::gather: return out;
  }
  return out;
}

double node_bytes(const graph& g, node_index id) {
  const node& n = g[id];
  if (family_of(n.op) == op_family::leaf) return 0;
  double b = static_cast<double>(result_bytes(n));
  for (auto i : n.inputs) b += static_cast<double>(result_bytes(g[i]));
  return b;
}

double node_seconds(const graph& g, node_index id, const device_profile& dev) {
  const double compute = node_flops(g, id) / (usable_rate(dev.gflops) * 1e9);
  const double memory = node_bytes(g, id) / (usable_rate(dev.mem_gbps) * 1e9);
  return std::max(compute, memory);
}

}  // namespace mesh
