#pragma once
/// Internal to the GLSL emitters (gpu/glsl*.cpp; the public interface is glsl.hpp): the
/// expression emitter that every kernel uses to compute node values at index expressions, and the
/// text every kernel shares (buffer declarations, the shader header, the prelude of mesh_*
/// functions, epilogues, operand loaders).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gpu/glsl.hpp"

namespace mesh::gpu::detail {

/// A GLSL unsigned literal: 12 -> "12u".
inline std::string u(int64_t v) { return std::to_string(v) + "u"; }

/// GLSL functions every kernel may call: f16/bf16 rounding, and pow, max, min, tanh, int
/// conversion and division as the reference evaluator computes them.
extern const char* const prelude;

/// Builds the statements of one kernel: values of nodes at index expressions, with common
/// subexpressions shared (keyed by node and index text) and buffers bound on first use.
class emitter {
 public:
  emitter(const graph& g, const plan& p, bool vec4) : g_(g), p_(p), vec4_(vec4) {}

  std::string body;
  std::vector<node_index> bindings;

  int bind(node_index id) {
    auto it = std::find(bindings.begin(), bindings.end(), id);
    if (it != bindings.end()) return static_cast<int>(it - bindings.begin());
    bindings.push_back(id);
    return static_cast<int>(bindings.size() - 1);
  }

  /// GLSL type holding a value of node `id` while computing.
  std::string ctype(node_index id) const { return ctype(g_[id].type); }
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
  void seed(node_index id, const std::string& idx, const std::string& var) { cse_[{id, idx}] = var; }

  /// Makes `var` the value of `id` at every index: a rows kernel's result for the current row,
  /// which the plan guarantees is only read at that row.
  void fix(node_index id, const std::string& var) { fixed_[id] = var; }

  /// Runs `f` in a nested scope: temporaries made there are forgotten after.
  template <class F>
  void scoped(F f) {
    auto saved = cse_;
    auto saved_idx = index_cse_;
    f();
    cse_ = std::move(saved);
    index_cse_ = std::move(saved_idx);
  }

  std::string load(node_index id, const std::string& idx);
  std::string store(node_index id, const std::string& idx, const std::string& v);

  /// Rounds a freshly computed float to the node's storage type (what the reference does).
  std::string rounded(node_index id, const std::string& e);

  /// Coordinate `d` of flat index `idx` in `dims`.
  static std::string coord(const std::string& idx, const shape& dims, size_t d);
  static std::string sum_terms(const std::vector<std::string>& terms);
  static std::string times(const std::string& e, int64_t k) { return k == 1 ? e : e + " * " + u(k); }

  /// The value of node `id` at flat index `idx_in`: a literal, a load, or its expression
  /// computed inline (shared with earlier uses of the same node at the same index).
  std::string value(node_index id, const std::string& idx_in);

 private:
  std::string compute(node_index id, const std::string& idx);
  std::string movement(node_index id, const std::string& idx);
  std::string gather(node_index id, const std::string& idx);

