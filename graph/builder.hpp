#pragma once
/// The graph DSL: build graphs with expressions that read like the math.
///
///   mesh::builder b;
///   auto x = b.input("x", dtype::f32, {32, 2});
///   auto w = b.parameter("w", dtype::f32, {2, 16});
///   auto h = relu(matmul(x, w) + b.parameter("b", dtype::f32, {16}));
///   b.output("h", h);
///   mesh::expected<mesh::graph> g = b.finish();
///
/// Shape and type errors never throw or crash: the expression that failed is poisoned, every
/// expression built from it is poisoned too, and finish() returns the first error, prefixed with
/// the file and line of the code that made it ("model.cpp:12: matmul: inner dimensions differ").
/// Binary ops broadcast like numpy (the builder inserts explicit broadcast nodes).
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/graph.hpp"
#include "graph/infer.hpp"
#include "graph/tensor.hpp"

namespace mesh {

/// Where in the user's code an expression was made. Uses the compiler builtins rather than
/// std::source_location, which clang 14 with libstdc++ 12 cannot compile.
struct source_loc {
  const char* file = "";
  int line = 0;
  static constexpr source_loc current(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
    return {f, l};
  }
};

class builder;

namespace detail {
/// Everything a builder holds, kept on the heap so that it stays put when the builder object is
/// moved: expressions point here, not at the builder, and so survive the builder being returned
/// from a factory function.
struct builder_state {
  graph g;
  std::optional<error> first_error;
  builder* owner = nullptr;  ///< the builder that holds this state now (a move updates it)
};
}  // namespace detail

/// A value being built: a node of a builder, or poisoned by an earlier error.
///
/// An expression stays valid while the builder that made it lives, wherever that builder has been
/// moved to; it must not outlive it.
class expr {
 public:
  expr() = default;
  /// Node `id` of `owner`; id -1 is an expression poisoned by an error `owner` recorded.
  expr(builder* owner, node_index id);

  bool ok() const { return state_ != nullptr && id_ >= 0; }
  node_index id() const { return id_; }
  /// The builder that holds this expression's graph now (null for an expression of no builder).
  builder* owner() const { return state_ ? state_->owner : nullptr; }
  /// Result shape and type (empty/f32 for a poisoned expression). The shape is a copy: a
  /// reference into the node list would dangle once adding a node reallocates it.
  shape dims() const { return ok() ? state_->g[id_].dims : shape{}; }
  dtype type() const { return ok() ? state_->g[id_].type : dtype::f32; }
  int64_t rank() const { return ok() ? static_cast<int64_t>(state_->g[id_].dims.size()) : 0; }
  /// The name of an input or parameter, as given to builder::input() or builder::parameter();
  /// empty for every other node (they have no name) and for a poisoned expression.
  std::string name() const;

 private:
  detail::builder_state* state_ = nullptr;
  node_index id_ = -1;
};

/// An operand of an overloaded operator: an expression or a number, with the caller's location.
/// Implicit conversion captures the line of the operator expression itself.
struct operand {
  operand(expr e, source_loc loc = source_loc::current()) : value(e), where(loc) {}
  operand(double v, source_loc loc = source_loc::current()) : scalar(v), is_scalar(true), where(loc) {}
  expr value;
  double scalar = 0;
  bool is_scalar = false;
  source_loc where;
};

/// Builds one graph.
///
/// Movable, so a factory function can return one: the graph lives on the heap and expressions
/// refer to it there, so every expression made before the move stays valid and belongs to the
/// builder moved to. A moved-from builder holds nothing: it may only be assigned to or destroyed.
/// Move-assigning over a builder ends its own graph, as destroying it would: its expressions dangle.
///
/// Not copyable: a copy's expressions would all still be the original's, so using them with the
/// copy would fail ("operand belongs to another builder"). To build on a copy of a graph, start a
/// new builder from it (builder(graph), with at() to refer to its nodes).
class builder {
 public:
  builder();
  /// Continues building on an existing (valid) graph, e.g. to append gradient nodes.
  explicit builder(graph g);
  builder(builder&& other) noexcept;
  builder& operator=(builder&& other) noexcept;
  builder(const builder&) = delete;
  builder& operator=(const builder&) = delete;
  ~builder() = default;

  expr input(const std::string& name, dtype t, shape s, source_loc loc = source_loc::current());
  expr parameter(const std::string& name, dtype t, shape s, source_loc loc = source_loc::current());
  /// A constant holding the tensor's values.
  expr constant(const tensor& value, source_loc loc = source_loc::current());
  /// A constant of shape `s` filled with `value`.
  expr fill(double value, dtype t, shape s, source_loc loc = source_loc::current());
  expr scalar(double value, dtype t = dtype::f32, source_loc loc = source_loc::current()) {
    return fill(value, t, {}, loc);
  }
  /// Refers to an existing node of the graph (after builder(graph)).
  expr at(node_index id) { return expr(this, id); }

  /// Marks `e` as a result named `name`.
  void output(const std::string& name, expr e, source_loc loc = source_loc::current());
  /// After each run, parameter `target` takes the value of `value`.
  void update(expr target, expr value, source_loc loc = source_loc::current());

  /// The single entry every op goes through: checks inputs, infers the type (see infer()),
  /// appends the node. `declared` gives dtype/shape for ops whose result is chosen (cast,
  /// broadcast, reshape, scatter_add).
  expr make(op_kind op, const std::vector<expr>& inputs, attributes attrs, value_type declared,
            source_loc loc);

  /// The first error met so far, if any.
  const std::optional<error>& first_error() const { return state_->first_error; }
  /// The graph so far (may be incomplete if there was an error).
  const graph& peek() const { return state_->g; }
  /// The finished graph, or the first error.
  expected<graph> finish() const;

