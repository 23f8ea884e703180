#include "gpu/glsl.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

namespace mesh::gpu {
namespace {

std::string u(int64_t v) { return std::to_string(v) + "u"; }

std::string float_literal(double v) {
  const float f = static_cast<float>(v);
  if (std::isnan(f)) return "uintBitsToFloat(0x7fc00000u)";
  if (std::isinf(f)) return f > 0 ? "uintBitsToFloat(0x7f800000u)" : "uintBitsToFloat(0xff800000u)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string int_literal(double v) {
  const double r = round_to(dtype::i32, v);
  if (r <= -2147483648.0) return "(-2147483647 - 1)";
  return std::to_string(static_cast<int64_t>(r));
}

const char* prelude = R"(
float mesh_round_f16(float x) { return unpackHalf2x16(packHalf2x16(vec2(x, 0.0))).x; }
uint mesh_bf16_bits(float x) {
  uint b = floatBitsToUint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40u;
  b += 0x7fffu + ((b >> 16) & 1u);
  return b >> 16;
}
float mesh_round_bf16(float x) { return uintBitsToFloat(mesh_bf16_bits(x) << 16); }
// pow as C's pow (what the reference computes): GLSL's pow is undefined for a <= 0 and leaves
// zeros, infinities and NaN to the driver.
float mesh_pow(float a, float b) {
  const float inf = uintBitsToFloat(0x7f800000u), nan = uintBitsToFloat(0x7fc00000u);
  if (b == 0.0 || a == 1.0) return 1.0;  // even with NaN
  if (isnan(a) || isnan(b)) return nan;
  if (b == 1.0) return a;
  if (b == 2.0) return a * a;
  const bool odd = abs(b) < 16777216.0 && b == floor(b) && mod(b, 2.0) == 1.0;
  if (isinf(b)) return abs(a) == 1.0 ? 1.0 : ((abs(a) < 1.0) == (b < 0.0) ? inf : 0.0);
  if (a == 0.0) return b < 0.0 ? (odd ? 1.0 / a : inf) : (odd ? a : 0.0);  // 1.0 / -0.0 = -inf
  if (isinf(a)) {
    if (a > 0.0) return b < 0.0 ? 0.0 : inf;
    return b < 0.0 ? (odd ? -0.0 : 0.0) : (odd ? -inf : inf);
  }
  if (a > 0.0) return pow(a, b);
  if (b == floor(b)) { float r = pow(-a, b); return odd ? -r : r; }
  return nan;
}
// max and min propagate NaN (as reduce_max does): GLSL's leave it undefined.
float mesh_max(float a, float b) { return (isnan(a) || isnan(b)) ? uintBitsToFloat(0x7fc00000u) : max(a, b); }
float mesh_min(float a, float b) { return (isnan(a) || isnan(b)) ? uintBitsToFloat(0x7fc00000u) : min(a, b); }
vec4 mesh_max(vec4 a, vec4 b) { return vec4(mesh_max(a.x, b.x), mesh_max(a.y, b.y), mesh_max(a.z, b.z), mesh_max(a.w, b.w)); }
vec4 mesh_min(vec4 a, vec4 b) { return vec4(mesh_min(a.x, b.x), mesh_min(a.y, b.y), mesh_min(a.z, b.z), mesh_min(a.w, b.w)); }
vec4 mesh_pow(vec4 a, vec4 b) { return vec4(mesh_pow(a.x, b.x), mesh_pow(a.y, b.y), mesh_pow(a.z, b.z), mesh_pow(a.w, b.w)); }
// tanh through exp(-2|x|) cannot overflow, but near 0 the 1 - t cancels (x = 1e-6 came out 3% off):
// below |x| = 1/8 an odd Taylor polynomial to x^9 (next term < 1e-12) keeps f32's relative accuracy.
float mesh_tanh_small(float x) { float y = x * x; return x + x * y * (-1.0 / 3.0 + y * (2.0 / 15.0 + y * (-17.0 / 315.0 + y * (62.0 / 2835.0)))); }
vec4 mesh_tanh_small(vec4 x) { vec4 y = x * x; return x + x * y * (-1.0 / 3.0 + y * (2.0 / 15.0 + y * (-17.0 / 315.0 + y * (62.0 / 2835.0)))); }
float mesh_tanh(float x) { float t = exp(-2.0 * abs(x)); return abs(x) < 0.125 ? mesh_tanh_small(x) : sign(x) * (1.0 - t) / (1.0 + t); }
vec4 mesh_tanh(vec4 x) { vec4 t = exp(-2.0 * abs(x)); return mix(sign(x) * (1.0 - t) / (1.0 + t), mesh_tanh_small(x), lessThan(abs(x), vec4(0.125))); }
float mesh_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
vec4 mesh_sigmoid(vec4 x) { return 1.0 / (1.0 + exp(-x)); }
int mesh_to_int(float x) { return isnan(x) ? 0 : (x >= 2147483648.0 ? 2147483647 : int(max(x, -2147483648.0))); }
ivec4 mesh_to_int(vec4 x) { return ivec4(mesh_to_int(x.x), mesh_to_int(x.y), mesh_to_int(x.z), mesh_to_int(x.w)); }
int mesh_idiv(int a, int b) { return b == 0 ? 0 : (b == -1 ? -a : a / b); }  // -a wraps: INT_MIN / -1 = INT_MIN
)";

/// Builds the statements of one kernel: values of nodes at index expressions, with common
/// subexpressions shared (keyed by node and index text) and buffers bound on first use.
class emitter {
 public:
  emitter(const graph& g, const plan& p, bool vec4) : g_(g), p_(p), vec4_(vec4) {}

  std::string body;
  std::vector<node_id> bindings;

  int bind(node_id id) {
    auto it = std::find(bindings.begin(), bindings.end(), id);
    if (it != bindings.end()) return static_cast<int>(it - bindings.begin());
    bindings.push_back(id);
    return static_cast<int>(bindings.size() - 1);
  }

  /// GLSL type holding a value of node `id` while computing.
  std::string ctype(node_id id) const { return ctype(g_[id].type); }
  std::string ctype(dtype t) const {
    if (t == dtype::i32) return vec4_ ? "ivec4" : "int";
    return vec4_ ? "vec4" : "float";
  }

  std::string tmp() { return "t" + std::to_string(next_++); }

  /// Declares `T name = expr;` and returns the name.
  std::string let(const std::string& type, const std::string& expr) {
    std::string name = tmp();
    body += "  " + type + " " + name + " = " + expr + ";\n";
    return name;
  }