  const graph& g_;
  const plan& p_;
  bool vec4_;
  int next_ = 0;
  std::map<std::pair<node_index, std::string>, std::string> cse_;
  std::map<std::string, std::string> index_cse_;
  std::map<node_index, std::string> fixed_;
};

/// Nodes computed inline in the expression of `root` (stops at materialised nodes), plus the
/// materialised ones it reads.
void inline_nodes(const graph& g, const plan& p, node_index root, node_index stop, std::vector<node_index>& out);

/// The GLSL decoders of quantized node `n` bound as buffer `b` (a `uint v[]`): `<b>_dq(i)`, its
/// element at flat index i, and `<b>_chunk(row, c, v)`, elements [32c, 32c + 32) of a row.
/// glsl_quant.cpp.
std::string quant_decoders(const node& n, const std::string& b);

/// `void <p>_chunk_at(uint o, uint sub, out float v[32])`: chunk `sub` (32 elements) of the block
/// of dtype `t` at byte offset o, read through the functions <p>_u8, <p>_u16, <p>_u32 (even
/// offsets) and <p>_f16 (quant_decoders defines them over a buffer).
std::string quant_chunk_decoder(dtype t, const std::string& p);

/// What the coalesced matrix-vector kernel needs of a quantized dtype: in each step of a row the
/// 32 lanes of a subgroup read adjacent words of the row's quants (so that one load instruction
/// of the subgroup touches few cache lines, and so do its loads of x), and each lane decodes its
/// share into `groups` runs of `group_len` values (a multiple of 4) through
///   `void <p>_lane(uint r, uint s, uint lane, out float v[groups * group_len])` (row r, step s);
/// run g holds elements first + g * group_stride .. + group_len - 1 of the row. A step covers
/// `step` elements; a lane takes part only where `valid` holds (the last step of a row may be
/// partial). `first` and `valid` are GLSL expressions of the step s and the kernel's lane vl
/// (0..31). `uvec4`: the decoder reads the weight's buffer as `uvec4 v[]` (16-byte blocks), not
/// through quant_decoders' readers. `swizzle`, where set: the kernel keeps x in shared memory,
/// its 4-float group p at this GLSL expression of p, so that the 8 lanes of a quarter subgroup,
/// which read their groups together, hit 8 different 16-byte bank groups; empty: x is read from
/// memory. Empty glsl: the dtype has no lane decoder.
struct lane_decoder {
  std::string glsl;
  int groups = 2;
  int group_len = 4;
  int64_t group_stride = 0;
  int64_t step = 256;
  std::string first;
  std::string valid = "true";
  bool uvec4 = false;
  std::string swizzle;
  bool sums = false;  ///< (8-bit x) the dot reads xsum, the sums of x's codes over each 16
  int per_lane() const { return groups * group_len; }
};
lane_decoder quant_lane_decoder(dtype t, const std::string& p, int64_t k);

/// The same lanes for a kernel whose x is quantized to 8 bits (q8_0, q4_k and q6_k weights):
/// the weight's share stays in integers and is dotted with x's codes 4 at a time (OpSDot). The
/// glsl defines `struct <p>_W`, `void <p>_iload(uint r, uint s, uint lane, out <p>_W w)` (the
/// lane's quants and scales of row r, step s) and `float <p>_idot(<p>_W w, uint e)` (their dot
/// with x from element e, the lane's `first`, of the kernel's x row), over the kernel's shared
/// arrays `uvec4 xq[]` (x's codes, 16 a vector), `float xd[]` (the scale of each 32 codes),
/// `float xsum[]` (`sums`: scale times the sum of each 16 codes) and its `int idot4(uint, uint)`.
/// Empty glsl: the dtype has none.
lane_decoder quant_int8_lane_decoder(dtype t, const std::string& p, int64_t k);

/// One storage buffer: binding b holds node `id`; binding 0 is the one written. A quantized
/// node's buffer comes with its decoders (quant_decoders).
std::string buffer_decl(const graph& g, node_index id, size_t b, bool vec4, size_t writes = 1);

/// The storage buffers of `bindings`, as vec4 arrays when `all_vec4` or within [vec4_from,
/// vec4_to); bindings [0, writes) are written.
std::string buffer_decls(const graph& g, const std::vector<node_index>& bindings, bool all_vec4,
                         size_t vec4_from = SIZE_MAX, size_t vec4_to = 0, size_t writes = 1);

/// Buffer declarations of a two-pass kernel (a split reduction's, attention's): graph nodes as
/// buffer_decl declares them, and kernel k's scratch buffer (a float or int array, written at
/// binding 0). glsl_reduce.cpp.
std::string split_decls(const graph& g, const plan& p, const kernel& k, const std::vector<node_index>& bindings);

/// "#version 450", the extensions the kernel needs (16-bit storage when a binding is f16/bf16,
/// subgroup arithmetic when `subgroups`) and the workgroup size.
std::string header(const graph& g, const std::vector<node_index>& bindings, bool subgroups, uint32_t local_size);

/// Workgroups to cover `items` at `per_group` each, at least 1 and at most `cap` (kernels
/// grid-stride over the rest).
uint32_t groups_for(int64_t items, int64_t per_group, uint32_t cap);

/// Bytes of the graph nodes among `bindings` (scratch buffers not counted).
uint64_t bytes_of(const graph& g, const std::vector<node_index>& bindings);

/// The kernel's own root is materialised, so value() would load it: compute it instead by
/// treating the root as inline while emitting its expression.
plan with_root_inline(const plan& p, node_index root);

/// Epilogue: the value of the root once the anchor's value at `idx` is `acc`.
/// `value`, when given, receives the name holding the root's value (in scope right after the
/// returned statements).
std::string epilogue(emitter& e, const graph& g, const kernel& k, const std::string& idx, const std::string& acc,
                     std::string* value = nullptr);

/// `float name(uint xi)`: the value of `operand` at flat index xi (prologue index arithmetic).
std::string loader(emitter& e, const std::string& name, node_index operand);

}  // namespace mesh::gpu::detail
