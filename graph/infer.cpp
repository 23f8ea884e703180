#include "graph/infer.hpp"

#include <algorithm>
#include <string>

#include "graph/quant.hpp"

namespace mesh {
namespace {

tl::unexpected<error> shape_error(const node& n, const std::string& what) {
  return make_error(error_code::shape_mismatch, std::string(to_string(n.op)) + ": " + what);
}
tl::unexpected<error> type_error(const node& n, const std::string& what) {
  return make_error(error_code::dtype_mismatch, std::string(to_string(n.op)) + ": " + what);
}
tl::unexpected<error> attr_error(const node& n, const std::string& what) {
  return make_error(error_code::invalid_graph, std::string(to_string(n.op)) + ": " + what);
}

size_t arity_of(const node& n) {
  switch (family_of(n.op)) {
    case op_family::leaf: return 0;
    case op_family::unary:
    case op_family::reduce:
    case op_family::movement: return 1;
    case op_family::binary:
    case op_family::matmul:
    case op_family::gather:
    case op_family::linear: return 2;
    case op_family::ternary:
    case op_family::kv_write: return 3;
    case op_family::attention: return 4;
  }
  return 0;
}

/// True when `axes` are distinct and within [0, rank).
bool valid_axes(const std::vector<int64_t>& axes, size_t rank) {
  std::vector<bool> seen(rank, false);
  for (auto a : axes) {
    if (a < 0 || a >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(a)]) return false;
    seen[static_cast<size_t>(a)] = true;
  }
  return true;
}

bool valid_dims(const shape& s) {
  return s.size() <= static_cast<size_t>(max_rank) &&
         std::all_of(s.begin(), s.end(), [](int64_t d) { return d >= 0; });
}

/// Checks that attributes an op does not use are empty: a graph from a peer carries no hidden data.
expected<void> check_unused_attrs(const node& n) {
  const auto& a = n.attrs;
  const bool leaf_named = n.op == op_kind::input || n.op == op_kind::parameter;
  const bool uses_axes = n.op == op_kind::reduce_sum || n.op == op_kind::reduce_max || n.op == op_kind::permute;
  if (!leaf_named && !a.name.empty()) return attr_error(n, "unexpected name attribute");
  if (!uses_axes && !a.axes.empty()) return attr_error(n, "unexpected axes attribute");
  if (n.op != op_kind::slice && (!a.starts.empty() || !a.stops.empty()))
    return attr_error(n, "unexpected slice bounds");
  if (n.op != op_kind::concat && n.op != op_kind::kv_write && n.op != op_kind::attention && a.axis != 0)
    return attr_error(n, "unexpected axis attribute");
  if (n.op != op_kind::compare && a.cmp != compare_kind::eq) return attr_error(n, "unexpected comparison");
  if (n.op != op_kind::reduce_sum && n.op != op_kind::reduce_max && a.keep_dims)
    return attr_error(n, "unexpected keep_dims");
  if (n.op != op_kind::constant && !a.values.empty()) return attr_error(n, "unexpected values");
  return {};
}

}  // namespace