  /// An index expression as a plain name (declaring a temporary when it is not one).
  std::string index_var(const std::string& e) {
    if (std::all_of(e.begin(), e.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
      return e;
    auto it = index_cse_.find(e);
    if (it != index_cse_.end()) return it->second;
    std::string v = let("uint", e);
    index_cse_[e] = v;
    return v;
  }

  /// Seeds the value of `id` at `idx` (the accumulator of an epilogue's anchor).
  void seed(node_id id, const std::string& idx, const std::string& var) { cse_[{id, idx}] = var; }

  /// Makes `var` the value of `id` at every index: a rows kernel's result for the current row,
  /// which the plan guarantees is only read at that row.
  void fix(node_id id, const std::string& var) { fixed_[id] = var; }

  /// Runs `f` in a nested scope: temporaries made there are forgotten after.
  template <class F>
  void scoped(F f) {
    auto saved = cse_;
    auto saved_idx = index_cse_;
    f();
    cse_ = std::move(saved);
    index_cse_ = std::move(saved_idx);
  }

  std::string load(node_id id, const std::string& idx) {
    const int b = bind(id);
    const std::string ref = "b" + std::to_string(b) + ".v[" + idx + "]";
    switch (g_[id].type) {
      case dtype::f16: return "unpackHalf2x16(uint(" + ref + ")).x";
      case dtype::bf16: return "uintBitsToFloat(uint(" + ref + ") << 16)";
      default: return ref;
    }
  }

  std::string store(node_id id, const std::string& idx, const std::string& v) {
    const int b = bind(id);
    const std::string ref = "b" + std::to_string(b) + ".v[" + idx + "]";
    switch (g_[id].type) {
      case dtype::f16: return "  " + ref + " = uint16_t(packHalf2x16(vec2(" + v + ", 0.0)) & 0xffffu);\n";
      case dtype::bf16: return "  " + ref + " = uint16_t(mesh_bf16_bits(" + v + "));\n";
      default: return "  " + ref + " = " + v + ";\n";
    }
  }

  /// Rounds a freshly computed float to the node's storage type (what the reference does).
  std::string rounded(node_id id, const std::string& e) {
    switch (g_[id].type) {
      case dtype::f16: return "mesh_round_f16(" + e + ")";
      case dtype::bf16: return "mesh_round_bf16(" + e + ")";
      default: return e;
    }
  }

  /// Coordinate `d` of flat index `idx` in `dims`.
  static std::string coord(const std::string& idx, const shape& dims, size_t d) {
    const auto st = strides_of(dims);
    std::string e = st[d] == 1 ? idx : "(" + idx + " / " + u(st[d]) + ")";
    if (d > 0) e = "(" + e + " % " + u(dims[d]) + ")";
    return e;
  }

  static std::string sum_terms(const std::vector<std::string>& terms) {
    if (terms.empty()) return "0u";
    std::string s;
    for (const auto& t : terms) s += (s.empty() ? "" : " + ") + t;
    return "(" + s + ")";
  }

  static std::string times(const std::string& e, int64_t k) { return k == 1 ? e : e + " * " + u(k); }

  std::string value(node_id id, const std::string& idx_in) {
    if (auto it = fixed_.find(id); it != fixed_.end()) return it->second;
    const std::string idx = index_var(idx_in);
    auto key = std::make_pair(id, idx);
    if (auto it = cse_.find(key); it != cse_.end()) return it->second;
    const node& n = g_[id];
    std::string v;
    if (is_splat(n)) {
      const std::string lit = n.type == dtype::i32 ? int_literal(n.attrs.values[0]) : float_literal(round_to(n.type, n.attrs.values[0]));
      v = vec4_ ? ctype(id) + "(" + lit + ")" : lit;
    } else if (p_.materialised[id]) {
      v = let(ctype(id), load(id, idx));
    } else {
      v = compute(id, idx);
    }
    cse_[key] = v;
    return v;
  }

 private:
  std::string compute(node_id id, const std::string& idx) {
    const node& n = g_[id];
    const auto in = [&](size_t k) { return n.inputs[k]; };
    const bool is_int = n.type == dtype::i32;
    switch (family_of(n.op)) {
      case op_family::unary: {
        const dtype from = g_[in(0)].type;
        std::string x = value(in(0), idx);
        if (n.op == op_kind::cast) {
          if (n.type == dtype::i32) return from == dtype::i32 ? x : let(ctype(id), "mesh_to_int(" + x + ")");
          if (from == dtype::i32) x = (vec4_ ? "vec4(" : "float(") + x + ")";
          return let(ctype(id), rounded(id, x));
        }
        if (is_int) {
          switch (n.op) {
            case op_kind::neg: return let(ctype(id), "-" + x);
            case op_kind::abs: return let(ctype(id), "abs(" + x + ")");
            case op_kind::relu: return let(ctype(id), "max(" + x + ", " + ctype(id) + "(0))");
            default: x = (vec4_ ? "vec4(" : "float(") + x + ")"; break;
          }
        }
        std::string e;
        switch (n.op) {
          case op_kind::neg: e = "-" + x; break;
          case op_kind::abs: e = "abs(" + x + ")"; break;
          case op_kind::exp: e = "exp(" + x + ")"; break;
          case op_kind::log: e = "log(" + x + ")"; break;
          case op_kind::sqrt: e = "sqrt(" + x + ")"; break;
          case op_kind::rsqrt: e = "inversesqrt(" + x + ")"; break;
          case op_kind::tanh: e = "mesh_tanh(" + x + ")"; break;
          case op_kind::sin: e = "sin(" + x + ")"; break;
          case op_kind::cos: e = "cos(" + x + ")"; break;
          case op_kind::relu: e = "max(" + x + ", " + (vec4_ ? "vec4(0.0)" : "0.0") + ")"; break;
          case op_kind::sigmoid: e = "mesh_sigmoid(" + x + ")"; break;
          default: e = x; break;
        }
        if (is_int) return let(ctype(id), "mesh_to_int(" + e + ")");
        return let(ctype(id), rounded(id, e));
      }
      case op_family::binary: {
        const bool int_operands = g_[in(0)].type == dtype::i32;
        const std::string a = value(in(0), idx), b = value(in(1), idx);
        std::string e;
        if (n.op == op_kind::compare) {
          static const char* fn[] = {"equal", "notEqual", "lessThan", "lessThanEqual", "greaterThan", "greaterThanEqual"};
          static const char* sym[] = {"==", "!=", "<", "<=", ">", ">="};
          const auto c = static_cast<int>(n.attrs.cmp);
          e = vec4_ ? std::string("ivec4(") + fn[c] + "(" + a + ", " + b + "))"
                    : "int(" + a + " " + sym[c] + " " + b + ")";
          return let(ctype(id), e);
        }
        switch (n.op) {
          case op_kind::add: e = a + " + " + b; break;
          case op_kind::sub: e = a + " - " + b; break;
          case op_kind::mul: e = a + " * " + b; break;
          case op_kind::div: e = int_operands ? "mesh_idiv(" + a + ", " + b + ")" : a + " / " + b; break;
          case op_kind::pow:
            e = int_operands ? "mesh_to_int(mesh_pow(float(" + a + "), float(" + b + ")))" : "mesh_pow(" + a + ", " + b + ")";
            break;
          case op_kind::max: e = (int_operands ? "max(" : "mesh_max(") + a + ", " + b + ")"; break;
          case op_kind::min: e = (int_operands ? "min(" : "mesh_min(") + a + ", " + b + ")"; break;
          default: break;
        }
        return let(ctype(id), is_int ? e : rounded(id, e));
      }
      case op_family::ternary: {
        const std::string c = value(in(0), idx), a = value(in(1), idx), b = value(in(2), idx);
        if (vec4_) return let(ctype(id), "mix(" + b + ", " + a + ", notEqual(" + c + ", ivec4(0)))");
        return let(ctype(id), "(" + c + " != 0) ? " + a + " : " + b);
      }
      case op_family::movement: return movement(id, idx);
      case op_family::gather: return gather(id, idx);
      default: return "0";  // leaves, matmul, reduce, scatter_add are always materialised
    }
  }

  std::string movement(node_id id, const std::string& idx) {
    const node& n = g_[id];
    const node_id x = n.inputs[0];
    const shape& xd = g_[x].dims;
    const auto xs = strides_of(xd);
    std::vector<std::string> terms;
    switch (n.op) {
      case op_kind::reshape: return value(x, idx);
      case op_kind::broadcast: {
        const size_t off = n.dims.size() - xd.size();
        for (size_t a = 0; a < xd.size(); ++a)
          if (xd[a] != 1) terms.push_back(times(coord(idx, n.dims, off + a), xs[a]));
        return value(x, sum_terms(terms));
      }
      case op_kind::permute: {
        for (size_t a = 0; a < n.dims.size(); ++a)
          if (n.dims[a] != 1) terms.push_back(times(coord(idx, n.dims, a), xs[static_cast<size_t>(n.attrs.axes[a])]));
        return value(x, sum_terms(terms));
      }
      case op_kind::slice: {
        for (size_t a = 0; a < n.dims.size(); ++a) {
          if (xd[a] == 1) continue;
          std::string c = coord(idx, n.dims, a);
          if (n.attrs.starts[a] != 0) c = "(" + c + " + " + u(n.attrs.starts[a]) + ")";
          terms.push_back(times(c, xs[a]));
        }
        return value(x, sum_terms(terms));
      }
      case op_kind::concat: {
        const auto ax = static_cast<size_t>(n.attrs.axis);
        int64_t inner = 1;
        for (size_t a = ax + 1; a < n.dims.size(); ++a) inner *= n.dims[a];
        const std::string c = index_var(coord(idx, n.dims, ax));
        const std::string outer = index_var(idx + " / " + u(n.dims[ax] * inner));
        const std::string within = inner == 1 ? "0u" : index_var(idx + " % " + u(inner));
        const std::string result = tmp();
        body += "  " + ctype(id) + " " + result + ";\n";
        int64_t start = 0;
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          const int64_t len = g_[n.inputs[k]].dims[ax];
          const bool last = k + 1 == n.inputs.size();
          body += k == 0 ? "  " : "  else ";
          if (!last) body += "if (" + c + " < " + u(start + len) + ") ";
          body += "{\n";
          scoped([&] {
            const std::string in_idx = "(" + outer + " * " + u(len * inner) + " + (" + c + " - " + u(start) + ") * " +
                                       u(inner) + " + " + within + ")";
            const std::string v = value(n.inputs[k], in_idx);
            body += "  " + result + " = " + v + ";\n";
          });
          body += "  }\n";
          start += len;
        }
        return result;
      }
      default: return "0";
    }
  }

  std::string gather(node_id id, const std::string& idx) {
    const node& n = g_[id];
    const node_id table = n.inputs[0], indices = n.inputs[1];
    const shape& td = g_[table].dims;
    const int64_t rows = td[0];
    const int64_t row_size = element_count(shape(td.begin() + 1, td.end()));  // also for a table of 0 rows
    const std::string row = value(indices, row_size == 1 ? idx : idx + " / " + u(row_size));
    const std::string result = let(ctype(id), ctype(id) + "(0)");
    body += "  if (" + row + " >= 0 && " + row + " < " + std::to_string(rows) + ") {\n";
    scoped([&] {
      const std::string at = "uint(" + row + ")" + (row_size == 1 ? "" : " * " + u(row_size) + " + " + idx + " % " + u(row_size));
      body += "  " + result + " = " + value(table, at) + ";\n";
    });
    body += "  }\n";
    return result;
  }

  const graph& g_;
  const plan& p_;
  bool vec4_;
  int next_ = 0;
  std::map<std::pair<node_id, std::string>, std::string> cse_;
  std::map<std::string, std::string> index_cse_;
  std::map<node_id, std::string> fixed_;
};

/// Nodes computed inline in the expression of `root` (stops at materialised nodes), plus the
/// materialised ones it reads.
void inline_nodes(const graph& g, const plan& p, node_id root, node_id stop, std::vector<node_id>& out) {
  std::vector<node_id> stack{root};
  std::vector<bool> seen(static_cast<size_t>(g.size()), false);
  while (!stack.empty()) {
    node_id id = stack.back();
    stack.pop_back();
    if (seen[id]) continue;
    seen[id] = true;
    out.push_back(id);
    if (id == stop || ((p.materialised[id] || is_splat(g[id])) && id != root)) continue;
    for (auto in : g[id].inputs) stack.push_back(in);
  }
}

/// vec4 elementwise needs every value f32 or i32, every read at the output's own index, and a
/// length divisible by 4.
/// A splat constant, possibly broadcast or reshaped: the same value at every index.
bool is_uniform(const graph& g, node_id id) {
  const node& n = g[id];
  if (is_splat(n)) return true;
  return (n.op == op_kind::broadcast || n.op == op_kind::reshape) && is_uniform(g, n.inputs[0]);
}

bool vectorisable(const graph& g, const plan& p, node_id root) {
  if (element_count(g[root].dims) % 4 != 0) return false;
  std::vector<node_id> nodes;
  inline_nodes(g, p, root, -1, nodes);
  for (auto id : nodes) {
    const node& n = g[id];
    if (n.type != dtype::f32 && n.type != dtype::i32) return false;
    if (id != root && (p.materialised[id] || is_splat(n))) continue;
    if (!is_elementwise(n.op) && n.op != op_kind::reshape && !is_uniform(g, id)) return false;
    if ((n.op == op_kind::div || n.op == op_kind::pow) && n.type == dtype::i32) return false;
    if (n.op == op_kind::pow && g[n.inputs[0]].type == dtype::i32) return false;
  }
  return true;
}

/// One storage buffer: binding b holds node `id`; binding 0 is the one written.
std::string buffer_decl(const graph& g, node_id id, size_t b, bool vec4, size_t writes = 1) {
  const dtype t = g[id].type;
  std::string ty = t == dtype::i32 ? (vec4 ? "ivec4" : "int") : (t == dtype::f32 ? (vec4 ? "vec4" : "float") : "uint16_t");
  return "layout(std430, binding = " + std::to_string(b) + ") " + (b < writes ? "" : "readonly ") + "restrict buffer B" +
         std::to_string(b) + " { " + ty + " v[]; } b" + std::to_string(b) + ";\n";
}

std::string buffer_decls(const graph& g, const std::vector<node_id>& bindings, bool all_vec4,
                         size_t vec4_from = SIZE_MAX, size_t vec4_to = 0, size_t writes = 1) {
  std::string s;
  for (size_t b = 0; b < bindings.size(); ++b)
    s += buffer_decl(g, bindings[b], b, all_vec4 || (b >= vec4_from && b < vec4_to), writes);
  return s;
}

std::string header(const graph& g, const std::vector<node_id>& bindings, bool subgroups, uint32_t local_size) {
  std::string s = "#version 450\n";
  bool has16 = false;
  for (auto id : bindings)
    if (id < g.size()) has16 = has16 || g[id].type == dtype::f16 || g[id].type == dtype::bf16;
  if (has16) s += "#extension GL_EXT_shader_16bit_storage : require\n";
  if (subgroups) s += "#extension GL_KHR_shader_subgroup_basic : require\n#extension GL_KHR_shader_subgroup_arithmetic : require\n";
  s += "#extension GL_EXT_control_flow_attributes : require\n";
  s += "layout(local_size_x = " + std::to_string(local_size) + ") in;\n";
  return s;
}

uint32_t groups_for(int64_t items, int64_t per_group, uint32_t cap) {
  const int64_t n = (items + per_group - 1) / per_group;
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, cap));
}

uint64_t bytes_of(const graph& g, const std::vector<node_id>& bindings) {
  uint64_t b = 0;
  for (auto id : bindings)
    if (id < g.size()) b += static_cast<uint64_t>(element_count(g[id].dims)) * size_of(g[id].type);  // not scratch
  return b;
}

/// Accumulator init and combine for a reduction.
struct reduction_ops {
  std::string init;
  std::string combine(const std::string& acc, const std::string& v) const {
    if (is_max) return is_int ? "max(" + acc + ", " + v + ")" : "((isnan(" + v + ") || " + v + " > " + acc + ") ? " + v + " : " + acc + ")";
    return acc + " + " + v;
  }
  bool is_max = false, is_int = false;
};

reduction_ops reduction_of(const node& r) {
  reduction_ops ops;
  ops.is_max = r.op == op_kind::reduce_max;
  ops.is_int = r.type == dtype::i32;
  if (!ops.is_max) ops.init = ops.is_int ? "0" : "0.0";
  else ops.init = ops.is_int ? "(-2147483647 - 1)" : "uintBitsToFloat(0xff800000u)";
  return ops;
}


