#include "graph/autodiff.hpp"

#include <algorithm>
#include <map>

namespace mesh {
namespace {

/// Gradient of a broadcast: sum over the axes that were added or expanded, back to `to`'s shape.
/// `to` and `from` are copies: expr::dims() refers into the builder's node list, which the sum
/// below may reallocate.
expr unbroadcast(const expr& g, shape to, source_loc loc) {
  const shape from = g.dims();
  const size_t off = from.size() - to.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < from.size(); ++i)
    if (i < off || (to[i - off] == 1 && from[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  expr r = axes.empty() ? g : sum(g, axes, true, loc);
  return reshape(r, to, loc);
}

/// The vector-Jacobian product of node `n` (output `y`, adjoint `g`) for its input `k`.
expr vjp(builder& b, const node& n, node_index y_id, int k, const expr& g, source_loc loc) {
  const auto in = [&](int i) { return b.at(n.inputs[static_cast<size_t>(i)]); };
  const expr y = b.at(y_id);
  const expr x = in(0);
  const auto gt0 = [&](const expr& v) { return compare(v, 0.0, compare_kind::gt); };
  switch (n.op) {
    case op_kind::neg: return neg(g, loc);
    case op_kind::abs: return select(gt0(x), g, select(compare(x, 0.0, compare_kind::lt), neg(g, loc), 0.0));
    case op_kind::exp: return g * y;
    case op_kind::log: return g / x;
    case op_kind::sqrt: return g * 0.5 / y;
    case op_kind::rsqrt: return g * -0.5 * y / x;
    case op_kind::tanh: return g * (1.0 - y * y);
    case op_kind::sin: return g * cos(x, loc);
    case op_kind::cos: return neg(g * sin(x, loc), loc);
    case op_kind::relu: return select(gt0(x), g, 0.0);
    case op_kind::sigmoid: return g * y * (1.0 - y);
    case op_kind::cast: return cast(g, x.type(), loc);
    case op_kind::add: return g;
    case op_kind::sub: return k == 0 ? g : neg(g, loc);
    case op_kind::mul: return g * in(1 - k);
    case op_kind::div: return k == 0 ? g / in(1) : neg(g * y / in(1), loc);
    case op_kind::pow:
      return k == 0 ? g * in(1) * pow(in(0), in(1) - 1.0) : g * y * log(in(0), loc);
    case op_kind::max:
    case op_kind::min: {
      // Ties send the gradient to the first operand, so the sum over operands stays g.
      const auto first_wins = compare(in(0), in(1), n.op == op_kind::max ? compare_kind::ge : compare_kind::le);
      return k == 0 ? select(first_wins, g, 0.0) : select(first_wins, 0.0, g);
    }
    case op_kind::select: return k == 1 ? select(in(0), g, 0.0) : select(in(0), 0.0, g);
    case op_kind::matmul: return k == 0 ? matmul(g, transpose(in(1), loc), loc) : matmul(transpose(in(0), loc), g, loc);
    case op_kind::linear: {
      const expr w = in(1);
      if (k == 0) {
        // dy [..., n] @ w [n, k]: a linear with w^T as its weight; a quantized w is dequantized
        // (cast) first, since only linear reads blocks and it contracts their other axis.
        const expr wf = is_quantized(w.type()) ? cast(w, g.type(), loc) : w;
        return linear(g, transpose(wf, loc), loc);
      }
      // dy^T x summed over the batch dims: [n, rows] x [rows, k], in w's dtype.
      const int64_t n_out = w.dims()[0], kd = w.dims()[1];
      const expr g2 = reshape(g, {-1, n_out}, loc), x2 = reshape(x, {-1, kd}, loc);
      const expr dw = matmul(transpose(g2, loc), x2, loc);
      return dw.type() == w.type() ? dw : cast(dw, w.type(), loc);
    }
    case op_kind::reduce_sum:
    case op_kind::reduce_max: {
      shape kept = x.dims();
      for (auto a : n.attrs.axes) kept[static_cast<size_t>(a)] = 1;
      const expr gb = broadcast_to(reshape(g, kept, loc), x.dims(), loc);
      if (n.op == op_kind::reduce_sum) return gb;
      // Tied maxima share the gradient equally, so that it sums to g over each reduced group, as
      // binary max keeps it (one operand gets it all there; here no element comes first).
      const expr yb = broadcast_to(reshape(y, kept, loc), x.dims(), loc);
      const expr is_max = compare(x, yb, compare_kind::eq);
      const expr ties = sum(cast(is_max, x.type(), loc), n.attrs.axes, true, loc);  // >= 1 unless y is NaN
      return select(is_max, gb / broadcast_to(ties, x.dims(), loc), 0.0);
    }
    case op_kind::broadcast: return unbroadcast(g, x.dims(), loc);
    case op_kind::reshape: return reshape(g, x.dims(), loc);
    case op_kind::permute: {
      std::vector<int64_t> inverse(n.attrs.axes.size());
      for (size_t i = 0; i < inverse.size(); ++i) inverse[static_cast<size_t>(n.attrs.axes[i])] = static_cast<int64_t>(i);
      return permute(g, inverse, loc);
    }
    case op_kind::slice: {
      // Pad the gradient back with zeros, one axis at a time.
      expr r = g;
      for (size_t a = 0; a < x.dims().size(); ++a) {
        const int64_t before = n.attrs.starts[a], after = x.dims()[a] - n.attrs.stops[a];
        if (before == 0 && after == 0) continue;
        std::vector<expr> parts;
        shape zs = r.dims();
        if (before) {
          zs[a] = before;
          parts.push_back(b.fill(0, r.type(), zs, loc));
        }
        parts.push_back(r);
        if (after) {
          zs[a] = after;
          parts.push_back(b.fill(0, r.type(), zs, loc));
        }
        r = concat(parts, static_cast<int64_t>(a), loc);
      }
      return r;
    }
    case op_kind::concat: {
      const auto ax = static_cast<size_t>(n.attrs.axis);
      int64_t start = 0;
      for (int i = 0; i < k; ++i) start += b.peek()[n.inputs[static_cast<size_t>(i)]].dims[ax];
      return slice_axis(g, static_cast<int64_t>(ax), start, start + in(k).dims()[ax], loc);
    }
    case op_kind::gather: return scatter_add(in(1), g, x.dims(), loc);
    case op_kind::scatter_add: return gather(g, in(0), loc);
    default: return {};
  }
}

/// Whether input k of n carries a gradient at all (indices, conditions and comparisons do not).
bool differentiable_input(const node& n, int k, const graph& g) {
  if (!is_float(g[n.inputs[static_cast<size_t>(k)]].type)) return false;
  switch (n.op) {
    case op_kind::compare: return false;
    case op_kind::select: return k != 0;
    case op_kind::gather: return k == 0;
    case op_kind::scatter_add: return k == 1;
    case op_kind::cast: return is_float(n.type);
    default: return family_of(n.op) != op_family::leaf;
  }
}

}  // namespace

std::vector<expr> gradients(const expr& loss, const std::vector<expr>& wrt, source_loc loc) {
  builder* bp = loss.owner();
  if (!bp) return std::vector<expr>(wrt.size());
  builder& b = *bp;
  const auto poisoned = [&](const std::string& why) {
    b.fail(error{error_code::invalid_argument, "gradients: " + why}, loc);
    return std::vector<expr>(wrt.size(), expr(&b, -1));
  };
  if (!loss.ok()) return std::vector<expr>(wrt.size(), expr(&b, -1));
  if (!loss.dims().empty() || !is_float(loss.type()))
    return poisoned("loss must be a float scalar, got " + std::string(to_string(loss.type())) + to_string(loss.dims()));
  for (const auto& w : wrt) {
    if (!w.ok() || w.owner() != &b) return poisoned("a variable is invalid or from another builder");
    if (is_quantized(w.type()))
      return poisoned("variable %" + std::to_string(w.id()) + " is " + to_string(w.type()) +
                      ": quantized weights are frozen (no gradient); train float weights or adapters beside them");
  }

  // Only nodes on a path from some variable to the loss need adjoints.
  const node_index end = loss.id() + 1;
  std::vector<bool> from_wrt(static_cast<size_t>(end), false), to_loss(static_cast<size_t>(end), false);
  for (const auto& w : wrt)
    if (w.id() < end) from_wrt[static_cast<size_t>(w.id())] = true;
  for (node_index i = 0; i < end; ++i)
    for (auto in : b.peek()[i].inputs)
      if (from_wrt[static_cast<size_t>(in)]) from_wrt[static_cast<size_t>(i)] = true;
  to_loss[static_cast<size_t>(loss.id())] = true;
  for (node_index i = loss.id(); i >= 0; --i) {
    if (!to_loss[static_cast<size_t>(i)]) continue;
    for (auto in : b.peek()[i].inputs) to_loss[static_cast<size_t>(in)] = true;
  }

  std::map<node_index, expr> adjoint;
  adjoint[loss.id()] = b.fill(1.0, loss.type(), {}, loc);
  for (node_index id = loss.id(); id >= 0; --id) {
    auto it = adjoint.find(id);
    if (it == adjoint.end()) continue;
    const node n = b.peek()[id];  // copy: appending nodes may reallocate
    const expr g = it->second;
    for (int k = 0; k < static_cast<int>(n.inputs.size()); ++k) {
      const node_index x = n.inputs[static_cast<size_t>(k)];
      if (!from_wrt[static_cast<size_t>(x)] || !to_loss[static_cast<size_t>(x)]) continue;
      if (!differentiable_input(n, k, b.peek())) continue;
      if (n.op == op_kind::kv_write)
        return poisoned("kv_write (node %" + std::to_string(id) + ") is not differentiable: it writes a cache in place");
      if (n.op == op_kind::attention)
        return poisoned("attention (node %" + std::to_string(id) +
                        ") is not differentiable: it is for inference; compose training attention from matmul and softmax");
      expr contribution = vjp(b, n, id, k, g, loc);
      auto prev = adjoint.find(x);
      if (prev == adjoint.end()) adjoint[x] = contribution;
      else prev->second = prev->second + contribution;
    }
  }
  std::vector<expr> out;
  for (const auto& w : wrt) {
    auto it = adjoint.find(w.id());
    out.push_back(it != adjoint.end() ? it->second : b.fill(0, w.type(), w.dims(), loc));
  }
  return out;
}

expected<gradient_graph> grad(const graph& g, node_index loss, const std::vector<node_index>& wrt) {
  if (loss < 0 || loss >= g.size()) return make_error(error_code::invalid_argument, "grad: loss is not a node of the graph");
  builder b(g);
  std::vector<expr> vars;
  for (auto w : wrt) {
    if (w < 0 || w >= g.size()) return make_error(error_code::invalid_argument, "grad: variable is not a node of the graph");
    vars.push_back(b.at(w));
  }
  auto gs = gradients(b.at(loss), vars);
  auto done = b.finish();
  if (!done) return tl::unexpected(done.error());
  gradient_graph out{std::move(*done), {}};
  for (auto& x : gs) out.grads.push_back(x.id());
  return out;
}

}  // namespace mesh