  /// Records an error at `loc` (keeps only the first) and returns a poisoned expression.
  expr fail(error e, source_loc loc);

 private:
  friend class expr;  // an expression refers to state_, which outlives moves of this object
  std::unique_ptr<detail::builder_state> state_;
};

inline expr::expr(builder* owner, node_index id) : state_(owner ? owner->state_.get() : nullptr), id_(id) {}

// Elementwise unary.
expr operator-(const expr& x);
expr neg(const expr& x, source_loc loc = source_loc::current());
expr abs(const expr& x, source_loc loc = source_loc::current());
expr exp(const expr& x, source_loc loc = source_loc::current());
expr log(const expr& x, source_loc loc = source_loc::current());
expr sqrt(const expr& x, source_loc loc = source_loc::current());
expr rsqrt(const expr& x, source_loc loc = source_loc::current());
expr tanh(const expr& x, source_loc loc = source_loc::current());
expr sin(const expr& x, source_loc loc = source_loc::current());
expr cos(const expr& x, source_loc loc = source_loc::current());
expr relu(const expr& x, source_loc loc = source_loc::current());
expr sigmoid(const expr& x, source_loc loc = source_loc::current());
expr cast(const expr& x, dtype to, source_loc loc = source_loc::current());

// Elementwise binary, numpy broadcasting; numbers become constants of the other operand's dtype.
expr operator+(const operand& a, const operand& b);
expr operator-(const operand& a, const operand& b);
expr operator*(const operand& a, const operand& b);
expr operator/(const operand& a, const operand& b);
expr pow(const operand& a, const operand& b);
expr maximum(const operand& a, const operand& b);
expr minimum(const operand& a, const operand& b);
/// i32 0/1 result.
expr compare(const operand& a, const operand& b, compare_kind k);
/// a where cond != 0, else b; all three broadcast together.
expr select(const operand& cond, const operand& a, const operand& b);

/// Batched matmul with numpy's rules for the batch dimensions (both operands rank >= 2).
expr matmul(const expr& a, const expr& b, source_loc loc = source_loc::current());
/// x [..., k] times w [n, k] transposed -> [..., n] in x's dtype, accumulated in f32: a Linear
/// layer's weight as HF and GGUF store it. w may be f32, f16, bf16 or quantized (q8_0, q4_0,
/// q4_1, q5_0, q5_1, q4_k, q5_k, q6_k), which the kernels dequantize as they read it.
expr linear(const expr& x, const expr& w, source_loc loc = source_loc::current());
/// Writes `value` into the KV cache `cache` at [pos, pos + value.dims()[axis]) along `axis`
/// (negative counts from the end); `pos` is an i32 scalar (e.g. an input), or an i32 vector of
/// value.dims()[axis] entries that puts row r at pos[r] (a negative entry writes nothing: rows of
/// several sequences, each to its own place, with idle rows skipped). The result is the
/// whole updated cache, for attention in the same graph to read. The cache must be a parameter
/// that nothing else reads, and the graph must update it with this result (`b.update(cache,
/// kv_write(...))`): executors then write only the slice, in place. A slice that does not fit is
/// an error in evaluate() and is dropped (rows outside the cache) on an executor.
expr kv_write(const expr& cache, const expr& value, const expr& pos, int64_t axis,
              source_loc loc = source_loc::current());
/// Causal grouped-query attention of q [..., l, h, d] against keys and values [..., t, kv, d]
/// (a KV cache, or a view of it), query row i seeing the keys at positions <= pos[i] (pos: i32
/// [..., l]) and, with `window` > 0, only the last `window` of them: softmax(q k^T / sqrt(d)) v
/// as one op (op_kind::attention), [..., l, h, d] in q's dtype.
expr attention(const expr& q, const expr& k, const expr& v, const expr& pos, int64_t window = 0,
               source_loc loc = source_loc::current());

// Reductions; negative axes count from the end.
expr sum(const expr& x, std::vector<int64_t> axes, bool keep_dims = false, source_loc loc = source_loc::current());
expr max_over(const expr& x, std::vector<int64_t> axes, bool keep_dims = false, source_loc loc = source_loc::current());
expr mean(const expr& x, std::vector<int64_t> axes, bool keep_dims = false, source_loc loc = source_loc::current());
/// Sum of all elements, a scalar.
expr sum_all(const expr& x, source_loc loc = source_loc::current());
expr mean_all(const expr& x, source_loc loc = source_loc::current());

// Data movement.
expr broadcast_to(const expr& x, shape to, source_loc loc = source_loc::current());
/// One dimension may be -1 (inferred).
expr reshape(const expr& x, shape to, source_loc loc = source_loc::current());
expr permute(const expr& x, std::vector<int64_t> axes, source_loc loc = source_loc::current());
/// Swaps the last two dimensions.
expr transpose(const expr& x, source_loc loc = source_loc::current());
expr slice(const expr& x, std::vector<int64_t> starts, std::vector<int64_t> stops,
           source_loc loc = source_loc::current());
/// Slices [start, stop) of one axis.
expr slice_axis(const expr& x, int64_t axis, int64_t start, int64_t stop, source_loc loc = source_loc::current());
expr concat(const std::vector<expr>& xs, int64_t axis, source_loc loc = source_loc::current());
/// Rows of `table` picked by i32 `indices`. An index outside the table is an error in evaluate()
/// and reads zeros on an executor (see graph/ops.hpp).
expr gather(const expr& table, const expr& indices, source_loc loc = source_loc::current());
/// zeros(table_shape) with `updates` rows added at `indices`. An index outside the table is an
/// error in evaluate() and is dropped on an executor (see graph/ops.hpp).
expr scatter_add(const expr& indices, const expr& updates, shape table_shape, source_loc loc = source_loc::current());

}  // namespace mesh