/// The kernel's own root is materialised, so value() would load it: compute it instead by
/// treating the root as inline while emitting its expression.
plan with_root_inline(const plan& p, node_id root) {
  plan q = p;
  q.materialised[root] = false;
  return q;
}

kernel_source elementwise(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const bool vec4 = vectorisable(g, q, k.root);
  const int64_t count = element_count(g[k.root].dims) / (vec4 ? 4 : 1);
  emitter e(g, q, vec4);
  e.bind(k.root);
  const std::string v = e.value(k.root, "i");
  const std::string body = e.body + e.store(k.root, "i", v);
  kernel_source s;
  s.name = std::string(vec4 ? "ew4_" : "ew_") + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(count, 256, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, vec4) + prelude +
           "void main() {\n  const uint stride = gl_NumWorkGroups.x * 256u;\n  for (uint i = gl_GlobalInvocationID.x; i < " +
           u(count) + "; i += stride) {\n" + body + "  }\n}\n";
  return s;
}

/// Epilogue: the value of the root once the anchor's value at `idx` is `acc`.
/// `value`, when given, receives the name holding the root's value (in scope right after the
/// returned statements).
std::string epilogue(emitter& e, const graph& g, const kernel& k, const std::string& idx, const std::string& acc,
                     std::string* value = nullptr) {
  const node_id anchor = k.anchor;
  std::string a = acc;
  if (g[anchor].type == dtype::f16) a = "mesh_round_f16(" + acc + ")";
  if (g[anchor].type == dtype::bf16) a = "mesh_round_bf16(" + acc + ")";
  std::string out;
  e.scoped([&] {
    e.seed(anchor, idx, a);
    const std::string v = e.value(k.root, idx);
    out = e.body;
    e.body.clear();
    out += e.store(k.root, idx, v);
    if (value) *value = v;
  });
  return out;
}

/// Reductions over leading axes (in = [red..., outs...]): 32 neighbouring outputs per workgroup,
/// read coalesced, with the reduced range split over 8 slices of threads and the slices combined
/// in shared memory. One thread per output would leave a GPU nearly idle when outputs are few.
kernel_source column_reduction(const graph& g, const plan& q, const kernel& k, const device_caps& caps, int64_t outs,
                               int64_t red) {
  const node& r = g[k.anchor];
  const node_id x = r.inputs[0];
  const auto ops = reduction_of(r);
  const std::string acc_t = ops.is_int ? "int" : "float";
  emitter e(g, q, false);
  e.bind(k.root);
  std::string inner;
  e.scoped([&] {
    const std::string v = e.value(x, "(o + r * " + u(outs) + ")");
    inner = e.body + "        acc = " + ops.combine("acc", v) + ";\n";
    e.body.clear();
  });
  std::string main;
  main += "  const uint c = gl_LocalInvocationID.x % 32u, sl = gl_LocalInvocationID.x / 32u;\n";
  main += "  for (uint og = gl_WorkGroupID.x * 32u; og < " + u(outs) + "; og += gl_NumWorkGroups.x * 32u) {\n";
  main += "    uint o = og + c;\n    " + acc_t + " acc = " + ops.init + ";\n";
  main += "    if (o < " + u(outs) + ") {\n      for (uint r = sl; r < " + u(red) + "; r += 8u) {\n" + inner + "      }\n    }\n";
  main += "    sh[sl][c] = acc;\n    barrier();\n";
  main += "    if (sl == 0u && o < " + u(outs) + ") {\n";
  main += "      for (uint s = 1u; s < 8u; ++s) acc = " + ops.combine("acc", "sh[s][c]") + ";\n";
  main += epilogue(e, g, k, "o", "acc") + "    }\n    barrier();\n  }\n";
  kernel_source s;
  s.name = "redc_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(outs, 32, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + "shared " + acc_t + " sh[8][32];\n" +
           prelude + "void main() {\n" + main + "}\n";
  return s;
}

/// Combines every thread's `acc` over the workgroup of `threads` (a power of two; in a fixed
/// order: results are reproducible) and opens a block in which thread 0 holds the result in
/// `acc`; the caller closes it and adds a barrier before `sh` is reused. Needs
/// `shared <acc type> sh[threads]`.
std::string workgroup_combine(const reduction_ops& ops, bool subgroups, uint32_t threads = 256) {
  std::string m;
  if (subgroups) {
    if (ops.is_max && !ops.is_int) {
      // subgroupMax of a NaN is undefined (lavapipe drops it); a float max propagates NaN, as
      // ops.combine and the reference do.
      m += "    const float nan_seen = subgroupMax(isnan(acc) ? 1.0 : 0.0);\n";
      m += "    acc = subgroupMax(isnan(acc) ? uintBitsToFloat(0xff800000u) : acc);\n";
      m += "    if (nan_seen > 0.0) acc = uintBitsToFloat(0x7fc00000u);\n";
    } else {
      m += std::string("    acc = ") + (ops.is_max ? "subgroupMax" : "subgroupAdd") + "(acc);\n";
    }
    m += "    if (gl_SubgroupInvocationID == 0u) sh[gl_SubgroupID] = acc;\n    barrier();\n";
    m += "    if (gl_LocalInvocationID.x == 0u) {\n      acc = " + ops.init +
         ";\n      for (uint s = 0u; s < gl_NumSubgroups; ++s) acc = " + ops.combine("acc", "sh[s]") + ";\n";
  } else {
    m += "    sh[gl_LocalInvocationID.x] = acc;\n    barrier();\n";
    m += "    for (uint s = " + u(threads / 2) + "; s > 0u; s >>= 1) {\n      if (gl_LocalInvocationID.x < s) sh[gl_LocalInvocationID.x] = " +
         ops.combine("sh[gl_LocalInvocationID.x]", "sh[gl_LocalInvocationID.x + s]") + ";\n      barrier();\n    }\n";
    m += "    if (gl_LocalInvocationID.x == 0u) {\n      acc = sh[0];\n";
  }
  return m;
}

/// Offsets into a reduction's input: `base` of output o, `roff` of reduced element r.
struct reduction_offsets {
  std::string base, roff;
};

reduction_offsets offsets_of(const graph& g, node_id anchor, bool trailing) {
  const node& r = g[anchor];
  const shape& xd = g[r.inputs[0]].dims;
  const auto xs = strides_of(xd);
  std::vector<bool> reduced(xd.size(), false);
  for (auto a : r.attrs.axes) reduced[static_cast<size_t>(a)] = true;
  shape kept_dims, red_dims;
  std::vector<int64_t> kept_strides, red_strides;
  for (size_t a = 0; a < xd.size(); ++a) {
    (reduced[a] ? red_dims : kept_dims).push_back(xd[a]);
    (reduced[a] ? red_strides : kept_strides).push_back(xs[a]);
  }
  auto offset = [&](const std::string& idx, const shape& dims, const std::vector<int64_t>& strides) {
    std::vector<std::string> terms;
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d] != 1) terms.push_back(emitter::times(emitter::coord(idx, dims, d), strides[d]));
    return emitter::sum_terms(terms);
  };
  if (trailing) return {emitter::times("o", element_count(red_dims)), "r"};
  return {offset("o", kept_dims, kept_strides), offset("r", red_dims, red_strides)};
}

/// The statements that fold the input at reduced index `r` (of output o) into `acc`: the
/// prologue is evaluated inline.
std::string fold_input(emitter& e, const graph& g, const kernel& k, const reduction_ops& ops, const std::string& at,
                       const std::string& indent) {
  std::string inner;
  e.scoped([&] {
    const std::string v = e.value(g[k.anchor].inputs[0], at);
    inner = e.body + indent + "acc = " + ops.combine("acc", v) + ";\n";
    e.body.clear();
  });
  return inner;
}

/// The storage buffer of a split reduction's partials (binding b; written by pass 1).
std::string scratch_decl(const plan& p, const kernel& k, size_t b) {
  const bool is_int = p.scratch[static_cast<size_t>(k.scratch)].type == dtype::i32;
  return "layout(std430, binding = " + std::to_string(b) + ") " + (b == 0 ? "" : "readonly ") + "restrict buffer B" +
         std::to_string(b) + " { " + (is_int ? "int" : "float") + " v[]; } b" + std::to_string(b) + ";\n";
}

/// Buffer declarations of a split reduction's pass: graph nodes and its scratch buffer.
std::string split_decls(const graph& g, const plan& p, const kernel& k, const std::vector<node_id>& bindings) {
  std::string s;
  for (size_t b = 0; b < bindings.size(); ++b)
    s += bindings[b] < g.size() ? buffer_decl(g, bindings[b], b, false) : scratch_decl(p, k, b);
  return s;
}

/// Pass 1 of a split reduction: workgroup (o, s) folds slice s of output o's range (prologue
/// inline) into partial[o * slices + s] (rows) or partial[s * outputs + o] (columns: 32 outputs x
/// 8 interleaved sub-slices per workgroup, as in `redc`). No epilogue: pass 2 applies it.
kernel_source split_pass1(const graph& g, const plan& q, const kernel& k, const device_caps& caps, const reduction_layout& l) {
  const auto ops = reduction_of(g[k.anchor]);
  const std::string acc_t = ops.is_int ? "int" : "float";
  const int64_t len = slice_length(l.reduced, k.slices);
  emitter e(g, q, false);
  e.bind(scratch_id(g, k.scratch));  // binding 0: written
  const bool cols = l.columns(), subgroups = !cols && caps.subgroup_arithmetic;
  std::string main = "  for (uint s = gl_WorkGroupID.y; s < " + u(k.slices) + "; s += gl_NumWorkGroups.y) {\n";
  main += "  const uint r_begin = s * " + u(len) + ", r_end = min(r_begin + " + u(len) + ", " + u(l.reduced) + ");\n";
  std::string shared;
  if (cols) {
    shared = "shared " + acc_t + " sh[8][32];\n";
    const std::string inner = fold_input(e, g, k, ops, "(o + r * " + u(l.outputs) + ")", "        ");
    main += "  const uint c = gl_LocalInvocationID.x % 32u, sl = gl_LocalInvocationID.x / 32u;\n";
    main += "  for (uint og = gl_WorkGroupID.x * 32u; og < " + u(l.outputs) + "; og += gl_NumWorkGroups.x * 32u) {\n";
    main += "    uint o = og + c;\n    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    if (o < " + u(l.outputs) + ") {\n      for (uint r = r_begin + sl; r < r_end; r += 8u) {\n" + inner +
            "      }\n    }\n";
    main += "    sh[sl][c] = acc;\n    barrier();\n    if (sl == 0u && o < " + u(l.outputs) + ") {\n";
    main += "      for (uint t = 1u; t < 8u; ++t) acc = " + ops.combine("acc", "sh[t][c]") + ";\n";
    main += "      b0.v[s * " + u(l.outputs) + " + o] = acc;\n    }\n    barrier();\n  }\n";
  } else {
    shared = "shared " + acc_t + " sh[256];\n";
    const auto off = offsets_of(g, k.anchor, l.trailing);
    const std::string inner = fold_input(e, g, k, ops, "(base + " + off.roff + ")", "    ");
    main += "  for (uint o = gl_WorkGroupID.x; o < " + u(l.outputs) + "; o += gl_NumWorkGroups.x) {\n";
    main += "    uint base = " + off.base + ";\n    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    for (uint r = r_begin + gl_LocalInvocationID.x; r < r_end; r += 256u) {\n" + inner + "    }\n";
    main += workgroup_combine(ops, subgroups);
    main += "      b0.v[o * " + u(k.slices) + " + s] = acc;\n    }\n    barrier();\n  }\n";
  }
  main += "  }\n";
  kernel_source src;
  src.name = std::string(cols ? "redcs1_" : "reds1_") + std::to_string(k.root);
  src.bindings = e.bindings;
  const int64_t x_groups = cols ? (l.outputs + 31) / 32 : l.outputs;
  src.groups = {static_cast<uint32_t>(std::clamp<int64_t>(x_groups, 1, caps.max_groups[0])),
                static_cast<uint32_t>(std::clamp<int64_t>(k.slices, 1, caps.max_groups[1])), 1};
  src.bytes = bytes_of(g, src.bindings) + static_cast<uint64_t>(k.slices * l.outputs) * 4;
  src.glsl = header(g, src.bindings, subgroups, 256) + split_decls(g, q, k, src.bindings) + shared + prelude +
             "void main() {\n" + main + "}\n";
  return src;
}