expected<shape> broadcast_shapes(const shape& a, const shape& b) {
  const size_t r = std::max(a.size(), b.size());
  shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      return make_error(error_code::shape_mismatch,
                        "cannot broadcast " + to_string(a) + " with " + to_string(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

expected<value_type> infer(const node& n, const std::vector<value_type>& in) {
  if (static_cast<int>(n.op) >= op_count)
    return make_error(error_code::invalid_graph, "unknown op " + std::to_string(static_cast<int>(n.op)));
  if (static_cast<int>(n.type) >= dtype_count)
    return make_error(error_code::invalid_graph, "unknown dtype " + std::to_string(static_cast<int>(n.type)));
  if (auto ok = check_unused_attrs(n); !ok) return tl::unexpected(ok.error());
  if (n.op == op_kind::concat ? in.empty() : in.size() != arity_of(n))
    return attr_error(n, "wrong number of inputs (" + std::to_string(in.size()) + ")");
  if (!valid_dims(n.dims))
    return shape_error(n, "invalid result shape " + to_string(n.dims) + " (rank <= " +
                              std::to_string(max_rank) + ", sizes >= 0)");

  // Quantized tensors are storage: leaves hold them, linear reads them as its weight and a cast to
  // a float dtype dequantizes them (autodiff's d/dx of a linear); nothing else reads or makes one.
  if (is_quantized(n.type) && n.op != op_kind::input && n.op != op_kind::parameter)
    return type_error(n, std::string("cannot produce ") + to_string(n.type) +
                             ": quantized dtypes are only for inputs and parameters (read by linear)");
  for (size_t j = 0; j < in.size(); ++j)
    if (is_quantized(in[j].type) && !(n.op == op_kind::linear && j == 1) && !(n.op == op_kind::cast && is_float(n.type)))
      return type_error(n, "operand " + std::to_string(j) + " is " + to_string(in[j].type) +
                               ": quantized tensors are read only as the weight of linear or by a cast to a float dtype");

  const auto same_type_and_shape = [&](const value_type& a, const value_type& b) -> expected<void> {
    if (a.type != b.type)
      return type_error(n, std::string("operands are ") + to_string(a.type) + " and " + to_string(b.type));
    if (a.dims != b.dims)
      return shape_error(n, "operands have shapes " + to_string(a.dims) + " and " + to_string(b.dims) +
                                " (the builder inserts broadcasts; the IR needs equal shapes)");
    return {};
  };

  switch (family_of(n.op)) {
    case op_family::leaf: {
      if (n.op == op_kind::constant) {
        const auto count = static_cast<size_t>(element_count(n.dims));
        if (n.attrs.values.size() != 1 && n.attrs.values.size() != count)
          return attr_error(n, "has " + std::to_string(n.attrs.values.size()) + " values for shape " +
                                   to_string(n.dims));
      } else if (n.attrs.name.empty()) {
        return attr_error(n, "needs a name");
      } else if (is_quantized(n.type) && byte_size(n.type, n.dims) < 0) {
        return shape_error(n, byte_size_problem(n.type, n.dims));
      }
      return value_type{n.type, n.dims};
    }
    case op_family::unary: {
      const auto& x = in[0];
      if (n.op == op_kind::cast) return value_type{n.type, x.dims};
      if (n.op == op_kind::neg || n.op == op_kind::abs || n.op == op_kind::relu) return x;
      if (!is_float(x.type)) return type_error(n, std::string("needs a float operand, got ") + to_string(x.type));
      return x;
    }
    case op_family::binary: {
      if (auto ok = same_type_and_shape(in[0], in[1]); !ok) return tl::unexpected(ok.error());
      if (n.op == op_kind::compare) {
        if (static_cast<int>(n.attrs.cmp) > 5) return attr_error(n, "unknown comparison");
        return value_type{dtype::i32, in[0].dims};
      }
      if (n.op == op_kind::pow && !is_float(in[0].type)) return type_error(n, "needs float operands");
      return in[0];
    }
    case op_family::ternary: {
      if (in[0].type != dtype::i32) return type_error(n, "condition must be i32");
      if (in[0].dims != in[1].dims) return shape_error(n, "condition " + to_string(in[0].dims) + " vs value " + to_string(in[1].dims));
      if (auto ok = same_type_and_shape(in[1], in[2]); !ok) return tl::unexpected(ok.error());
      return in[1];
    }
    case op_family::matmul: {
      const auto &a = in[0], &b = in[1];
      if (a.type != b.type) return type_error(n, std::string("operands are ") + to_string(a.type) + " and " + to_string(b.type));
      if (!is_float(a.type)) return type_error(n, "needs float operands");
      if (a.dims.size() < 2 || a.dims.size() != b.dims.size())
        return shape_error(n, "needs operands of equal rank >= 2, got " + to_string(a.dims) + " x " + to_string(b.dims));
      const size_t r = a.dims.size();
      if (!std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin()))
        return shape_error(n, "batch dimensions differ: " + to_string(a.dims) + " x " + to_string(b.dims));
      if (a.dims[r - 1] != b.dims[r - 2])
        return shape_error(n, "inner dimensions differ: " + to_string(a.dims) + " x " + to_string(b.dims));
      shape out = a.dims;
      out[r - 1] = b.dims[r - 1];
      return value_type{a.type, out};
    }
    case op_family::reduce: {
      const auto& x = in[0];
      if (!valid_axes(n.attrs.axes, x.dims.size()))
        return attr_error(n, "axes out of range or repeated for shape " + to_string(x.dims));
      shape out;
      for (size_t i = 0; i < x.dims.size(); ++i) {
        const bool reduced = std::count(n.attrs.axes.begin(), n.attrs.axes.end(), static_cast<int64_t>(i)) > 0;
        if (!reduced) out.push_back(x.dims[i]);
        else if (n.attrs.keep_dims) out.push_back(1);
      }
      return value_type{x.type, out};
    }
    case op_family::movement: {
      const auto& x = in[0];
      if (n.op != op_kind::concat && n.type != x.type)
        return type_error(n, "changes the dtype (use cast)");
      switch (n.op) {
        case op_kind::broadcast: {
          if (x.dims.size() > n.dims.size())
            return shape_error(n, "cannot broadcast " + to_string(x.dims) + " to lower rank " + to_string(n.dims));
          const size_t off = n.dims.size() - x.dims.size();
          for (size_t i = 0; i < x.dims.size(); ++i)
            if (x.dims[i] != 1 && x.dims[i] != n.dims[off + i])
              return shape_error(n, "cannot broadcast " + to_string(x.dims) + " to " + to_string(n.dims));
          return value_type{x.type, n.dims};
        }
        case op_kind::reshape:
          if (element_count(x.dims) != element_count(n.dims))
            return shape_error(n, "cannot reshape " + to_string(x.dims) + " to " + to_string(n.dims));
          return value_type{x.type, n.dims};
        case op_kind::permute: {
          if (n.attrs.axes.size() != x.dims.size() || !valid_axes(n.attrs.axes, x.dims.size()))
            return attr_error(n, "is not a permutation of " + std::to_string(x.dims.size()) + " axes");
          shape out;
          for (auto a : n.attrs.axes) out.push_back(x.dims[static_cast<size_t>(a)]);
          return value_type{x.type, out};
        }
        case op_kind::slice: {
          const auto &st = n.attrs.starts, &sp = n.attrs.stops;
          if (st.size() != x.dims.size() || sp.size() != x.dims.size())
            return attr_error(n, "needs one start and stop per dimension of " + to_string(x.dims));
          shape out;
          for (size_t i = 0; i < x.dims.size(); ++i) {
            if (st[i] < 0 || st[i] > sp[i] || sp[i] > x.dims[i])
              return attr_error(n, "bounds [" + std::to_string(st[i]) + ", " + std::to_string(sp[i]) +
                                       ") out of range for dimension " + std::to_string(i) + " of " + to_string(x.dims));
            out.push_back(sp[i] - st[i]);
          }
          return value_type{x.type, out};
        }
        case op_kind::concat: {
          const int64_t ax = n.attrs.axis;
          if (ax < 0 || ax >= static_cast<int64_t>(x.dims.size()))
            return attr_error(n, "axis " + std::to_string(ax) + " out of range for " + to_string(x.dims));
          shape out = x.dims;
          out[static_cast<size_t>(ax)] = 0;
          for (const auto& y : in) {
            if (y.type != x.type) return type_error(n, "operands of different dtypes");
            if (y.dims.size() != x.dims.size()) return shape_error(n, "operands of different ranks");
            for (size_t i = 0; i < x.dims.size(); ++i)
              if (static_cast<int64_t>(i) != ax && y.dims[i] != x.dims[i])
                return shape_error(n, "operands " + to_string(x.dims) + " and " + to_string(y.dims) +
                                          " differ outside axis " + std::to_string(ax));
            out[static_cast<size_t>(ax)] += y.dims[static_cast<size_t>(ax)];
          }
          return value_type{x.type, out};
        }
        default: break;
      }
      break;
    }
    case op_family::gather: {
      if (n.op == op_kind::gather) {
        const auto &table = in[0], &idx = in[1];
        if (idx.type != dtype::i32) return type_error(n, "indices must be i32");
        if (table.dims.empty()) return shape_error(n, "table must have rank >= 1");
        shape out = idx.dims;
        out.insert(out.end(), table.dims.begin() + 1, table.dims.end());
        if (out.size() > static_cast<size_t>(max_rank)) return shape_error(n, "result rank exceeds " + std::to_string(max_rank));
        return value_type{table.type, out};
      }
      const auto &idx = in[0], &upd = in[1];
      if (idx.type != dtype::i32) return type_error(n, "indices must be i32");
      if (n.type != upd.type) return type_error(n, "result dtype differs from updates");
      if (n.dims.empty()) return shape_error(n, "result must have rank >= 1");
      shape want = idx.dims;
      want.insert(want.end(), n.dims.begin() + 1, n.dims.end());
      if (upd.dims != want)
        return shape_error(n, "updates " + to_string(upd.dims) + " do not match indices " + to_string(idx.dims) +
                                  " and rows of " + to_string(n.dims));
      return value_type{n.type, n.dims};
    }
    case op_family::linear: {
      const auto &x = in[0], &w = in[1];
      if (!is_float(x.type)) return type_error(n, std::string("x must be f32, f16 or bf16, got ") + to_string(x.type));
      if (w.type == dtype::i32) return type_error(n, "w must be a float or quantized dtype, got i32");
      if (x.dims.empty()) return shape_error(n, "x must have rank >= 1, got a scalar");
      if (w.dims.size() != 2 || w.dims[1] != x.dims.back())
        return shape_error(n, "needs x [..., k] and w [n, k], got " + to_string(x.dims) + " and " + to_string(w.dims));
      shape out = x.dims;
      out.back() = w.dims[0];
      return value_type{x.type, out};
    }
    case op_family::kv_write: {
      const auto &cache = in[0], &value = in[1], &pos = in[2];
      if (is_quantized(cache.type) || cache.type != value.type)
        return type_error(n, std::string("cache and value must share a dtype, got ") + to_string(cache.type) + " and " +
                                 to_string(value.type));
      const int64_t ax = n.attrs.axis;
      if (ax < 0 || ax >= static_cast<int64_t>(cache.dims.size()))
        return attr_error(n, "axis " + std::to_string(ax) + " out of range for " + to_string(cache.dims));
      if (value.dims.size() != cache.dims.size())
        return shape_error(n, "value " + to_string(value.dims) + " and cache " + to_string(cache.dims) + " differ in rank");
      const bool scalar = pos.dims.empty();
      if (pos.type != dtype::i32 || (!scalar && (pos.dims.size() != 1 || pos.dims[0] != value.dims[static_cast<size_t>(ax)])))
        return type_error(n, std::string("pos must be an i32 scalar or one i32 per row of the value (") +
                                 std::to_string(value.dims[static_cast<size_t>(ax)]) + "), got " + to_string(pos.type) +
                                 to_string(pos.dims));
      for (size_t i = 0; i < cache.dims.size(); ++i)
        if (static_cast<int64_t>(i) == ax ? value.dims[i] > cache.dims[i] : value.dims[i] != cache.dims[i])
          return shape_error(n, "value " + to_string(value.dims) + " does not fit cache " + to_string(cache.dims) +
                                    " along axis " + std::to_string(ax));
      return cache;
    }
    case op_family::attention: {
      const auto &q = in[0], &k = in[1], &v = in[2], &pos = in[3];
      if (!is_float(q.type) || !is_float(k.type) || !is_float(v.type))
        return type_error(n, std::string("q, k and v must be f32, f16 or bf16, got ") + to_string(q.type) + ", " + to_string(k.type) +
                                 " and " + to_string(v.type));
      if (n.attrs.axis < 0) return attr_error(n, "window " + std::to_string(n.attrs.axis) + " is negative");
      const size_t r = q.dims.size();
      const auto batch_of = [&](const shape& s) { return shape(s.begin(), s.end() - std::min<std::ptrdiff_t>(3, static_cast<std::ptrdiff_t>(s.size()))); };
      if (r < 3 || k.dims.size() != r || v.dims != k.dims || batch_of(k.dims) != batch_of(q.dims))
        return shape_error(n, "needs q [..., l, h, d] and k, v [..., t, kv, d] with the same leading dims, got " + to_string(q.dims) + ", " +
                                  to_string(k.dims) + " and " + to_string(v.dims));
      const int64_t l = q.dims[r - 3], h = q.dims[r - 2], d = q.dims[r - 1], kv = k.dims[r - 2];
      if (k.dims[r - 1] != d || kv < 1 || h % kv != 0)
        return shape_error(n, "q " + to_string(q.dims) + " and k " + to_string(k.dims) +
                                  " need the same head size and a number of query heads that is a multiple of the key/value heads");
      shape want_pos = batch_of(q.dims);
      want_pos.push_back(l);
      if (pos.type != dtype::i32 || pos.dims != want_pos)
        return type_error(n, "pos must be i32 " + to_string(want_pos) + " (one position per query row), got " + std::string(to_string(pos.type)) +
                                 to_string(pos.dims));
      return value_type{q.type, q.dims};
    }
  }
  return make_error(error_code::internal, "infer: unhandled op");
}

}  // namespace mesh
