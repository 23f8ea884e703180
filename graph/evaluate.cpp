#include "graph/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/attention_rows.hpp"

namespace mesh {
namespace {

using values = std::vector<double>;

/// Multi-index of flat index `i` in `dims` (row-major).
std::vector<int64_t> unravel(int64_t i, const shape& dims) {
  std::vector<int64_t> idx(dims.size());
  for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
    idx[k] = dims[k] ? i % dims[k] : 0;
    i = dims[k] ? i / dims[k] : 0;
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const shape& dims) {
  int64_t i = 0;
  for (size_t k = 0; k < dims.size(); ++k) i = i * dims[k] + idx[k];
  return i;
}

double apply_unary(op_kind op, double x) {
  switch (op) {
    case op_kind::neg: return -x;
    case op_kind::abs: return std::abs(x);
    case op_kind::exp: return std::exp(x);
    case op_kind::log: return std::log(x);
    case op_kind::sqrt: return std::sqrt(x);
    case op_kind::rsqrt: return 1.0 / std::sqrt(x);
    case op_kind::tanh: return std::tanh(x);
    case op_kind::sin: return std::sin(x);
    case op_kind::cos: return std::cos(x);
    case op_kind::relu: return x > 0 ? x : 0.0;
    case op_kind::sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case op_kind::cast: return x;  // rounding to the target dtype happens after every op
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

double apply_binary(const node& n, dtype operand_type, double a, double b) {
  switch (n.op) {
    case op_kind::add: return a + b;
    case op_kind::sub: return a - b;
    case op_kind::mul:  // an i32 product can pass 2^53: exact in int64, then wrapped
      if (operand_type == dtype::i32) return wrap_i32(static_cast<int64_t>(a) * static_cast<int64_t>(b));
      return a * b;
    case op_kind::div:
      // Integer division truncates toward zero; dividing an integer by zero gives 0 (defined
      // here so that every back end agrees, and so no device faults on it).
      if (operand_type == dtype::i32) return b == 0 ? 0.0 : std::trunc(a / b);
      return a / b;
    case op_kind::pow: return std::pow(a, b);
    case op_kind::max:  // NaN propagates, as in reduce_max
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : (a > b ? a : b);
    case op_kind::min: return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : (a < b ? a : b);
    case op_kind::compare:
      switch (n.attrs.cmp) {
        case compare_kind::eq: return a == b;
        case compare_kind::ne: return a != b;
        case compare_kind::lt: return a < b;
        case compare_kind::le: return a <= b;
        case compare_kind::gt: return a > b;
        case compare_kind::ge: return a >= b;
      }
      return 0;
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

/// a + b for i32 values (held as doubles), wrapped at every step: a double sum of i32 values is
/// exact only up to 2^53, and 2^23 copies of INT_MAX already pass it, where the wrapped total
/// (what every device computes, modulo 2^32) would then be off.
double add_i32(double a, double b) {
  return wrap_i32(static_cast<int64_t>(wrap_i32_exact(a)) + static_cast<int64_t>(wrap_i32_exact(b)));
}

/// The error for index `r`, element `p` of the indices of gather or scatter_add node `id` of `g`,
/// whose table has `rows` rows. Names the indices' leaf when they come straight from one, as
/// labels and token ids usually do.
error bad_index(const graph& g, node_index id, int64_t p, int64_t r, int64_t rows) {
  const node& n = g[id];
  const node& src = g[n.inputs[n.op == op_kind::gather ? 1 : 0]];
  const bool leaf = src.op == op_kind::input || src.op == op_kind::parameter;
  return error{error_code::invalid_argument,
               std::string(to_string(n.op)) + " (node " + std::to_string(id) + "): index " + std::to_string(r) +
                   " at position " + std::to_string(p) + " of its indices" +
                   (leaf ? " (" + std::string(to_string(src.op)) + " \"" + src.attrs.name + "\")" : std::string()) +
                   " is outside the " + std::to_string(rows) + " rows of its " +
                   (n.op == op_kind::gather ? "table" : "result")};
}

/// Computes node `id` of `g` from its inputs' values. `in_dims` are the inputs' shapes.
expected<values> compute(const graph& g, node_index id, const std::vector<const values*>& in,
                         const std::vector<const shape*>& in_dims, const std::vector<dtype>& in_types, bool round,
                         index_check indices) {
  const node& n = g[id];
  const int64_t count = element_count(n.dims);
  values out(static_cast<size_t>(count), 0.0);
  switch (family_of(n.op)) {
    case op_family::leaf: break;  // handled by the caller
    case op_family::unary:
      for (int64_t i = 0; i < count; ++i) out[i] = apply_unary(n.op, (*in[0])[i]);
      break;
    case op_family::binary:
      for (int64_t i = 0; i < count; ++i) out[i] = apply_binary(n, in_types[0], (*in[0])[i], (*in[1])[i]);
      break;
    case op_family::ternary:
      for (int64_t i = 0; i < count; ++i) out[i] = (*in[0])[i] != 0 ? (*in[1])[i] : (*in[2])[i];
      break;
    case op_family::matmul: {
      const shape& ad = *in_dims[0];
      const size_t r = ad.size();
      const int64_t m = ad[r - 2], k = ad[r - 1], nn = n.dims[r - 1];
      const int64_t batches = (m * nn != 0) ? count / (m * nn) : 0;
      for (int64_t bt = 0; bt < batches; ++bt)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nn; ++j) {
            double acc = 0;
            for (int64_t p = 0; p < k; ++p) acc += (*in[0])[(bt * m + i) * k + p] * (*in[1])[(bt * k + p) * nn + j];
            out[(bt * m + i) * nn + j] = acc;
          }
      break;
    }
    case op_family::reduce: {
      const shape& xd = *in_dims[0];
      const bool is_max = n.op == op_kind::reduce_max;
      std::fill(out.begin(), out.end(), is_max ? -std::numeric_limits<double>::infinity() : 0.0);
      // Output index of an input element: its index with reduced axes dropped (or set to 0).
      shape kept_dims;
      for (size_t a = 0; a < xd.size(); ++a) {
        const bool reduced = std::count(n.attrs.axes.begin(), n.attrs.axes.end(), static_cast<int64_t>(a)) > 0;
        kept_dims.push_back(reduced ? 1 : xd[a]);
      }
      for (int64_t i = 0; i < element_count(xd); ++i) {
        auto idx = unravel(i, xd);
        for (auto a : n.attrs.axes) idx[static_cast<size_t>(a)] = 0;
        const int64_t o = ravel(idx, kept_dims);
        const double x = (*in[0])[i];
        if (is_max) out[o] = std::isnan(x) || x > out[o] ? x : out[o];
        else if (n.type == dtype::i32) out[o] = add_i32(out[o], x);
        else out[o] += x;
      }
      break;
    }
    case op_family::movement: {
      switch (n.op) {
        case op_kind::broadcast: {
          const shape& xd = *in_dims[0];
          const size_t off = n.dims.size() - xd.size();
          for (int64_t i = 0; i < count; ++i) {
            auto o = unravel(i, n.dims);
            std::vector<int64_t> idx(xd.size());
            for (size_t a = 0; a < xd.size(); ++a) idx[a] = xd[a] == 1 ? 0 : o[off + a];
            out[i] = (*in[0])[ravel(idx, xd)];
          }
          break;
        }
        case op_kind::reshape: out = *in[0]; break;
        case op_kind::permute: {
          const shape& xd = *in_dims[0];
          for (int64_t i = 0; i < count; ++i) {
            auto o = unravel(i, n.dims);
            std::vector<int64_t> idx(xd.size());
            for (size_t a = 0; a < o.size(); ++a) idx[static_cast<size_t>(n.attrs.axes[a])] = o[a];
            out[i] = (*in[0])[ravel(idx, xd)];
          }
          break;
        }
        case op_kind::slice: {
          const shape& xd = *in_dims[0];
          for (int64_t i = 0; i < count; ++i) {
            auto idx = unravel(i, n.dims);
            for (size_t a = 0; a < idx.size(); ++a) idx[a] += n.attrs.starts[a];
            out[i] = (*in[0])[ravel(idx, xd)];
          }
          break;
        }
        case op_kind::concat: {
          const auto ax = static_cast<size_t>(n.attrs.axis);
          for (int64_t i = 0; i < count; ++i) {
            auto idx = unravel(i, n.dims);
            size_t part = 0;
            while (idx[ax] >= (*in_dims[part])[ax]) idx[ax] -= (*in_dims[part++])[ax];
            out[i] = (*in[part])[ravel(idx, *in_dims[part])];
          }
          break;
        }
        default: break;
      }
      break;
    }
    case op_family::gather: {
      if (n.op == op_kind::gather) {
        const shape& td = *in_dims[0];
        const int64_t rows = td[0], row_size = element_count(td) / std::max<int64_t>(rows, 1);
        const int64_t picks = element_count(*in_dims[1]);
        for (int64_t p = 0; p < picks; ++p) {
          const auto r = static_cast<int64_t>((*in[1])[p]);
          if (r < 0 || r >= rows) {
            if (indices == index_check::strict) return tl::unexpected(bad_index(g, id, p, r, rows));
            continue;  // reads zeros, as on a device
          }
          for (int64_t c = 0; c < row_size; ++c) out[p * row_size + c] = (*in[0])[r * row_size + c];
        }
      } else {
        const int64_t rows = n.dims[0], row_size = rows ? count / rows : 0;
        const int64_t picks = element_count(*in_dims[0]);
        for (int64_t p = 0; p < picks; ++p) {
          const auto r = static_cast<int64_t>((*in[0])[p]);
          if (r < 0 || r >= rows) {
            if (indices == index_check::strict) return tl::unexpected(bad_index(g, id, p, r, rows));
            continue;  // dropped, as on a device
          }
          for (int64_t c = 0; c < row_size; ++c) {
            double& o = out[r * row_size + c];
            const double x = (*in[1])[p * row_size + c];
            o = n.type == dtype::i32 ? add_i32(o, x) : o + x;
          }
        }
      }
      break;
    }
    case op_family::linear: {
      // x [..., k] times w [n, k] transposed; a quantized w arrived dequantized (tensor::to_doubles).
      const int64_t k = in_dims[0]->back(), nn = n.dims.back(), rows = nn ? count / nn : 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < nn; ++j) {
          double acc = 0;
          for (int64_t p = 0; p < k; ++p) acc += (*in[0])[r * k + p] * (*in[1])[j * k + p];
          out[r * nn + j] = acc;
        }
      break;
    }
    case op_family::kv_write: {
      out = *in[0];
      const shape& vd = *in_dims[1];
      const auto ax = static_cast<size_t>(n.attrs.axis);
      // Where row r of the value goes: pos + r (a scalar pos), or pos[r] (a vector; negative: nowhere).
      const bool per_row = !in_dims[2]->empty();
      const auto row_at = [&](int64_t r) {
        return per_row ? static_cast<int64_t>((*in[2])[static_cast<size_t>(r)]) : static_cast<int64_t>((*in[2])[0]) + r;
      };
      if (indices == index_check::strict && element_count(vd) > 0)
        for (int64_t r = 0; r < vd[ax]; ++r) {
          const int64_t t = row_at(r);
          if (t >= n.dims[ax] || (t < 0 && !per_row))
            return make_error(error_code::invalid_argument,
                              "kv_write (node " + std::to_string(id) + "): " +
                                  (per_row ? "row " + std::to_string(r) + " to position " + std::to_string(t)
                                           : "position " + std::to_string(row_at(0)) + " + " + std::to_string(vd[ax]) +
                                                 " rows") +
                                  " does not fit the " + std::to_string(n.dims[ax]) + " rows of the cache along axis " +
                                  std::to_string(ax));
        }
      for (int64_t i = 0; i < element_count(vd); ++i) {
        auto idx = unravel(i, vd);
        idx[ax] = row_at(idx[ax]);
        if (idx[ax] < 0 || idx[ax] >= n.dims[ax]) continue;  // dropped, as on a device
        out[ravel(idx, n.dims)] = (*in[1])[i];
      }
      break;
    }
    case op_family::attention:
      attention_rows(attention_shape_of(*in_dims[0], *in_dims[1], n.attrs.axis), *in[0], *in[1], *in[2], *in[3], out);
      break;
  }
  // i32 arithmetic wraps; other i32 results (casts, an empty max) saturate (ops.hpp).
  if (round)
    for (auto& v : out) v = n.type == dtype::i32 && wraps_i32(n.op) ? wrap_i32_exact(v) : round_to(n.type, v);
  return out;
}

expected<void> check_one(const node& n, const tensor_map& bindings, const char* what) {
  auto it = bindings.find(n.attrs.name);
  if (it == bindings.end())
    return make_error(error_code::not_found, std::string("no value bound for ") + what + " \"" + n.attrs.name + "\"");
  const tensor& t = it->second;
  if (t.type != n.type || t.dims != n.dims)
    return make_error(error_code::shape_mismatch, std::string(what) + " \"" + n.attrs.name + "\" expects " +
                                                      to_string(n.type) + to_string(n.dims) + ", got " +
                                                      to_string(t.type) + to_string(t.dims));
  return t.check();
}

}  // namespace

expected<void> check_bindings(const graph& g, const tensor_map& bindings, bool parameters) {
  const op_kind want = parameters ? op_kind::parameter : op_kind::input;
  for (const auto& n : g.nodes)
    if (n.op == want)
      if (auto ok = check_one(n, bindings, parameters ? "parameter" : "input"); !ok) return ok;
  if (!parameters)
    for (const auto& [name, t] : bindings) {
      const node_index id = g.find_leaf(name);
      if (id < 0 || g[id].op != op_kind::input)
        return make_error(error_code::not_found, "the graph has no input named \"" + name + "\"");
    }
  return {};
}

namespace {

/// Values of every node. `leaf` gives inputs' and parameters' values; with `round`, each result
/// is rounded to its node's dtype (what a device sees), else floats stay exact doubles.
template <class Leaf>
expected<std::vector<values>> evaluate_values(const graph& g, Leaf&& leaf, bool round, index_check indices) {
  std::vector<values> vals(g.nodes.size());
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    if (n.op == op_kind::input || n.op == op_kind::parameter) vals[id] = leaf(n);
    else if (n.op == op_kind::constant) {
      const auto count = static_cast<size_t>(element_count(n.dims));
      vals[id] = n.attrs.values.size() == 1 ? values(count, n.attrs.values[0]) : n.attrs.values;
      for (auto& v : vals[id]) v = round_to(n.type, v);
    } else {
      std::vector<const values*> in;
      std::vector<const shape*> dims;
      std::vector<dtype> types;
      for (auto i : n.inputs) {
        in.push_back(&vals[i]);
        dims.push_back(&g[i].dims);
        types.push_back(g[i].type);
      }
      auto v = compute(g, id, in, dims, types, round || !is_float(n.type), indices);
      if (!v) return forward_error(v);
      vals[id] = std::move(*v);
    }
  }
  return vals;
}

expected<std::vector<values>> evaluate_bound(const graph& g, const tensor_map& inputs, const tensor_map& params,
                                             index_check indices) {
  if (auto ok = check_bindings(g, inputs, false); !ok) return tl::unexpected(ok.error());
  if (auto ok = check_bindings(g, params, true); !ok) return tl::unexpected(ok.error());
  return evaluate_values(
      g, [&](const node& n) { return (n.op == op_kind::input ? inputs : params).at(n.attrs.name).to_doubles(); }, true,
      indices);
}

}  // namespace

expected<std::vector<std::vector<double>>> evaluate_exact(const graph& g,
                                                          const std::map<std::string, std::vector<double>>& leaves) {
  for (const auto& n : g.nodes) {
    if (n.op != op_kind::input && n.op != op_kind::parameter) continue;
    auto it = leaves.find(n.attrs.name);
    if (it == leaves.end()) return make_error(error_code::not_found, "no value bound for \"" + n.attrs.name + "\"");
    if (static_cast<int64_t>(it->second.size()) != element_count(n.dims))
      return make_error(error_code::shape_mismatch, "\"" + n.attrs.name + "\" needs " + std::to_string(element_count(n.dims)) + " values");
  }
  return evaluate_values(g, [&](const node& n) { return leaves.at(n.attrs.name); }, false, index_check::strict);
}

expected<std::vector<tensor>> evaluate_nodes(const graph& g, const tensor_map& inputs, const tensor_map& params) {
  auto vals = evaluate_bound(g, inputs, params, index_check::strict);
  if (!vals) return tl::unexpected(vals.error());
  std::vector<tensor> out;
  out.reserve(vals->size());
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    if (is_quantized(n.type))  // a leaf: its blocks as bound (encoding its decoded values again would lose more)
      out.push_back((n.op == op_kind::input ? inputs : params).at(n.attrs.name));
    else
      out.push_back(tensor::from_values(n.type, n.dims, (*vals)[id]));
  }
  return out;
}

expected<evaluation> evaluate(const graph& g, const tensor_map& inputs, const tensor_map& params,
                              index_check indices) {
  auto vals = evaluate_bound(g, inputs, params, indices);
  if (!vals) return tl::unexpected(vals.error());
  const auto as_tensor = [&](node_index id) { return tensor::from_values(g[id].type, g[id].dims, (*vals)[id]); };
  evaluation result;
  for (const auto& o : g.outputs) result.outputs[o.name] = as_tensor(o.id);
  result.params = params;
  for (const auto& u : g.updates) result.params[g[u.target].attrs.name] = as_tensor(u.value);
  return result;
}

}  // namespace mesh