/// Pass 2 of a split reduction: combines each output's partials in slice order (a workgroup per
/// output for rows, a thread per output for columns: reads coalesced either way) and applies the
/// epilogue.
kernel_source split_pass2(const graph& g, const plan& q, const kernel& k, const device_caps& caps, const reduction_layout& l) {
  const auto ops = reduction_of(g[k.anchor]);
  const std::string acc_t = ops.is_int ? "int" : "float";
  emitter e(g, q, false);
  e.bind(k.root);
  const std::string part = "b" + std::to_string(e.bind(scratch_id(g, k.scratch))) + ".v";
  const bool cols = l.columns(), subgroups = !cols && caps.subgroup_arithmetic;
  std::string main, shared;
  if (cols) {
    main += "  for (uint o = gl_GlobalInvocationID.x; o < " + u(l.outputs) + "; o += gl_NumWorkGroups.x * 256u) {\n";
    main += "    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    for (uint s = 0u; s < " + u(k.slices) + "; ++s) acc = " +
            ops.combine("acc", part + "[s * " + u(l.outputs) + " + o]") + ";\n";
    main += epilogue(e, g, k, "o", "acc") + "  }\n";
  } else {
    shared = "shared " + acc_t + " sh[256];\n";
    main += "  for (uint o = gl_WorkGroupID.x; o < " + u(l.outputs) + "; o += gl_NumWorkGroups.x) {\n";
    main += "    " + acc_t + " acc = " + ops.init + ";\n";
    main += "    for (uint s = gl_LocalInvocationID.x; s < " + u(k.slices) + "; s += 256u) acc = " +
            ops.combine("acc", part + "[o * " + u(k.slices) + " + s]") + ";\n";
    main += workgroup_combine(ops, subgroups);
    main += epilogue(e, g, k, "o", "acc") + "    }\n    barrier();\n  }\n";
  }
  kernel_source src;
  src.name = std::string(cols ? "redcs2_" : "reds2_") + std::to_string(k.root);
  src.bindings = e.bindings;
  src.groups = {cols ? groups_for(l.outputs, 256, caps.max_groups[0])
                     : static_cast<uint32_t>(std::clamp<int64_t>(l.outputs, 1, caps.max_groups[0])),
                1, 1};
  src.bytes = bytes_of(g, src.bindings) + static_cast<uint64_t>(k.slices * l.outputs) * 4;
  src.glsl = header(g, src.bindings, subgroups, 256) + split_decls(g, q, k, src.bindings) + shared + prelude +
             "void main() {\n" + main + "}\n";
  return src;
}

kernel_source reduction(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  if (k.pass == 1) return split_pass1(g, q, k, caps, layout_of(g, k.anchor));
  if (k.pass == 2) return split_pass2(g, q, k, caps, layout_of(g, k.anchor));
  // The plan's split decision reads the same layout (reduction_layout::columns / per_group).
  const reduction_layout l = layout_of(g, k.anchor);
  const int64_t outs = l.outputs, red = l.reduced;
  if (l.columns()) return column_reduction(g, q, k, caps, outs, red);
  const bool per_group = l.per_group();

  emitter e(g, q, false);
  e.bind(k.root);
  const auto off = offsets_of(g, k.anchor, l.trailing);
  const auto ops = reduction_of(g[k.anchor]);
  const std::string acc_t = ops.is_int ? "int" : "float";
  const std::string inner = fold_input(e, g, k, ops, "(base + " + off.roff + ")", "    ");
  std::string main;
  const std::string loop_o = per_group ? "for (uint o = gl_WorkGroupID.x; o < " + u(outs) + "; o += gl_NumWorkGroups.x)"
                                       : "for (uint o = gl_GlobalInvocationID.x; o < " + u(outs) +
                                             "; o += gl_NumWorkGroups.x * 256u)";
  main += "  " + loop_o + " {\n    uint base = " + off.base + ";\n    " + acc_t + " acc = " + ops.init + ";\n";
  main += per_group ? "    for (uint r = gl_LocalInvocationID.x; r < " + u(red) + "; r += 256u) {\n"
                    : "    for (uint r = 0u; r < " + u(red) + "; ++r) {\n";
  main += inner + "    }\n";
  const bool subgroups = per_group && caps.subgroup_arithmetic;
  std::string shared;
  if (per_group) {
    shared = "shared " + acc_t + " sh[256];\n";
    main += workgroup_combine(ops, subgroups);
    main += epilogue(e, g, k, "o", "acc") + "    }\n    barrier();\n";
  } else {
    main += epilogue(e, g, k, "o", "acc");
  }
  main += "  }\n";

  kernel_source s;
  s.name = std::string(per_group ? "redg_" : "redt_") + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {per_group ? static_cast<uint32_t>(std::clamp<int64_t>(outs, 1, caps.max_groups[0]))
                        : groups_for(outs, 256, caps.max_groups[0]),
              1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, subgroups, 256) + buffer_decls(g, s.bindings, false) + shared + prelude +
           "void main() {\n" + main + "}\n";
  return s;
}

/// A kernel_kind::rows kernel: one workgroup per row (grid-stride over rows). For each row, every
/// reduction member folds the row (its prologue inline) and combines it over the workgroup;
/// thread 0 applies the member's epilogue, stores its result and shares it through shared
/// memory, and later members use that register value wherever they read the result (the plan
/// checked they read it only at their own row). The elementwise member, if any, then writes the
/// row. A row is read from memory once; its later passes hit the cache.
kernel_source rows_kernel(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  plan q = p;
  for (const auto& m : k.members) q.materialised[m.root] = false;  // computed here, never loaded
  const shape& rows = g[g[k.members.front().anchor].inputs[0]].dims;
  const int64_t len = rows.back(), count = element_count(rows) / len;
  uint32_t threads = 64;  // a power of two, up to 256, near the row length
  while (threads < 256 && threads < len) threads *= 2;
  const bool subgroups = caps.subgroup_arithmetic;
  emitter e(g, q, false);
  for (const auto& m : k.members) e.bind(m.root);
  const std::string t = u(threads);
  std::string main = "  const uint lid = gl_LocalInvocationID.x;\n";
  main += "  for (uint o = gl_WorkGroupID.x; o < " + u(count) + "; o += gl_NumWorkGroups.x) {\n";
  main += "    const uint base = o * " + u(len) + ";\n";
  size_t results = 0;
  for (const auto& m : k.members) {
    if (m.kind == kernel_kind::elementwise) {
      std::string body;
      e.scoped([&] {
        const std::string v = e.value(m.root, "i");
        body = e.body + e.store(m.root, "i", v);
        e.body.clear();
      });
      main += "    for (uint r = lid; r < " + u(len) + "; r += " + t + ") {\n      const uint i = base + r;\n" + body + "    }\n";
      continue;
    }
    const auto ops = reduction_of(g[m.anchor]);
    main += "    {\n    float acc = " + ops.init + ";\n";
    main += "    for (uint r = lid; r < " + u(len) + "; r += " + t + ") {\n" + fold_input(e, g, m, ops, "(base + r)", "      ") +
            "    }\n";
    main += workgroup_combine(ops, subgroups, threads);
    const std::string slot = "shv[" + std::to_string(results) + "]";
    std::string v;
    main += epilogue(e, g, m, "o", "acc", &v) + "      " + slot + " = " + v + ";\n";
    main += "    }\n    barrier();\n    }\n";
    const std::string var = "rv" + std::to_string(results++);
    main += "    const float " + var + " = " + slot + ";\n";
    e.fix(m.root, var);
  }
  main += "    barrier();  // sh and shv are rewritten for the next row\n  }\n";

  kernel_source s;
  s.name = "rows" + std::to_string(k.members.size()) + "_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.writes = k.members.size();
  s.groups = {static_cast<uint32_t>(std::clamp<int64_t>(count, 1, caps.max_groups[0])), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, subgroups, threads) + buffer_decls(g, s.bindings, false, SIZE_MAX, 0, s.writes) +
           "shared float sh[" + t + "];\nshared float shv[" + std::to_string(std::max<size_t>(results, 1)) + "];\n" +
           prelude + "void main() {\n" + main + "}\n";
  return s;
}

/// `float name(uint xi)`: the value of `operand` at flat index xi (prologue index arithmetic).
std::string loader(emitter& e, const std::string& name, node_id operand) {
  std::string f;
  e.scoped([&] {
    const std::string v = e.value(operand, "xi");
    f = "float " + name + "(uint xi) {\n" + e.body + "  return float(" + v + ");\n}\n";
    e.body.clear();
  });
  return f;
}

