#pragma once
/// The closed op set of the graph IR.
///
/// Every graph that travels between nodes is made of these ops and nothing else, so a worker can
/// validate a graph completely and compile it without trusting the sender. Composite operations
/// (softmax, layer norm, attention) are built from these in graph/nn.hpp and fused by the compiler.
///
/// Rules the IR keeps strict (the builder DSL does the conveniences):
/// - elementwise binary ops and select take operands of one shape; the DSL inserts `broadcast`
///   nodes following numpy's rules;
/// - matmul takes [..., m, k] x [..., k, n] with equal batch dimensions;
/// - quantized dtypes appear only in leaves, read by linear's weight operand;
/// - the output shape and dtype of every node are stored in the node and re-inferred by validate().
///
/// Integer semantics (every back end computes them alike): i32 arithmetic (add, sub, mul, neg,
/// abs, div, sums, scatter_add) wraps modulo 2^32, as GPUs and NumPy do; i32 division truncates
/// toward zero and dividing by zero gives 0; a float cast to i32 truncates toward zero and
/// saturates (NaN gives 0).
///
/// Indices (gather, scatter_add): an index outside the table's rows is a bug in the data. The
/// reference evaluator (graph/evaluate.hpp), the checked mode that tests use, reports it as an
/// error naming the node and the index. The executors' kernels (gpu/) do not check on their hot
/// path: there gather reads zeros and scatter_add drops the row, which only keeps the device from
/// faulting; a result computed from such an index means nothing.
#include <cstdint>
#include <string_view>

namespace mesh {

/// Values are part of the wire format: append only, never renumber.
enum class op_kind : uint8_t {
  // Leaves.
  input = 0,      ///< a value bound at each run (attrs.name)
  parameter = 1,  ///< a value resident between runs, updatable (attrs.name)
  constant = 2,   ///< literal values (attrs.values, one per element, or one for a splat)
  // Unary elementwise.
  neg = 3,
  abs = 4,
  exp = 5,
  log = 6,
  sqrt = 7,
  rsqrt = 8,
  tanh = 9,
  sin = 10,
  cos = 11,
  relu = 12,
  sigmoid = 13,
  cast = 14,  ///< to the node's dtype (floats truncate toward zero when cast to i32, saturating; NaN -> 0)
  // Binary elementwise (operands of one shape and dtype).
  add = 15,
  sub = 16,
  mul = 17,
  div = 18,
  pow = 19,  ///< C's pow, edge cases included (pow(0, -1) = inf, pow(1, NaN) = 1)
  max = 20,  ///< NaN if either operand is NaN (as reduce_max)
  min = 21,  ///< NaN if either operand is NaN
  compare = 22,  ///< attrs.cmp; result is i32 0/1
  // Ternary elementwise.
  select = 23,  ///< select(cond i32, a, b): a where cond != 0, else b
  // Contractions and reductions.
  matmul = 24,      ///< [..., m, k] x [..., k, n] -> [..., m, n]
  reduce_sum = 25,  ///< over attrs.axes; attrs.keep_dims keeps them as size 1
  reduce_max = 26,
  // Data movement.
  broadcast = 27,  ///< numpy-style to the node's shape (input right-aligned, size-1 dims expand)
  reshape = 28,    ///< same element count, node's shape
  permute = 29,    ///< output dim i is input dim attrs.axes[i]
  slice = 30,      ///< attrs.starts/stops per dim, step 1
  concat = 31,     ///< along attrs.axis; any number of inputs >= 1
  gather = 32,     ///< gather(table [v, ...], idx i32 [...]) -> [idx..., ...] (rows of table)
  scatter_add = 33,  ///< scatter_add(idx i32 [...], updates [idx..., ...]) -> node's shape [v, ...]
  // Model inference.
  /// linear(x [..., k], w [n, k]) -> [..., n]: x times w transposed (HF Linear's and ggml's weight
  /// layout), f32 accumulation, result in x's (float) dtype. w may be f32, f16, bf16 or quantized
  /// (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k: dequantized inside the kernel; the only
  /// reader of quantized tensors).
  linear = 34,
  /// kv_write(cache [..., L, ...], value [..., t, ...], pos i32 [] or [t]) -> cache with value
  /// written along attrs.axis: at [pos, pos + t) for a scalar pos, row r at pos[r] for a vector
  /// (a negative entry writes nothing: a batch's idle row). The cache must be a parameter read by
  /// nothing else, and the graph must update that parameter with this node: executors write the
  /// rows in place.
  kv_write = 35,
  /// attention(q [..., l, h, d], k [..., t, kv, d], v [..., t, kv, d], pos i32 [..., l]) ->
  /// [..., l, h, d]: causal grouped-query attention against a KV cache, in one kernel. Query row
  /// i, head j attends the keys s < t with s <= pos[i] (and s > pos[i] - attrs.axis when
  /// attrs.axis > 0: a sliding window of that many keys), with weights softmax over s of
  /// q . k_s / sqrt(d), and returns the weighted sum of the v_s; head j reads key/value head
  /// j / (h / kv). A row that sees no key returns 0. q, k and v have float dtypes (f32
  /// arithmetic); the result has q's. Inference only: autodiff refuses it.
  attention = 36,
};

inline constexpr int op_count = 37;

/// The comparison made by op_kind::compare. Values are part of the wire format.
enum class compare_kind : uint8_t { eq = 0, ne = 1, lt = 2, le = 3, gt = 4, ge = 5 };

/// Broad families of ops, used by the validator, autodiff and the kernel compiler.
enum class op_family { leaf, unary, binary, ternary, matmul, reduce, movement, gather, linear, kv_write, attention };

op_family family_of(op_kind op);

/// "matmul", "reduce_sum", ...
std::string_view to_string(op_kind op);
std::string_view to_string(compare_kind c);

/// Elementwise ops (unary, binary, ternary): the ones kernel fusion chains together.
inline bool is_elementwise(op_kind op) {
  auto f = family_of(op);
  return f == op_family::unary || f == op_family::binary || f == op_family::ternary;
}

}  // namespace mesh
