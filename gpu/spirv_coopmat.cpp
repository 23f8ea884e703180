// NV -> KHR cooperative matrices, and f16 -> bf16, on SPIR-V words (spirv_coopmat.hpp).
// Opcodes, capabilities and enumerants are the SPIR-V unified1 grammar's (SPV_NV_cooperative_matrix,
// SPV_KHR_cooperative_matrix, SPV_KHR_bfloat16).
#include "gpu/spirv_coopmat.hpp"

#include "gpu/glsl.hpp"
#include "gpu/shader_cache.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace mesh::gpu {
namespace {

enum op : uint32_t {
  op_undef = 1, op_name = 5, op_member_name = 6, op_extension = 10, op_capability = 17,
  op_type_void = 19, op_type_float = 22, op_type_vector = 23, op_type_array = 28, op_type_runtime_array = 29,
  op_type_struct = 30, op_type_pointer = 32, op_type_function = 33,
  op_constant_true = 41, op_constant_false = 42, op_constant = 43, op_constant_composite = 44, op_constant_null = 46,
  op_spec_constant = 50, op_spec_constant_op = 52, op_function = 54, op_function_end = 56, op_variable = 59, op_load = 61, op_store = 62,
  op_access_chain = 65, op_in_bounds_access_chain = 66, op_decorate = 71, op_member_decorate = 72,
  op_vector_shuffle = 79, op_composite_construct = 80, op_composite_extract = 81, op_composite_insert = 82,
  op_copy_object = 83, op_f_convert = 115, op_bitcast = 124, op_f_negate = 127, op_f_add = 129, op_f_sub = 131,
  op_f_mul = 133, op_f_div = 136, op_matrix_times_scalar = 143, op_select = 169, op_phi = 245,
  op_type_coopmat_khr = 4456, op_coopmat_load_khr = 4457, op_coopmat_store_khr = 4458, op_coopmat_muladd_khr = 4459,
  op_type_coopmat_nv = 5358, op_coopmat_load_nv = 5359, op_coopmat_store_nv = 5360, op_coopmat_muladd_nv = 5361,
  op_coopmat_length_nv = 5362,
};
constexpr uint32_t cap_coopmat_nv = 5357, cap_coopmat_khr = 6022, cap_bf16_type = 5116, cap_bf16_coopmat = 5118;
constexpr uint32_t bf16_encoding = 0;  // FPEncoding BFloat16KHR
/// A matrix's use (the KHR Use operand's values).
enum mat_use : uint32_t { use_a = 0, use_b = 1, use_acc = 2 };
const char* const use_names[] = {"A", "B", "accumulator"};

struct instruction {
  uint32_t op = 0;
  std::vector<uint32_t> w;  // all words, w[0] = word count << 16 | opcode
};

bool is_type_decl(uint32_t o) { return (o >= op_type_void && o <= 39) || o == op_type_coopmat_nv || o == op_type_coopmat_khr; }

std::string literal_string(const instruction& in, size_t from) {
  std::string s;
  for (size_t i = from; i < in.w.size(); ++i)
    for (int b = 0; b < 4; ++b) {
      const char c = static_cast<char>((in.w[i] >> (8 * b)) & 0xff);
      if (c == 0) return s;
      s += c;
    }
  return s;
}

std::vector<uint32_t> string_words(const std::string& s) {
  std::vector<uint32_t> out((s.size() + 4) / 4, 0);
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

instruction make(uint32_t o, std::vector<uint32_t> operands) {
  instruction in;
  in.op = o;
  in.w.push_back(static_cast<uint32_t>((operands.size() + 1) << 16) | o);
  in.w.insert(in.w.end(), operands.begin(), operands.end());
  return in;
}

/// IEEE half bits -> bf16 bits, rounded to nearest even (a 16-bit float constant retyped).
uint32_t half_to_bf16(uint32_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0x1f) {
    const uint32_t bits = (sign << 31) | 0x7f800000u | (man << 13);
    std::memcpy(&f, &bits, 4);
  } else {
    f = std::ldexp(static_cast<float>(exp == 0 ? man : (man | 0x400)), exp == 0 ? -24 : static_cast<int>(exp) - 25);
    if (sign) f = -f;
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (u >> 16) | 0x40;  // NaN stays NaN
  return (u + 0x7fff + ((u >> 16) & 1)) >> 16;
}

struct union_find {
  std::unordered_map<uint32_t, uint32_t> parent;
  uint32_t find(uint32_t x) {
    auto it = parent.find(x);
    if (it == parent.end()) return parent[x] = x;
    if (it->second == x) return x;
    const uint32_t r = find(it->second);
    parent[x] = r;
    return r;
  }
  void unite(uint32_t a, uint32_t b) { parent[find(a)] = find(b); }
};

tl::unexpected<error> refuse(const std::string& what) {
  return make_error(error_code::unsupported, "cooperative-matrix rewrite: " + what);
}

}  // namespace

expected<std::vector<uint32_t>> khr_cooperative_matrices(const std::vector<uint32_t>& words, bool bf16) {
  if (words.size() < 5 || words[0] != 0x07230203u) return refuse("not a SPIR-V module");
  std::vector<instruction> ins;
  for (size_t i = 5; i < words.size();) {
    const uint32_t count = words[i] >> 16;
    if (count == 0 || i + count > words.size()) return refuse("truncated instruction at word " + std::to_string(i));
    ins.push_back({words[i] & 0xffff, std::vector<uint32_t>(words.begin() + static_cast<long>(i), words.begin() + static_cast<long>(i + count))});
    i += count;
  }
  uint32_t bound = words[3];

  // Types: NV matrices, and arrays and pointers built on them ("matrix-carrying"); 16-bit floats.
  std::unordered_map<uint32_t, std::array<uint32_t, 4>> nv;  // id -> component, scope, rows, columns
  std::unordered_map<uint32_t, uint32_t> inner;             // matrix-carrying array or pointer -> what it holds
  std::unordered_set<uint32_t> carrying, type_ids, f16_types;
  std::unordered_map<uint32_t, uint32_t> bool_value, const_type;  // OpConstantTrue/False ids; constant -> its type
  uint32_t half = 0;
  for (const auto& in : ins) {
    const auto& w = in.w;
    if (is_type_decl(in.op) && w.size() >= 2) type_ids.insert(w[1]);
    if (in.op == op_type_float && w.size() == 3 && w[2] == 16) half = w[1], f16_types.insert(w[1]);
    if (in.op == op_type_vector && w.size() == 4 && f16_types.count(w[2])) f16_types.insert(w[1]);
    if (in.op == op_type_coopmat_nv && w.size() == 6) nv[w[1]] = {w[2], w[3], w[4], w[5]}, carrying.insert(w[1]);
    if ((in.op == op_type_array || in.op == op_type_runtime_array) && w.size() >= 3 && carrying.count(w[2]))
      carrying.insert(w[1]), inner[w[1]] = w[2];
    if (in.op == op_type_pointer && w.size() == 4 && carrying.count(w[3])) carrying.insert(w[1]), inner[w[1]] = w[3];
    if ((in.op == op_type_struct || in.op == op_type_function) && w.size() >= 2)
      for (size_t i = 2; i < w.size(); ++i)
        if (carrying.count(w[i])) return refuse("a cooperative matrix in a struct or function type");
    if ((in.op == op_decorate || in.op == op_member_decorate) && w.size() >= 2 && carrying.count(w[1]))
      return refuse("a decorated cooperative-matrix type");
    if ((in.op == op_constant_true || in.op == op_constant_false) && w.size() == 3) bool_value[w[2]] = in.op == op_constant_true;
    if (in.op == op_constant && w.size() >= 4) const_type[w[2]] = w[1];
    if (in.op == op_type_coopmat_khr) return refuse("the module already has KHR cooperative matrices");
    if (in.op == op_coopmat_length_nv || (in.op == op_spec_constant_op && w.size() >= 4 && w[3] == op_coopmat_length_nv))
      return refuse("OpCooperativeMatrixLengthNV (a length depends on the use)");
  }
  if (nv.empty()) return refuse("the module has no NV cooperative matrices");

  // Values and their types: an instruction's first operand is its result type when it names a
  // type (ids are unique in a module, so a type id is never a value id).
  std::unordered_map<uint32_t, uint32_t> type_of;
  for (const auto& in : ins)
    if (!is_type_decl(in.op) && in.op != op_decorate && in.op != op_member_decorate && in.op != op_name &&
        in.op != op_member_name && in.w.size() >= 3 && type_ids.count(in.w[1]))
      type_of[in.w[2]] = in.w[1];
  const auto carries = [&](uint32_t id) {
    auto it = type_of.find(id);
    return it != type_of.end() && carrying.count(it->second) != 0;
  };

  // Uses: union-find over matrix-carrying values; products mark their operands.
  union_find uf;
  std::vector<std::pair<uint32_t, uint32_t>> marks;  // (value, use it was found as), every finding
  const auto mark = [&](uint32_t v, uint32_t u) { marks.emplace_back(v, u); };
  const auto unite_carrying = [&](uint32_t a, uint32_t b) {
    if (carries(a) && carries(b)) uf.unite(a, b);
  };
  bool in_function = false;
  for (const auto& in : ins) {
    const auto& w = in.w;
    if (in.op == op_function) in_function = true;
    if (in.op == op_function_end) in_function = false;
    switch (in.op) {
      case op_load: case op_copy_object: case op_f_convert: case op_f_negate: case op_access_chain:
      case op_in_bounds_access_chain: case op_composite_extract:  // result ~ its first operand
        if (w.size() >= 4) unite_carrying(w[2], w[3]);
        break;
      case op_store:
        if (w.size() >= 3) unite_carrying(w[1], w[2]);
        break;
      case op_f_add: case op_f_sub: case op_f_mul: case op_f_div: case op_matrix_times_scalar: case op_select:
        for (size_t i = 3; i < w.size(); ++i) unite_carrying(w[2], w[i]);
        break;
      case op_phi:
        for (size_t i = 3; i < w.size(); i += 2) unite_carrying(w[2], w[i]);
        break;
      case op_composite_construct: case op_constant_composite: case op_composite_insert:
        for (size_t i = 3; i < w.size(); ++i) unite_carrying(w[2], w[i]);
        break;
      case op_coopmat_muladd_nv:
        if (w.size() != 6) return refuse("a malformed OpCooperativeMatrixMulAddNV");
        mark(w[3], use_a), mark(w[4], use_b), mark(w[5], use_acc), mark(w[2], use_acc);
        break;
      case op_coopmat_load_nv: case op_coopmat_store_nv: case op_variable: case op_undef: case op_constant_null:
        break;
      default:
        // Any other instruction that makes or reads a matrix is one this rewrite does not know.
        if (in_function && !is_type_decl(in.op)) {
          const bool typed = w.size() >= 3 && type_ids.count(w[1]) != 0;
          if (typed && carrying.count(w[1]))
            return refuse("SPIR-V opcode " + std::to_string(in.op) + " makes a cooperative matrix");
          for (size_t i = typed ? 3 : 1; i < w.size(); ++i)
            if (carries(w[i]))
              return refuse("SPIR-V opcode " + std::to_string(in.op) + " on cooperative matrix %" + std::to_string(w[i]));
        }
    }
  }
  std::unordered_map<uint32_t, uint32_t> root_use;
  for (const auto& [v, u] : marks) {
    auto [it, fresh] = root_use.emplace(uf.find(v), u);
    if (!fresh && it->second != u)
      return refuse(std::string("one matrix is both a product's ") + use_names[it->second] + " and its " + use_names[u] +
                    " (through %" + std::to_string(v) + ")");
  }
  // A matrix that reaches no product (an OpUndef the optimiser left, a variable only stored to)
  // takes a use its NV type already has, so that it declares no matrix type of its own: a bf16
  // accumulator, say, which devices need not offer. An f32 matrix prefers the accumulator.
  const auto nv_type_of = [&](uint32_t t) {
    while (inner.count(t)) t = inner.at(t);
    return t;
  };
  std::unordered_map<uint32_t, std::set<uint32_t>> uses_of_nv;  // NV type -> uses its marked values have
  for (const auto& [v, t] : type_of)
    if (carrying.count(t)) {
      auto it = root_use.find(uf.find(v));
      if (it != root_use.end()) uses_of_nv[nv_type_of(t)].insert(it->second);
    }
  const auto use_of = [&](uint32_t v) -> uint32_t {
    auto it = root_use.find(uf.find(v));
    if (it != root_use.end()) return it->second;
    auto known = uses_of_nv.find(nv_type_of(type_of.at(v)));
    if (known == uses_of_nv.end() || known->second.count(use_acc)) return use_acc;
    return *known->second.begin();
  };

  // Every (matrix-carrying type, use) the module needs, closed over arrays and pointers.
  std::set<std::pair<uint32_t, uint32_t>> needed;
  for (const auto& [v, t] : type_of)
    if (carrying.count(t))
      for (uint32_t x = t, u = use_of(v);;) {
        needed.insert({x, u});
        auto it = inner.find(x);
        if (it == inner.end()) break;
        x = it->second;
      }
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> khr_id;
  for (const auto& key : needed) khr_id[key] = bound++;
  const auto retyped = [&](uint32_t t, uint32_t value) { return khr_id.at({t, use_of(value)}); };

  // The constants the KHR operands need: uses 0..2 (0 and 1 double as RowMajor / ColumnMajor).
  const uint32_t uint_type = const_type.count(nv.begin()->second[1]) ? const_type[nv.begin()->second[1]] : 0;
  if (uint_type == 0) return refuse("a matrix scope that is not an OpConstant");
  const std::array<uint32_t, 3> use_const{bound, bound + 1, bound + 2};
  bound += 3;
  const auto layout = [&](uint32_t column_major) -> std::optional<uint32_t> {
    auto it = bool_value.find(column_major);
    if (it == bool_value.end()) return std::nullopt;
    return use_const[it->second ? 1 : 0];
  };

  // bf16: a 16-bit float may be loaded, stored, converted, moved and put in matrices, nothing else.
  std::unordered_set<uint32_t> f16_values;
  if (bf16)
    for (const auto& [v, t] : type_of)
      if (f16_types.count(t)) f16_values.insert(v);
  static const std::unordered_set<uint32_t> moves{op_load, op_store, op_access_chain, op_in_bounds_access_chain, op_f_convert,
                                                 op_bitcast, op_composite_construct, op_composite_extract, op_composite_insert,
                                                 op_vector_shuffle, op_phi, op_select, op_copy_object, op_undef, op_constant,
                                                 op_constant_composite, op_constant_null, op_variable};

  std::vector<uint32_t> out(words.begin(), words.begin() + 5);
  const auto emit = [&](const instruction& in) { out.insert(out.end(), in.w.begin(), in.w.end()); };
  bool constants_done = false;
  in_function = false;
  for (const auto& original : ins) {
    instruction in = original;
    auto& w = in.w;
    if (in.op == op_function) in_function = true;
    if (in.op == op_function_end) in_function = false;
    if (bf16 && in_function && !moves.count(in.op)) {
      for (size_t i = 1; i < w.size(); ++i)
        if (f16_values.count(w[i]) || (i == 1 && f16_types.count(w[i])))
          return refuse("SPIR-V opcode " + std::to_string(in.op) + " computes with a 16-bit float, which bf16 cannot");
    }
    switch (in.op) {
      case op_capability:
        if (w.size() == 2 && w[1] == cap_coopmat_nv) {
          emit(make(op_capability, {cap_coopmat_khr}));
          if (bf16) emit(make(op_capability, {cap_bf16_type})), emit(make(op_capability, {cap_bf16_coopmat}));
          continue;
        }
        break;
      case op_extension:
        if (literal_string(in, 1) == "SPV_NV_cooperative_matrix") {
          emit(make(op_extension, string_words("SPV_KHR_cooperative_matrix")));
          if (bf16) emit(make(op_extension, string_words("SPV_KHR_bfloat16")));
          continue;
        }
        break;
      case op_name: case op_member_name:
        if (w.size() >= 2 && carrying.count(w[1])) continue;  // the name of a type declared anew
        break;
      case op_type_float:
        if (bf16 && w.size() == 3 && w[2] == 16) w = {(4u << 16) | op_type_float, w[1], 16, bf16_encoding};
        break;
      case op_constant: case op_spec_constant:
        if (bf16 && w.size() == 4 && w[1] == half) w[3] = half_to_bf16(w[3] & 0xffff);
        break;
      case op_type_coopmat_nv: {
        if (!constants_done) {
          for (uint32_t u = 0; u < 3; ++u) emit(make(op_constant, {uint_type, use_const[u], u}));
          constants_done = true;
        }
        for (uint32_t u = 0; u < 3; ++u)
          if (needed.count({w[1], u})) emit(make(op_type_coopmat_khr, {khr_id.at({w[1], u}), w[2], w[3], w[4], w[5], use_const[u]}));
        continue;
      }
      case op_type_array: case op_type_runtime_array: case op_type_pointer:
        if (carrying.count(w[1])) {
          const size_t held = in.op == op_type_pointer ? 3 : 2;
          for (uint32_t u = 0; u < 3; ++u)
            if (needed.count({w[1], u})) {
              instruction copy = in;
              copy.w[1] = khr_id.at({w[1], u});
              copy.w[held] = khr_id.at({w[held], u});
              emit(copy);
            }
          continue;
        }
        break;
      case op_coopmat_load_nv: {  // type result pointer stride colmajor [memory operands]
        if (w.size() < 6) return refuse("a malformed OpCooperativeMatrixLoadNV");
        const auto l = layout(w[5]);
        if (!l) return refuse("a load whose column-major operand is not a constant");
        std::vector<uint32_t> ops{retyped(w[1], w[2]), w[2], w[3], *l, w[4]};
        ops.insert(ops.end(), w.begin() + 6, w.end());
        emit(make(op_coopmat_load_khr, ops));
        continue;
      }
      case op_coopmat_store_nv: {  // pointer object stride colmajor [memory operands]
        if (w.size() < 5) return refuse("a malformed OpCooperativeMatrixStoreNV");
        const auto l = layout(w[4]);
        if (!l) return refuse("a store whose column-major operand is not a constant");
        std::vector<uint32_t> ops{w[1], w[2], *l, w[3]};
        ops.insert(ops.end(), w.begin() + 5, w.end());
        emit(make(op_coopmat_store_khr, ops));
        continue;
      }
      case op_coopmat_muladd_nv:
        emit(make(op_coopmat_muladd_khr, {retyped(w[1], w[2]), w[2], w[3], w[4], w[5]}));
        continue;
      default:
        break;
    }
    // Anything else whose result has a matrix-carrying type gets the type of its use.
    if (!is_type_decl(in.op) && w.size() >= 3 && carrying.count(w[1]) && type_of.count(w[2])) w[1] = retyped(w[1], w[2]);
    emit(in);
  }
  out[3] = bound;
  return out;
}

expected<std::vector<uint32_t>> kernel_spirv(shader_cache& cache, const kernel_source& src) {
  auto words = cache.get(src.name, src.glsl);
  if (!words || !(src.bf16_matrices || src.khr_matrices)) return words;
  auto rewritten = khr_cooperative_matrices(*words, src.bf16_matrices);
  if (!rewritten) return make_error(rewritten.error().code, src.name + ": " + rewritten.error().message);
  return rewritten;
}

}  // namespace mesh::gpu