/// The first f16 matmul on tensor cores through GL_NV_cooperative_matrix, kept for shapes the
/// tiled one does not take (k or n not a multiple of 8) and kernel_variants::coopmat "64": 64x64 block tiles
/// staged in shared memory (f16vec2 loads), four subgroups each multiplying 2x2 fragments of 16x16x16 with
/// f32 accumulation, then the accumulators go through shared memory so the epilogue runs per
/// element like everywhere else. nullopt when it does not apply.
std::optional<kernel_source> matmul_coopmat(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const node& mm = g[k.anchor];
  const node_id a = mm.inputs[0], b = mm.inputs[1];
  const shape& ad = g[a].dims;
  const size_t rank = ad.size();
  const int64_t m = ad[rank - 2], kd = ad[rank - 1], n = mm.dims[rank - 1];
  const int64_t batch = m * n != 0 ? element_count(mm.dims) / (m * n) : 0;
  if (!caps.coopmat_f16 || !q.materialised[a] || !q.materialised[b] || a == b) return std::nullopt;
  if (g[a].type != dtype::f16 || g[b].type != dtype::f16 || kd % 2 != 0 || n % 2 != 0 || kd == 0 || batch == 0)
    return std::nullopt;
  std::vector<node_id> epi;
  inline_nodes(g, q, k.root, k.anchor, epi);
  if (std::count(epi.begin(), epi.end(), a) || std::count(epi.begin(), epi.end(), b)) return std::nullopt;

  emitter e(g, q, false);
  e.bind(k.root);
  e.bind(a);
  e.bind(b);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "Cs[li]"); });
  const std::string frag16 = "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>", frag32 = "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>";
  std::string decl;
  for (size_t i = 0; i < e.bindings.size(); ++i)
    decl += i == 1 || i == 2 ? "layout(std430, binding = " + std::to_string(i) + ") readonly restrict buffer B" +
                                   std::to_string(i) + " { f16vec2 v[]; } b" + std::to_string(i) + ";\n"
                             : buffer_decl(g, e.bindings[i], i, false);
  std::string src;
  src += "shared float16_t As[64 * 40];\nshared float16_t Bs[32 * 72];\nshared float Cs[64 * 64];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, warp = gl_SubgroupID, wm = warp / 2u, wn = warp % 2u;\n";
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  src += "  for (uint by = gl_WorkGroupID.y; by < " + u((m + 63) / 64) + "; by += gl_NumWorkGroups.y)\n";
  src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u((n + 63) / 64) + "; bx += gl_NumWorkGroups.x) {\n";
  src += "    const uint m0 = by * 64u, n0 = bx * 64u;\n";
  src += "    " + frag32 + " acc[2][2];\n";
  src += "    [[unroll]] for (uint i = 0u; i < 2u; ++i) [[unroll]] for (uint j = 0u; j < 2u; ++j) acc[i][j] = " + frag32 + "(0.0);\n";
  src += "    for (uint k0 = 0u; k0 < " + u(kd) + "; k0 += 32u) {\n";
  src += "      [[unroll]] for (uint l = 0u; l < 8u; ++l) {\n";
  src += "        uint el = tid + l * 128u, r = el / 16u, c = el % 16u, gm = m0 + r, gk = k0 + c * 2u;\n";
  src += "        f16vec2 v = (gm < " + u(m) + " && gk < " + u(kd) + ") ? b1.v[(bz * " + u(m * kd) + " + gm * " + u(kd) +
         " + gk) >> 1] : f16vec2(0.0);\n";
  src += "        As[r * 40u + c * 2u] = v.x;\n        As[r * 40u + c * 2u + 1u] = v.y;\n      }\n";
  src += "      [[unroll]] for (uint l = 0u; l < 8u; ++l) {\n";
  src += "        uint el = tid + l * 128u, r = el / 32u, c = el % 32u, gk = k0 + r, gn = n0 + c * 2u;\n";
  src += "        f16vec2 v = (gk < " + u(kd) + " && gn < " + u(n) + ") ? b2.v[(bz * " + u(kd * n) + " + gk * " + u(n) +
         " + gn) >> 1] : f16vec2(0.0);\n";
  src += "        Bs[r * 72u + c * 2u] = v.x;\n        Bs[r * 72u + c * 2u + 1u] = v.y;\n      }\n";
  src += "      barrier();\n";
  src += "      [[unroll]] for (uint kk = 0u; kk < 32u; kk += 16u) {\n";
  src += "        " + frag16 + " fa[2];\n        " + frag16 + " fb[2];\n";
  src += "        [[unroll]] for (uint i = 0u; i < 2u; ++i) coopMatLoadNV(fa[i], As, (wm * 32u + i * 16u) * 40u + kk, 40u, false);\n";
  src += "        [[unroll]] for (uint j = 0u; j < 2u; ++j) coopMatLoadNV(fb[j], Bs, kk * 72u + wn * 32u + j * 16u, 72u, false);\n";
  src += "        [[unroll]] for (uint i = 0u; i < 2u; ++i) [[unroll]] for (uint j = 0u; j < 2u; ++j) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);\n";
  src += "      }\n      barrier();\n    }\n";
  src += "    [[unroll]] for (uint i = 0u; i < 2u; ++i) [[unroll]] for (uint j = 0u; j < 2u; ++j)\n";
  src += "      coopMatStoreNV(acc[i][j], Cs, (wm * 32u + i * 16u) * 64u + wn * 32u + j * 16u, 64u, false);\n";
  src += "    barrier();\n";
  src += "    for (uint li = tid; li < 4096u; li += 128u) {\n";
  src += "      uint gm = m0 + li / 64u, gn = n0 + li % 64u;\n";
  src += "      if (gm >= " + u(m) + " || gn >= " + u(n) + ") continue;\n";
  src += "      uint ci = bz * " + u(m * n) + " + gm * " + u(n) + " + gn;\n";
  src += store + "    }\n    barrier();\n  }\n}\n";

  kernel_source s;
  s.name = "mmcoop_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, 64, caps.max_groups[0]), groups_for(m, 64, caps.max_groups[1]), groups_for(batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  std::string head = "#version 450\n#extension GL_EXT_shader_16bit_storage : require\n"
                     "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
                     "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n"
                     "#extension GL_KHR_shader_subgroup_basic : require\n#extension GL_EXT_control_flow_attributes : require\n"
                     "layout(local_size_x = 128) in;\n";
  s.glsl = head + decl + prelude + src;
  return s;
}

/// The problem of one matmul kernel: c[batch][m][n] = a[batch][m][kd] x b[batch][kd][n].
struct mm_dims {
  node_id a = 0, b = 0;
  int64_t m = 0, kd = 0, n = 0, batch = 0;
  double flops() const {
    return 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  }
};

mm_dims dims_of(const graph& g, const kernel& k) {
  const node& mm = g[k.anchor];
  mm_dims d;
  d.a = mm.inputs[0];
  d.b = mm.inputs[1];
  const shape& ad = g[d.a].dims;
  const size_t rank = ad.size();
  d.m = ad[rank - 2];
  d.kd = ad[rank - 1];
  d.n = mm.dims[rank - 1];
  d.batch = d.m * d.n != 0 ? element_count(mm.dims) / (d.m * d.n) : 0;
  return d;
}

/// A matmul operand read straight from a buffer: the materialised node `id`, whose consecutive
/// batch matrices are `batch_stride` elements apart (0: one matrix broadcast over the batch, like
/// a weight in x[b, t, c] x w[c, d]).
struct operand_view {
  node_id id = 0;
  int64_t batch_stride = 0;
};

/// The buffer behind matmul operand `x` when it is materialised, or a broadcast of a
/// materialised matrix over batch axes only; nullopt when it needs index arithmetic.
std::optional<operand_view> direct_operand(const graph& g, const plan& q, node_id x) {
  const shape& xd = g[x].dims;
  const int64_t matrix = xd[xd.size() - 2] * xd[xd.size() - 1];
  if (q.materialised[x]) return operand_view{x, matrix};
  if (g[x].op != op_kind::broadcast) return std::nullopt;
  const node_id src = g[x].inputs[0];
  const shape& sd = g[src].dims;
  if (!q.materialised[src] || sd.size() < 2 || element_count(sd) != matrix || sd[sd.size() - 2] != xd[xd.size() - 2] ||
      sd[sd.size() - 1] != xd[xd.size() - 1])
    return std::nullopt;
  return operand_view{src, 0};
}

/// Whether `operand` is read by the kernel's epilogue or by the inline expression of `other`:
/// such an operand cannot be bound as a vector array (the other readers index it as scalars).
bool read_elsewhere(const graph& g, const plan& q, const kernel& k, node_id operand, node_id other) {
  std::vector<node_id> seen;
  inline_nodes(g, q, k.root, k.anchor, seen);
  inline_nodes(g, q, other, -1, seen);
  return operand == other || std::count(seen.begin(), seen.end(), operand) > 0;
}

/// The flat index, in the materialised node it re-indexes, of element `idx` of `x` when `x` reaches
/// one buffer through reshape, broadcast, permute and slice only (the emitter's index arithmetic,
/// evaluated for one index); nullopt for anything else.
std::optional<int64_t> source_index(const graph& g, const plan& q, node_id x, int64_t idx) {
  while (!q.materialised[x]) {
    const node& n = g[x];
    if (n.op == op_kind::broadcast || n.op == op_kind::permute || n.op == op_kind::slice)
      idx = movement_index(n, g[n.inputs[0]].dims)(idx);
    else if (n.op != op_kind::reshape)  // a reshape keeps the flat index
      return std::nullopt;
    x = n.inputs[0];
  }
  return idx;
}

/// Whether matmul operand `x` ([..., r, c]) is laid out column by column in memory: stepping r,
/// not c, moves to the next element (a transposed weight, x^T in a gradient). The tiled matmuls
/// then let consecutive threads walk r so that their loads stay coalesced.
bool column_major(const graph& g, const plan& q, node_id x) {
  const shape& xd = g[x].dims;
  if (xd.size() < 2 || xd[xd.size() - 2] < 2 || xd[xd.size() - 1] < 2) return false;
  const auto first = source_index(g, q, x, 0), next_c = source_index(g, q, x, 1),
             next_r = source_index(g, q, x, xd[xd.size() - 1]);
  return first && next_c && next_r && *next_c - *first != 1 && *next_r - *first == 1;
}

/// Block shape of the warp-tiled f32 matmul. 256 threads form 8 "warps" of 32 (NVIDIA's
/// subgroups; elsewhere only a numbering of threads, so any subgroup size is correct) in a 4 x 2
/// grid. A warp's lanes form a 4 x 8 grid and each lane owns rm x rn blocks of 4x4 outputs,
/// the blocks of a warp interleaved: a warp's vec4 reads of one shared row are then 4 (A) and 8
/// (B) consecutive vec4s, conflict-free, and its stores cover whole 128-byte rows.
struct warp_tile {
  int64_t rm = 2, rn = 2, bk = 8;  ///< 4x4 blocks per lane along m and n; depth of a shared tile
  int64_t wtm() const { return 4 * 4 * rm; }  ///< warp tile: 4 lanes along m
  int64_t wtn() const { return 8 * 4 * rn; }  ///< 8 lanes along n
  int64_t bm() const { return 4 * wtm(); }     ///< 4 warps along m
  int64_t bn() const { return 2 * wtn(); }     ///< 2 warps along n
  bool b_padded = false;  ///< B rows padded by one vec4 (B stored by k-walking threads)
  int64_t b_row() const { return bn() / 4 + (b_padded ? 1 : 0); }  ///< vec4 per shared B row
  /// Two stages of A (transposed, rows padded by one vec4) and B tiles.
  int64_t shared_bytes() const { return 2 * bk * (bm() / 4 + 1) * 16 + 2 * bk * b_row() * 16; }
};

/// The tile loops of the tiled matmuls (grid-stride over batch, tile rows, tile columns), ending
/// with `m0` and `n0`, the tile's first row and column. With `swizzle` = G > 1 the (tile row,
/// tile column) pair the hardware enumerates row-major is remapped, as a bijection of the tile
/// grid, to walk G tile rows down a column before the next column (the last group has the
/// remaining rows), so workgroups running at the same time share A and B tiles in L2.
std::string tile_loops(int64_t batch, int64_t m, int64_t n, int64_t bm, int64_t bn, uint32_t swizzle) {
  const int64_t tm = (m + bm - 1) / bm, tn = (n + bn - 1) / bn;
  std::string src;
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  if (swizzle <= 1 || tm <= 1 || tn <= 1) {
    src += "  for (uint by = gl_WorkGroupID.y; by < " + u(tm) + "; by += gl_NumWorkGroups.y)\n";
    src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u(tn) + "; bx += gl_NumWorkGroups.x) {\n";
  } else {
    const int64_t g = swizzle, group = g * tn;
    src += "  for (uint ry = gl_WorkGroupID.y; ry < " + u(tm) + "; ry += gl_NumWorkGroups.y)\n";
    src += "  for (uint rx = gl_WorkGroupID.x; rx < " + u(tn) + "; rx += gl_NumWorkGroups.x) {\n";
    src += "    const uint lin = ry * " + u(tn) + " + rx, grp = lin / " + u(group) + ", first = grp * " + u(g) +
           ", rows = min(" + u(g) + ", " + u(tm) + " - first), rem = lin - grp * " + u(group) + ";\n";
    src += "    const uint by = first + rem % rows, bx = rem / rows;\n";
  }
  src += "    const uint m0 = by * " + u(bm) + ", n0 = bx * " + u(bn) + ";\n";
  return src;
}

