// The expression emitter (node values at index expressions, common subexpressions shared) and
// the text helpers that every kernel emitter uses. Declarations and their contracts are in
// glsl_emitter.hpp.
#include "gpu/glsl_emitter.hpp"

#include <cassert>
#include <cmath>
#include <cstdio>

#include "graph/quant.hpp"

namespace mesh::gpu::detail {
namespace {

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

}  // namespace

const char* const prelude = R"(
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

std::string emitter::load(node_index id, const std::string& idx) {
  const int b = bind(id);
  if (is_quantized(g_[id].type)) return "b" + std::to_string(b) + "_dq(" + idx + ")";  // buffer_decl's decoder
  const std::string ref = "b" + std::to_string(b) + ".v[" + idx + "]";
  switch (g_[id].type) {
    case dtype::f16: return "unpackHalf2x16(uint(" + ref + ")).x";
    case dtype::bf16: return "uintBitsToFloat(uint(" + ref + ") << 16)";
    default: return ref;
  }
}

std::string emitter::store(node_index id, const std::string& idx, const std::string& v) {
  const int b = bind(id);
  const std::string ref = "b" + std::to_string(b) + ".v[" + idx + "]";
  switch (g_[id].type) {
    case dtype::f16: return "  " + ref + " = uint16_t(packHalf2x16(vec2(" + v + ", 0.0)) & 0xffffu);\n";
    case dtype::bf16: return "  " + ref + " = uint16_t(mesh_bf16_bits(" + v + "));\n";
    default: return "  " + ref + " = " + v + ";\n";
  }
}

std::string emitter::rounded(node_index id, const std::string& e) {
  switch (g_[id].type) {
    case dtype::f16: return "mesh_round_f16(" + e + ")";
    case dtype::bf16: return "mesh_round_bf16(" + e + ")";
    default: return e;
  }
}

std::string emitter::coord(const std::string& idx, const shape& dims, size_t d) {
  const auto st = strides_of(dims);
  std::string e = st[d] == 1 ? idx : "(" + idx + " / " + u(st[d]) + ")";
  if (d > 0) e = "(" + e + " % " + u(dims[d]) + ")";
  return e;
}

std::string emitter::sum_terms(const std::vector<std::string>& terms) {
  if (terms.empty()) return "0u";
  std::string s;
  for (const auto& t : terms) s += (s.empty() ? "" : " + ") + t;
  return "(" + s + ")";
}

std::string emitter::value(node_index id, const std::string& idx_in) {
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

std::string emitter::compute(node_index id, const std::string& idx) {
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

std::string emitter::movement(node_index id, const std::string& idx) {
  const node& n = g_[id];
  const node_index x = n.inputs[0];
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

std::string emitter::gather(node_index id, const std::string& idx) {
  const node& n = g_[id];
  const node_index table = n.inputs[0], indices = n.inputs[1];
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

void inline_nodes(const graph& g, const plan& p, node_index root, node_index stop, std::vector<node_index>& out) {
  std::vector<node_index> stack{root};
  std::vector<bool> seen(static_cast<size_t>(g.size()), false);
  while (!stack.empty()) {
    node_index id = stack.back();
    stack.pop_back();
    if (seen[id]) continue;
    seen[id] = true;
    out.push_back(id);
    if (id == stop || ((p.materialised[id] || is_splat(g[id])) && id != root)) continue;
    for (auto in : g[id].inputs) stack.push_back(in);
  }
}

std::string buffer_decl(const graph& g, node_index id, size_t b, bool vec4, size_t writes) {
  const dtype t = g[id].type;
  if (is_quantized(t)) {
    assert(b >= writes && !vec4);  // read only, through its decoders
    return "layout(std430, binding = " + std::to_string(b) + ") readonly restrict buffer B" + std::to_string(b) +
           " { uint v[]; } b" + std::to_string(b) + ";\n" + quant_decoders(g[id], "b" + std::to_string(b));
  }
  std::string ty = t == dtype::i32 ? (vec4 ? "ivec4" : "int") : (t == dtype::f32 ? (vec4 ? "vec4" : "float") : "uint16_t");
  return "layout(std430, binding = " + std::to_string(b) + ") " + (b < writes ? "" : "readonly ") + "restrict buffer B" +
         std::to_string(b) + " { " + ty + " v[]; } b" + std::to_string(b) + ";\n";
}

std::string buffer_decls(const graph& g, const std::vector<node_index>& bindings, bool all_vec4,
                         size_t vec4_from, size_t vec4_to, size_t writes) {
  std::string s;
  for (size_t b = 0; b < bindings.size(); ++b) {
    if (bindings[b] >= g.size()) {  // a scratch buffer read as words (a decoded weight: f16 pairs)
      s += "layout(std430, binding = " + std::to_string(b) + ") readonly restrict buffer B" + std::to_string(b) + " { uint v[]; } b" +
           std::to_string(b) + ";\n";
      continue;
    }
    s += buffer_decl(g, bindings[b], b, all_vec4 || (b >= vec4_from && b < vec4_to), writes);
  }
  return s;
}

std::string header(const graph& g, const std::vector<node_index>& bindings, bool subgroups, uint32_t local_size) {
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

uint64_t bytes_of(const graph& g, const std::vector<node_index>& bindings) {
  uint64_t b = 0;
  for (auto id : bindings)
    if (id < g.size()) b += static_cast<uint64_t>(std::max<int64_t>(byte_size(g[id].type, g[id].dims), 0));  // not scratch
  return b;
}

plan with_root_inline(const plan& p, node_index root) {
  plan q = p;
  q.materialised[root] = false;
  return q;
}

std::string epilogue(emitter& e, const graph& g, const kernel& k, const std::string& idx, const std::string& acc,
                     std::string* value) {
  const node_index anchor = k.anchor;
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

std::string loader(emitter& e, const std::string& name, node_index operand) {
  std::string f;
  e.scoped([&] {
    const std::string v = e.value(operand, "xi");
    f = "float " + name + "(uint xi) {\n" + e.body + "  return float(" + v + ");\n}\n";
    e.body.clear();
  });
  return f;
}

}  // namespace mesh::gpu::detail
