#include "graph/cost.hpp"

#include <algorithm>
#include <cmath>

#include "graph/quant.hpp"

namespace mesh {

double usable_rate(double r) { return std::isfinite(r) && r > 1e-9 ? r : 1e-9; }

int64_t result_bytes(const node& n) {
  const int64_t b = byte_size(n.type, n.dims);  // a quantized weight counts at its block size
  return b >= 0 ? b : element_count(n.dims) * 4;
}

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
    // gather copies its result's elements; scatter_add zeroes its result and adds every update
    // into it, so its work follows the updates (which may far outnumber the result's elements).
    case op_family::gather:
      if (n.op == op_kind::scatter_add) return out + static_cast<double>(element_count(g[n.inputs[1]].dims));
      return out;
    case op_family::linear: return 2.0 * out * static_cast<double>(g[n.inputs[0]].dims.back());
    case op_family::kv_write: return 0;
    case op_family::attention: {
      // q . k and p v for every query row, head and key: 4 FLOPs per element of q and key.
      const shape& k = g[n.inputs[1]].dims;
      return 4.0 * out * static_cast<double>(k[k.size() - 3]);
    }
  }
  return out;
}

double node_bytes(const graph& g, node_index id) {
  const node& n = g[id];
  if (family_of(n.op) == op_family::leaf) return 0;
  // kv_write reads the value and writes it into the cache; the rest of the cache is untouched.
  if (n.op == op_kind::kv_write) return 2.0 * static_cast<double>(result_bytes(g[n.inputs[1]]));
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