/// Picks the warp tile: 128x128 (8x8 per thread) when there are enough such tiles to fill a GPU,
/// else 64x64 (4x4 per thread); kernel_variants::gemm "warp16" doubles the tile depth, "wide"
/// uses 128x256 (8x16 per thread), "narrow" 128x64 (8x4 per thread, fewer registers). nullopt
/// when the device's shared memory is too small.
std::optional<warp_tile> pick_warp_tile(const mm_dims& d, const device_caps& caps) {
  warp_tile t;
  const bool big = ((d.m + 127) / 128) * ((d.n + 127) / 128) * d.batch >= 128;
  if (!big) t.rm = t.rn = 1;
  if (big && caps.variants.gemm == "wide") t.rn = 4;
  if (big && caps.variants.gemm == "narrow") t.rn = 1;
  if (caps.variants.gemm == "warp16") t.bk = 16;
  if (t.shared_bytes() > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;
  return t;
}

/// The warp-tiled f32 matmul (any operand type: loads go through the prologue loaders, B as
/// vec4 straight from its buffer when it is a materialised f32 tensor with n % 4 == 0).
/// Shared tiles are double-buffered: the next tile is loaded from global memory into registers
/// while the current one is multiplied, then stored to the other stage, with one barrier per
/// tile. All shared accesses are whole vec4s (component writes are read-modify-writes of a vec4
/// on some drivers, racing between threads).
std::optional<kernel_source> matmul_warp(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const mm_dims d = dims_of(g, k);
  const auto tile = pick_warp_tile(d, caps);
  if (!tile || d.kd == 0 || d.batch == 0) return std::nullopt;
  warp_tile t = *tile;
  const int64_t bm = t.bm(), bn = t.bn(), bk = t.bk, m = d.m, n = d.n, kd = d.kd;
  const std::string unroll = caps.unroll_loops ? "[[unroll]] " : "";
  const auto loop = [&](const char* var, int64_t count) {
    return unroll + "for (uint " + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };

  emitter e(g, q, false);
  e.bind(k.root);
  const std::string la = loader(e, "load_a", d.a);
  const auto bv = direct_operand(g, q, d.b);
  const bool b_vec4 = bv && g[bv->id].type == dtype::f32 && n % 4 == 0 && !read_elsewhere(g, q, k, bv->id, d.a);
  const int b_binding = b_vec4 ? e.bind(bv->id) : -1;
  const int64_t b_batch = b_vec4 ? bv->batch_stride : kd * n;
  const std::string lb = b_vec4 ? "" : loader(e, "load_b", d.b);
  // Operands laid out the other way (x^T, w^T through index arithmetic) are walked by
  // consecutive threads along their contiguous axis: A along m, B along k.
  const bool a_by_m = column_major(g, q, d.a);
  const bool b_by_k = !b_vec4 && column_major(g, q, d.b);
  t.b_padded = b_by_k;  // k-walking threads store down a column of Bs: padded rows spread the banks
  if (t.shared_bytes() > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[rm * 4u + i][rn][c]"); });

  // Global -> registers: A as groups of 4 rows at one k (consecutive threads along k read
  // neighbouring words of 4 rows; along m when A is column-major), B as 4 neighbouring columns at
  // one k (consecutive threads along n; along k when B is column-major).
  const int64_t a_items = bm / 4 * bk, b_items = bk * bn / 4;
  const int64_t a_per = (a_items + 255) / 256, b_per = (b_items + 255) / 256;
  const auto guard = [](int64_t items) { return items % 256 == 0 ? std::string() : "if (el < " + u(items) + ") "; };
  // Which (k, m/4) or (k, n/4) slot of a tile item `el` fills.
  const std::string a_k = a_by_m ? "el / " + u(bm / 4) : "el % " + u(bk), a_m4 = a_by_m ? "el % " + u(bm / 4) : "el / " + u(bk);
  const std::string b_k = b_by_k ? "el % " + u(bk) : "el / " + u(bn / 4), b_n4 = b_by_k ? "el / " + u(bk) : "el % " + u(bn / 4);
  auto fetch = [&](const std::string& kb) {
    std::string f;
    f += "      " + loop("l", a_per) + "{\n        uint el = tid + l * 256u, gm = m0 + (" + a_m4 + ") * 4u, gk = " + kb +
         " + " + a_k + ";\n        vec4 v = vec4(0.0);\n";
    f += "        " + guard(a_items) + "if (gk < " + u(kd) + ") {\n          uint base = bz * " + u(m * kd) + " + gm * " + u(kd) +
         " + gk;\n";
    f += "          " + loop("r", 4) + "if (gm + r < " + u(m) + ") v[r] = load_a(base + r * " + u(kd) + ");\n        }\n";
    f += "        ga[l] = v;\n      }\n";
    f += "      " + loop("l", b_per) + "{\n        uint el = tid + l * 256u, gk = " + kb + " + " + b_k + ", gn = n0 + (" + b_n4 +
         ") * 4u, base = bz * " + u(b_batch) + " + gk * " + u(n) + " + gn;\n";
    if (b_vec4) {
      std::string in_range = "gk < " + u(kd) + " && gn < " + u(n);
      if (b_items % 256 != 0) in_range = "el < " + u(b_items) + " && " + in_range;
      f += "        gb[l] = (" + in_range + ") ? b" + std::to_string(b_binding) + ".v[base >> 2] : vec4(0.0);\n";
    } else {
      f += "        vec4 v = vec4(0.0);\n        " + guard(b_items) + "if (gk < " + u(kd) + ") " + loop("c", 4) +
           "if (gn + c < " + u(n) + ") v[c] = load_b(base + c);\n        gb[l] = v;\n";
    }
    f += "      }\n";
    return f;
  };
  auto stash = [&](const std::string& stage) {
    std::string s;
    s += "      " + loop("l", a_per) + "{\n        uint el = tid + l * 256u;\n        " + guard(a_items) + "As[" + stage +
         "][" + a_k + "][" + a_m4 + "] = ga[l];\n      }\n";
    s += "      " + loop("l", b_per) + "{\n        uint el = tid + l * 256u;\n        " + guard(b_items) + "Bs[" + stage +
         "][" + b_k + "][" + b_n4 + "] = gb[l];\n      }\n";
    return s;
  };

  const int64_t tiles = (kd + bk - 1) / bk;
  std::string src;
  src += "shared vec4 As[2][" + std::to_string(bk) + "][" + std::to_string(bm / 4 + 1) + "];\n";
  src += "shared vec4 Bs[2][" + std::to_string(bk) + "][" + std::to_string(t.b_row()) + "];\n";
  src += la + lb;
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, warp = tid >> 5, lane = tid & 31u;\n";
  src += "  const uint wm = warp >> 1, wn = warp & 1u, lm = lane >> 3, ln = lane & 7u;\n";
  src += tile_loops(d.batch, m, n, bm, bn, caps.variants.gemm_swizzle);
  src += "    vec4 acc[" + std::to_string(4 * t.rm) + "][" + std::to_string(t.rn) + "];\n";
  src += "    " + loop("i", 4 * t.rm) + loop("j", t.rn) + "acc[i][j] = vec4(0.0);\n";
  src += "    vec4 ga[" + std::to_string(a_per) + "], gb[" + std::to_string(b_per) + "];\n";
  src += "    {\n" + fetch("0u") + stash("0") + "    }\n    barrier();\n";
  // One tile multiplied from shared stage `stage`.
  auto math = [&](const std::string& stage) {
    std::string m_;
    m_ += "      " + loop("kk", bk) + "{\n        vec4 ra[" + std::to_string(t.rm) + "], rb[" + std::to_string(t.rn) + "];\n";
    m_ += "        " + loop("rm", t.rm) + "ra[rm] = As[" + stage + "][kk][wm * " + u(t.wtm() / 4) + " + rm * 4u + lm];\n";
    m_ += "        " + loop("rn", t.rn) + "rb[rn] = Bs[" + stage + "][kk][wn * " + u(t.wtn() / 4) + " + rn * 8u + ln];\n";
    m_ += "        " + loop("rm", t.rm) + loop("i", 4) + loop("rn", t.rn) +
          "acc[rm * 4u + i][rn] = fma(vec4(ra[rm][i]), rb[rn], acc[rm * 4u + i][rn]);\n      }\n";
    return m_;
  };
  // The last tile is peeled off the loop so that its body (fetch tile t + 1, multiply tile t,
  // store) has no branches: measured 11% faster on the H100 (35.7 -> 39.8 TFLOP/s at 4096) than
  // guarding the fetch and the store inside the loop.
  src += "    for (uint t = 0u; t < " + u(tiles - 1) + "; ++t) {\n      const uint cur = t & 1u;\n      {\n" +
         fetch("(t + 1u) * " + u(bk)) + "      }\n" + math("cur") + stash("cur ^ 1u") + "      barrier();\n    }\n";
  src += math(u(tiles - 1) + " & 1u");
  src += "    " + loop("rm", t.rm) + loop("i", 4) + loop("rn", t.rn) + loop("c", 4) + "{\n";
  src += "      uint gm = m0 + wm * " + u(t.wtm()) + " + rm * 16u + lm * 4u + i, gn = n0 + wn * " + u(t.wtn()) +
         " + rn * 32u + ln * 4u + c;\n";
  src += "      if (gm >= " + u(m) + " || gn >= " + u(n) + ") continue;\n";
  src += "      uint ci = bz * " + u(m * n) + " + gm * " + u(n) + " + gn;\n";
  src += store + "    }\n  }\n}\n";

  kernel_source s;
  s.name = "mmw" + std::to_string(bm) + "x" + std::to_string(bn) + (bk == 8 ? "" : "k" + std::to_string(bk)) +
           (a_by_m ? "am" : "") + (b_by_k ? "bk" : "") + "_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]), groups_for(d.batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = d.flops();
  const size_t vb = b_vec4 ? static_cast<size_t>(b_binding) : SIZE_MAX;
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false, vb, vb + 1) + prelude + src;
  return s;
}

/// Block shape of the tiled cooperative-matrix f16 matmul: sgm x sgn subgroups of 32, each owning
/// fm x fn fragments of 16x16 f32 accumulators. Shared tiles are bk deep, two stages, stored as
/// uvec4 (8 halves) with every row padded by one uvec4, so that the 8 rows of a fragment load
/// (16 bytes each) fall in distinct banks (coopMatLoadNV takes one row stride, so an XOR swizzle
/// of rows cannot be expressed).
struct coop_tile {
  int64_t sgm = 2, sgn = 2, fm = 4, fn = 4, bk = 32;
  int64_t bm() const { return sgm * fm * 16; }
  int64_t bn() const { return sgn * fn * 16; }
  int64_t threads() const { return 32 * sgm * sgn; }
  int64_t a_stride() const { return bk / 8 + 1; }    ///< uvec4 per shared A row
  int64_t b_stride() const { return bn() / 8 + 1; }  ///< uvec4 per shared B row
  /// Two stages of A and B, plus a 16x16 f32 staging fragment per subgroup for the epilogue.
  int64_t shared_bytes() const { return 16 * 2 * (bm() * a_stride() + bk * b_stride()) + sgm * sgn * 256 * 4; }
};

/// Parses an explicit block shape, kernel_variants::coopmat "g<sgm>x<sgn>f<fm>x<fn>k<bk>"
/// ("g2x2f4x4k32" is the default big tile), for tuning on a new device. nullopt when `spec` is not
/// of that form or out of range.
std::optional<coop_tile> parse_coop_tile(const std::string& spec) {
  long v[5] = {0, 0, 0, 0, 0};
  int used = 0;
  if (std::sscanf(spec.c_str(), "g%ldx%ldf%ldx%ldk%ld%n", &v[0], &v[1], &v[2], &v[3], &v[4], &used) != 5 ||
      static_cast<size_t>(used) != spec.size())
    return std::nullopt;
  const coop_tile t{v[0], v[1], v[2], v[3], v[4]};
  const auto in = [](int64_t x, int64_t lo, int64_t hi) { return x >= lo && x <= hi; };
  if (!in(t.sgm, 1, 8) || !in(t.sgn, 1, 8) || t.sgm * t.sgn > 16 || !in(t.fm, 1, 8) || !in(t.fn, 1, 8) || !in(t.bk, 16, 64) ||
      t.bk % 16 != 0)
    return std::nullopt;
  return t;
}

/// 128x128 tiles of 4 subgroups (64x64 each) when there are enough of them to fill a GPU, else
/// 64x64 of 4 subgroups (32x32 each). kernel_variants::coopmat "s8" (8 subgroups of 64x32) and
/// "wide" (128x256, tiles 16 deep) are kept for comparison: both measured slower on the H100
/// (docs/gpu.md); an explicit shape (parse_coop_tile) applies to every problem size. nullopt when
/// the device's shared memory is too small.
std::optional<coop_tile> pick_coop_tile(const mm_dims& d, const device_caps& caps) {
  coop_tile t;
  const bool big = ((d.m + 127) / 128) * ((d.n + 127) / 128) * d.batch >= 128;
  if (auto spec = parse_coop_tile(caps.variants.coopmat)) t = *spec;
  else if (!big) t = {2, 2, 2, 2, 32};
  else if (caps.variants.coopmat == "s8") t = {2, 4, 4, 2, 32};
  else if (caps.variants.coopmat == "wide") t = {2, 4, 4, 4, 16};
  if (t.shared_bytes() > static_cast<int64_t>(caps.shared_memory_bytes)) return std::nullopt;
  return t;
}

/// f16 matmul on tensor cores (GL_NV_cooperative_matrix 16x16x16, f32 accumulation) with
/// 128-bit loads: operands bound as uvec4 arrays (k and n multiples of 8), tiles copied to shared
/// memory a uvec4 per thread and access, two shared stages with the next tile held in registers
/// while the current one is multiplied (one barrier per tile), fragments loaded from shared memory
/// with a padded stride. Each subgroup stages one accumulator fragment at a time in shared memory
/// so that the epilogue runs per element like everywhere else. nullopt when it does not apply.
std::optional<kernel_source> matmul_coopmat_tiled(const graph& g, const plan& q, const kernel& k, const device_caps& caps) {
  const mm_dims d = dims_of(g, k);
  const auto av = direct_operand(g, q, d.a), bv = direct_operand(g, q, d.b);
  if (!caps.coopmat_f16 || caps.variants.coopmat == "64" || !av || !bv) return std::nullopt;
  if (g[av->id].type != dtype::f16 || g[bv->id].type != dtype::f16 || d.kd % 8 != 0 || d.n % 8 != 0 || d.kd == 0 ||
      d.batch == 0)
    return std::nullopt;
  if (read_elsewhere(g, q, k, av->id, d.b) || read_elsewhere(g, q, k, bv->id, d.a)) return std::nullopt;
  const auto tile = pick_coop_tile(d, caps);
  if (!tile) return std::nullopt;
  const coop_tile t = *tile;
  const int64_t m = d.m, n = d.n, kd = d.kd, bm = t.bm(), bn = t.bn(), bk = t.bk, as = t.a_stride(), bs = t.b_stride();
  const int64_t threads = t.threads();

  emitter e(g, q, false);
  e.bind(k.root);
  e.bind(av->id);
  e.bind(bv->id);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "Cs[sg * 256u + li]"); });
  // Without an epilogue the f16 result of a whole tile goes from the accumulators to memory
  // directly (converted to f16 fragments: the same rounding as the per-element path), through a
  // float16_t view of binding 0 (two views of one buffer, so neither is `restrict`).
  const bool direct = k.root == k.anchor && g[k.root].type == dtype::f16;
  std::string decl;
  for (size_t i = 0; i < e.bindings.size(); ++i) {
    if (i == 1 || i == 2)
      decl += "layout(std430, binding = " + std::to_string(i) + ") readonly restrict buffer B" + std::to_string(i) +
              " { uvec4 v[]; } b" + std::to_string(i) + ";\n";
    else if (i == 0 && direct)
      decl += "layout(std430, binding = 0) buffer B0 { uint16_t v[]; } b0;\n"
              "layout(std430, binding = 0) buffer B0h { float16_t v[]; } c16;\n";
    else
      decl += buffer_decl(g, e.bindings[i], i, false);
  }

  const std::string frag16 = "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>", frag32 = "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>";
  const auto loop = [](const char* var, int64_t count) {
    return std::string("[[unroll]] for (uint ") + var + " = 0u; " + var + " < " + u(count) + "; ++" + var + ") ";
  };
  const int64_t a_items = bm * bk / 8, b_items = bk * bn / 8;
  const int64_t a_per = (a_items + threads - 1) / threads, b_per = (b_items + threads - 1) / threads;
  const auto guard = [&](int64_t items) { return items % threads == 0 ? std::string() : "el < " + u(items) + " && "; };
  auto fetch = [&](const std::string& kb) {
    std::string f;
    f += "      " + loop("l", a_per) + "{\n        uint el = tid + l * " + u(threads) + ", gm = m0 + el / " + u(bk / 8) +
         ", gk = " + kb + " + (el % " + u(bk / 8) + ") * 8u;\n";
    f += "        ga[l] = (" + guard(a_items) + "gm < " + u(m) + " && gk < " + u(kd) + ") ? b1.v[(bz * " + u(av->batch_stride) +
         " + gm * " + u(kd) + " + gk) >> 3] : uvec4(0u);\n      }\n";
    f += "      " + loop("l", b_per) + "{\n        uint el = tid + l * " + u(threads) + ", gk = " + kb + " + el / " +
         u(bn / 8) + ", gn = n0 + (el % " + u(bn / 8) + ") * 8u;\n";
    f += "        gb[l] = (" + guard(b_items) + "gk < " + u(kd) + " && gn < " + u(n) + ") ? b2.v[(bz * " + u(bv->batch_stride) +
         " + gk * " + u(n) + " + gn) >> 3] : uvec4(0u);\n      }\n";
    return f;
  };
  auto stash = [&](const std::string& stage) {
    const std::string ga = guard(a_items), gb = guard(b_items);
    std::string s;
    s += "      " + loop("l", a_per) + "{\n        uint el = tid + l * " + u(threads) + ";\n        " +
         (ga.empty() ? "" : "if (el < " + u(a_items) + ") ") + "As[(" + stage + ") * " + u(bm * as) + " + (el / " +
         u(bk / 8) + ") * " + u(as) + " + el % " + u(bk / 8) + "] = ga[l];\n      }\n";
    s += "      " + loop("l", b_per) + "{\n        uint el = tid + l * " + u(threads) + ";\n        " +
         (gb.empty() ? "" : "if (el < " + u(b_items) + ") ") + "Bs[(" + stage + ") * " + u(bk * bs) + " + (el / " +
         u(bn / 8) + ") * " + u(bs) + " + el % " + u(bn / 8) + "] = gb[l];\n      }\n";
    return s;
  };

  const int64_t tiles = (kd + bk - 1) / bk;
  std::string src;
  // One k tile multiplied from shared stage `stage`: per 16-deep step, each subgroup loads its
  // A and B fragments, then multiplies every pair.
  auto math = [&](const std::string& stage) {
    std::string m_;
    m_ += "      " + loop("kk", bk / 16) + "{\n        " + frag16 + " fa[" + std::to_string(t.fm) + "], fb[" + std::to_string(t.fn) + "];\n";
    m_ += "        " + loop("i", t.fm) + "coopMatLoadNV(fa[i], As, (" + stage + ") * " + u(bm * as) + " + (wm * " +
          u(t.fm * 16) + " + i * 16u) * " + u(as) + " + kk * 2u, " + u(as) + ", false);\n";
    m_ += "        " + loop("j", t.fn) + "coopMatLoadNV(fb[j], Bs, (" + stage + ") * " + u(bk * bs) + " + kk * " + u(16 * bs) +
          " + wn * " + u(t.fn * 2) + " + j * 2u, " + u(bs) + ", false);\n";
    m_ += "        " + loop("i", t.fm) + loop("j", t.fn) + "acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);\n      }\n";
    return m_;
  };

  src += "shared uvec4 As[" + std::to_string(2 * bm * as) + "];\nshared uvec4 Bs[" + std::to_string(2 * bk * bs) + "];\n";
  src += "shared float Cs[" + std::to_string(t.sgm * t.sgn * 256) + "];\n";
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;\n";
  src += "  const uint wm = sg / " + u(t.sgn) + ", wn = sg % " + u(t.sgn) + ";\n";
  src += tile_loops(d.batch, m, n, bm, bn, caps.variants.gemm_swizzle);
  src += "    " + frag32 + " acc[" + std::to_string(t.fm) + "][" + std::to_string(t.fn) + "];\n";
  src += "    " + loop("i", t.fm) + loop("j", t.fn) + "acc[i][j] = " + frag32 + "(0.0);\n";
  src += "    uvec4 ga[" + std::to_string(a_per) + "], gb[" + std::to_string(b_per) + "];\n";
  // The last tile is peeled off the loop so that its body (fetch tile t + 1 into registers,
  // multiply tile t, store the registers into the other stage, one barrier) has no branches:
  // measured 2-3% faster on the H100 than guarding the fetch and the store inside the loop.
  src += "    {\n" + fetch("0u") + stash("0u") + "    }\n    barrier();\n";
  src += "    for (uint t = 0u; t < " + u(tiles - 1) + "; ++t) {\n      const uint cur = t & 1u;\n      {\n" +
         fetch("(t + 1u) * " + u(bk)) + "      }\n" + math("cur") + stash("cur ^ 1u") + "      barrier();\n    }\n";
  src += math(u(tiles - 1) + " & 1u");
  if (direct) {
    const std::string full = (m % bm == 0 && n % bn == 0) ? "true" : "m0 + " + u(bm) + " <= " + u(m) + " && n0 + " + u(bn) + " <= " + u(n);
    src += "    if (" + full + ") {\n      " + loop("i", t.fm) + loop("j", t.fn) + "{\n";
    src += "        " + frag16 + " h = " + frag16 + "(acc[i][j]);\n";
    src += "        coopMatStoreNV(h, c16.v, bz * " + u(m * n) + " + (m0 + wm * " + u(t.fm * 16) + " + i * 16u) * " + u(n) +
           " + n0 + wn * " + u(t.fn * 16) + " + j * 16u, " + u(n) + ", false);\n      }\n      continue;\n    }\n";
  }
  src += "    " + loop("i", t.fm) + loop("j", t.fn) + "{\n";
  src += "      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);\n      subgroupMemoryBarrierShared();\n      subgroupBarrier();\n";
  src += "      " + loop("r", 8) + "{\n        uint li = lane + r * 32u, gm = m0 + wm * " + u(t.fm * 16) +
         " + i * 16u + li / 16u, gn = n0 + wn * " + u(t.fn * 16) + " + j * 16u + li % 16u;\n";
  src += "        if (gm < " + u(m) + " && gn < " + u(n) + ") {\n          uint ci = bz * " + u(m * n) + " + gm * " + u(n) +
         " + gn;\n" + store + "        }\n      }\n      subgroupMemoryBarrierShared();\n      subgroupBarrier();\n    }\n  }\n}\n";

  kernel_source s;
  s.name = "mmct" + std::to_string(bm) + "x" + std::to_string(bn) + "s" + std::to_string(t.sgm * t.sgn) +
           (bk == 32 ? "" : "k" + std::to_string(bk)) + "_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]), groups_for(d.batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = d.flops();
  const std::string head = "#version 450\n#extension GL_EXT_shader_16bit_storage : require\n"
                           "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
                           "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n"
                           "#extension GL_KHR_shader_subgroup_basic : require\n#extension GL_EXT_control_flow_attributes : require\n"
                           "layout(local_size_x = " + std::to_string(threads) + ") in;\n";
  s.glsl = head + decl + prelude + src;
  return s;
}

kernel_source matmul(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const node& mm = g[k.anchor];
  const node_id a = mm.inputs[0], b = mm.inputs[1];
  const shape& ad = g[a].dims;
  const size_t rank = ad.size();
  const int64_t m = ad[rank - 2], kd = ad[rank - 1], n = mm.dims[rank - 1];
  const int64_t batch = m * n != 0 ? element_count(mm.dims) / (m * n) : 0;
  // Big tiles only when there are enough of them to fill the device; both fit in 16 KiB of
  // shared memory.
  const bool big = ((m + 127) / 128) * ((n + 127) / 128) * batch >= 128 && caps.shared_memory_bytes >= 16384;
  if (auto coop = matmul_coopmat_tiled(g, q, k, caps)) return *coop;
  if (auto coop = matmul_coopmat(g, q, k, caps)) return *coop;
  if (caps.variants.gemm != "classic")
    if (auto warp = matmul_warp(g, q, k, caps)) return *warp;
  const int64_t bm = big ? 128 : 64, bn = bm, bk = 16, tm = big ? 8 : 4, tn = tm;
  const std::string unroll = caps.unroll_loops ? "[[unroll]] " : "";
  const int64_t tx = bn / tn;

  emitter e(g, q, false);
  e.bind(k.root);
  const std::string la = loader(e, "load_a", a), lb = loader(e, "load_b", b);
  std::string store;
  e.scoped([&] { store = epilogue(e, g, k, "ci", "acc[i][j]"); });

  std::string src;
  // As is stored transposed (As[k][m]): 16 threads write one m column at once, so each k row is
  // padded by one float to put those writes in 16 different banks.
  src += "shared float As[" + std::to_string(bk) + "][" + std::to_string(bm + 1) + "];\n";
  src += "shared float Bs[" + std::to_string(bk) + "][" + std::to_string(bn) + "];\n";
  src += la + lb;
  src += "void main() {\n  const uint tid = gl_LocalInvocationID.x, tx = tid % " + u(tx) + ", ty = tid / " + u(tx) + ";\n";
  src += "  for (uint bz = gl_WorkGroupID.z; bz < " + u(batch) + "; bz += gl_NumWorkGroups.z)\n";
  src += "  for (uint by = gl_WorkGroupID.y; by < " + u((m + bm - 1) / bm) + "; by += gl_NumWorkGroups.y)\n";
  src += "  for (uint bx = gl_WorkGroupID.x; bx < " + u((n + bn - 1) / bn) + "; bx += gl_NumWorkGroups.x) {\n";
  src += "    const uint m0 = by * " + u(bm) + ", n0 = bx * " + u(bn) + ";\n";
  src += "    float acc[" + std::to_string(tm) + "][" + std::to_string(tn) + "];\n";
  src += "    " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) acc[i][j] = 0.0;\n";
  src += "    for (uint k0 = 0u; k0 < " + u(kd) + "; k0 += " + u(bk) + ") {\n";
  src += "      " + unroll + "for (uint l = 0u; l < " + u(bm * bk / 256) + "; ++l) {\n";
  src += "        uint el = tid + l * 256u, kk = el % " + u(bk) + ", mm = el / " + u(bk) + ", gm = m0 + mm, gk = k0 + kk;\n";
  src += "        As[kk][mm] = (gm < " + u(m) + " && gk < " + u(kd) + ") ? load_a(bz * " + u(m * kd) + " + gm * " + u(kd) +
         " + gk) : 0.0;\n      }\n";
  src += "      " + unroll + "for (uint l = 0u; l < " + u(bn * bk / 256) + "; ++l) {\n";
  src += "        uint el = tid + l * 256u, nn = el % " + u(bn) + ", kk = el / " + u(bn) + ", gn = n0 + nn, gk = k0 + kk;\n";
  src += "        Bs[kk][nn] = (gn < " + u(n) + " && gk < " + u(kd) + ") ? load_b(bz * " + u(kd * n) + " + gk * " + u(n) +
         " + gn) : 0.0;\n      }\n";
  src += "      barrier();\n";
  src += "      " + unroll + "for (uint kk = 0u; kk < " + u(bk) + "; ++kk) {\n";
  src += "        float ra[" + std::to_string(tm) + "], rb[" + std::to_string(tn) + "];\n";
  src += "        " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) ra[i] = As[kk][ty * " + u(tm) + " + i];\n";
  src += "        " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) rb[j] = Bs[kk][tx + j * " + u(tx) + "];\n";
  src += "        " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) acc[i][j] = fma(ra[i], rb[j], acc[i][j]);\n";
  src += "      }\n      barrier();\n    }\n";
  src += "    " + unroll + "for (uint i = 0u; i < " + u(tm) + "; ++i) " + unroll + "for (uint j = 0u; j < " + u(tn) + "; ++j) {\n";
  src += "      uint gm = m0 + ty * " + u(tm) + " + i, gn = n0 + tx + j * " + u(tx) + ";\n";
  src += "      if (gm >= " + u(m) + " || gn >= " + u(n) + ") continue;\n";
  src += "      uint ci = bz * " + u(m * n) + " + gm * " + u(n) + " + gn;\n";
  src += store + "    }\n  }\n}\n";

  kernel_source s;
  s.name = std::string(big ? "mm128_" : "mm64_") + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(n, bn, caps.max_groups[0]), groups_for(m, bm, caps.max_groups[1]),
              groups_for(batch, 1, caps.max_groups[2])};
  s.bytes = bytes_of(g, s.bindings);
  s.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + prelude + src;
  return s;
}

/// scatter_add: one workgroup per output element (grid-stride over outputs); its 256 threads
/// each sum every 256th pick that lands on the element's row, in pick order, and a fixed tree
/// in shared memory adds the 256 partial sums: deterministic, no atomics. A thread loops
/// picks / 256 times. (One thread per element, looping over every pick, left all but a few
/// threads idle when the output is small, and on lavapipe came back wrong past 65535 picks:
/// llvmpipe ends a shader invocation's loops after 65535 iterations in all, silently.)
kernel_source scatter(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  const plan q = with_root_inline(p, k.root);
  const node& sa = g[k.root];
  const node_id idx = sa.inputs[0], upd = sa.inputs[1];
  const int64_t outs = element_count(sa.dims), rows = sa.dims[0];
  const int64_t row_size = rows ? outs / rows : 0, picks = element_count(g[idx].dims);
  emitter e(g, q, false);
  e.bind(k.root);
  const bool is_int = sa.type == dtype::i32;
  std::string inner;
  e.scoped([&] {
    const std::string ix = e.value(idx, "pk");
    inner = e.body + "      if (" + ix + " == int(row)) {\n";
    e.body.clear();
    e.scoped([&] {
      const std::string v = e.value(upd, "pk * " + u(row_size) + " + col");
      inner += e.body + "      acc += " + v + ";\n      }\n";
      e.body.clear();
    });
  });
  std::string out;
  e.scoped([&] {
    const std::string v = e.rounded(k.root, "acc");
    out = e.store(k.root, "o", v);
  });
  const std::string acc_type = is_int ? "int" : "float", zero = is_int ? "0" : "0.0";
  const std::string rs = u(std::max<int64_t>(row_size, 1));
  std::string src = "shared " + acc_type + " part[256];\nvoid main() {\n  const uint t = gl_LocalInvocationID.x;\n";
  src += "  for (uint o = gl_WorkGroupID.x; o < " + u(outs) + "; o += gl_NumWorkGroups.x) {\n";
  src += "    uint row = o / " + rs + ", col = o % " + rs + ";\n    " + acc_type + " acc = " + zero + ";\n";
  src += "    for (uint pk = t; pk < " + u(picks) + "; pk += 256u) {\n" + inner + "    }\n";
  src += "    part[t] = acc;\n    barrier();\n";
  src += "    for (uint s = 128u; s > 0u; s >>= 1) {\n      if (t < s) part[t] += part[t + s];\n      barrier();\n    }\n";
  src += "    if (t == 0u) {\n      acc = part[0];\n" + out + "    }\n    barrier();\n  }\n}\n";
  kernel_source s;
  s.name = "scat_" + std::to_string(k.root);
  s.bindings = e.bindings;
  s.groups = {groups_for(outs, 1, caps.max_groups[0]), 1, 1};
  s.bytes = bytes_of(g, s.bindings);
  s.glsl = header(g, s.bindings, false, 256) + buffer_decls(g, s.bindings, false) + prelude + src;
  return s;
}

}  // namespace

expected<kernel_source> emit(const graph& g, const plan& p, const kernel& k, const device_caps& caps) {
  if (!caps.storage16) {
    std::vector<node_id> nodes;
    if (k.kind == kernel_kind::rows)
      for (const auto& m : k.members) inline_nodes(g, p, m.root, -1, nodes);
    else
      inline_nodes(g, p, k.root, -1, nodes);
    for (auto id : nodes)
      if (g[id].type == dtype::f16 || g[id].type == dtype::bf16)
        return make_error(error_code::unsupported, "this device has no 16-bit storage buffers: f16/bf16 tensors cannot run here");
  }
  // The kernels whose one invocation loops in proportion to a tensor's size, with a margin for
  // the loops around them (reductions split instead: split_options::must_split_above).
  if (caps.loop_limit > 0) {
    const int64_t budget = caps.loop_limit * 7 / 8;
    const auto too_long = [&](const std::string& what, int64_t iterations) -> expected<kernel_source> {
      return make_error(error_code::unsupported, what + " needs " + std::to_string(iterations) +
                                                     " loop iterations in one shader invocation; this device (a CPU Vulkan driver) stops at " +
                                                     std::to_string(caps.loop_limit) + ": run it on a GPU or the CPU executor");
    };
    if (k.kind == kernel_kind::scatter_add) {
      // Each workgroup walks ceil(outputs / groups) outputs, each costing picks / 256 iterations
      // plus the tree's 8 and the walk's own.
      const int64_t picks = element_count(g[g[k.root].inputs[0]].dims), outs = element_count(g[k.root].dims);
      const int64_t per_group = (outs + caps.max_groups[0] - 1) / std::max<int64_t>(caps.max_groups[0], 1);
      const int64_t iterations = per_group * ((picks + 255) / 256 + 10);
      if (iterations > budget)
        return too_long("scatter_add of " + std::to_string(outs) + " outputs over " + std::to_string(picks) + " picks", iterations);
    }
    if (k.kind == kernel_kind::matmul) {
      const shape& ad = g[g[k.anchor].inputs[0]].dims;
      const int64_t kd = ad.empty() ? 0 : ad.back();
      if ((kd + 7) / 8 > budget) return too_long("a matmul " + std::to_string(kd) + " deep", (kd + 7) / 8);
    }
  }
  switch (k.kind) {
    case kernel_kind::elementwise: return elementwise(g, p, k, caps);
    case kernel_kind::reduce: return reduction(g, p, k, caps);
    case kernel_kind::matmul: return matmul(g, p, k, caps);
    case kernel_kind::scatter_add: return scatter(g, p, k, caps);
    case kernel_kind::rows: return rows_kernel(g, p, k, caps);
  }
  return make_error(error_code::internal, "unknown kernel kind");
}

}  // namespace mesh::gpu
