#include "graph/builder.hpp"

#include <algorithm>
#include <cstring>

namespace mesh {
namespace {

std::string where(source_loc loc) {
  if (!loc.file || !*loc.file) return "";
  const char* base = std::strrchr(loc.file, '/');
  return std::string(base ? base + 1 : loc.file) + ":" + std::to_string(loc.line) + ": ";
}

/// Normalises possibly negative axes against `rank`; leaves out-of-range ones for infer() to reject.
std::vector<int64_t> normalise_axes(std::vector<int64_t> axes, int64_t rank) {
  for (auto& a : axes)
    if (a < 0 && a + rank >= 0) a += rank;
  return axes;
}

builder* owner_of(std::initializer_list<const expr*> xs) {
  for (auto* x : xs)
    if (x->owner()) return x->owner();
  return nullptr;
}

builder* owner_of(std::initializer_list<const operand*> xs) {
  for (auto* x : xs)
    if (!x->is_scalar && x->value.owner()) return x->value.owner();
  return nullptr;
}

/// Turns operands into expressions of one shape: numbers become constants of the dtype of the
/// first expression operand, then every operand is broadcast to the common shape.
std::vector<expr> broadcast_operands(builder& b, std::vector<const operand*> ops, source_loc loc) {
  dtype t = dtype::f32;
  for (auto* o : ops)
    if (!o->is_scalar) {
      t = o->value.type();
      break;
    }
  std::vector<expr> xs;
  for (auto* o : ops) xs.push_back(o->is_scalar ? b.scalar(o->scalar, t, loc) : o->value);
  shape common;
  for (auto& x : xs) {
    if (!x.ok()) return xs;
    auto s = broadcast_shapes(common, x.dims());
    if (!s) {
      xs[0] = b.fail(s.error(), loc);
      return xs;
    }
    common = *s;
  }
  for (auto& x : xs)
    if (x.dims() != common) x = broadcast_to(x, common, loc);
  return xs;
}

expr unary(op_kind op, const expr& x, source_loc loc) {
  if (!x.owner()) return {};
  return x.owner()->make(op, {x}, {}, {x.type(), x.dims()}, loc);
}

expr binary(op_kind op, const operand& a, const operand& b, source_loc loc, attributes attrs = {}) {
  builder* bld = owner_of({&a, &b});
  if (!bld) return {};
  auto xs = broadcast_operands(*bld, {&a, &b}, loc);
  return bld->make(op, xs, std::move(attrs), {}, loc);
}

}  // namespace

std::string expr::name() const {
  if (!ok()) return {};
  const node& n = state_->g[id_];
  return n.op == op_kind::input || n.op == op_kind::parameter ? n.attrs.name : std::string();
}

builder::builder() : builder(graph{}) {}

builder::builder(graph g) : state_(std::make_unique<detail::builder_state>()) {
  state_->g = std::move(g);
  state_->owner = this;
}

builder::builder(builder&& other) noexcept : state_(std::move(other.state_)) {
  if (state_) state_->owner = this;
}

builder& builder::operator=(builder&& other) noexcept {
  if (this != &other) {
    state_ = std::move(other.state_);
    if (state_) state_->owner = this;
  }
  return *this;
}

expr builder::fail(error e, source_loc loc) {
  if (!state_->first_error) {
    e.message = where(loc) + e.message;
    state_->first_error = std::move(e);
  }
  return expr(this, -1);
}

expr builder::make(op_kind op, const std::vector<expr>& inputs, attributes attrs, value_type declared,
                   source_loc loc) {
  node n;
  n.op = op;
  n.type = declared.type;
  n.dims = std::move(declared.dims);
  n.attrs = std::move(attrs);
  std::vector<value_type> in;
  for (const auto& x : inputs) {
    if (x.owner() != this) {
      if (x.owner() == nullptr || x.id() < 0) return expr(this, -1);  // poisoned: error already recorded
      return fail(error{error_code::invalid_argument,
                        std::string(to_string(op)) + ": operand belongs to another builder"}, loc);
    }
    if (!x.ok()) return expr(this, -1);
    n.inputs.push_back(x.id());
    in.push_back({x.type(), x.dims()});
  }
  auto t = infer(n, in);
  if (!t) return fail(t.error(), loc);
  n.type = t->type;
  n.dims = t->dims;
  state_->g.nodes.push_back(std::move(n));
  return expr(this, state_->g.size() - 1);
}

expr builder::input(const std::string& name, dtype t, shape s, source_loc loc) {
  if (state_->g.find_leaf(name) >= 0)
    return fail(error{error_code::invalid_argument, "input: name \"" + name + "\" is already used"}, loc);
  attributes a;
  a.name = name;
  return make(op_kind::input, {}, std::move(a), {t, std::move(s)}, loc);
}

expr builder::parameter(const std::string& name, dtype t, shape s, source_loc loc) {
  if (state_->g.find_leaf(name) >= 0)
    return fail(error{error_code::invalid_argument, "parameter: name \"" + name + "\" is already used"}, loc);
  attributes a;
  a.name = name;
  return make(op_kind::parameter, {}, std::move(a), {t, std::move(s)}, loc);
}

expr builder::constant(const tensor& value, source_loc loc) {
  if (auto ok = value.check(); !ok) return fail(ok.error(), loc);
  attributes a;
  a.values = value.to_doubles();
  return make(op_kind::constant, {}, std::move(a), {value.type, value.dims}, loc);
}

expr builder::fill(double value, dtype t, shape s, source_loc loc) {
  attributes a;
  a.values = {round_to(t, value)};
  return make(op_kind::constant, {}, std::move(a), {t, std::move(s)}, loc);
}

void builder::output(const std::string& name, expr e, source_loc loc) {
  if (!e.ok()) {
    if (e.owner() == this || e.owner() == nullptr) fail(error{error_code::invalid_argument, "output \"" + name + "\" is not a valid expression"}, loc);
    return;
  }
  if (state_->g.find_output(name) >= 0) {
    fail(error{error_code::invalid_argument, "output: name \"" + name + "\" is already used"}, loc);
    return;
  }
  state_->g.outputs.push_back({name, e.id()});
}

void builder::update(expr target, expr value, source_loc loc) {
  if (!target.ok() || !value.ok()) {
    fail(error{error_code::invalid_argument, "update: invalid expression"}, loc);
    return;
  }
  const auto& t = state_->g[target.id()];
  if (t.op != op_kind::parameter) {
    fail(error{error_code::invalid_argument, "update: target is a " + std::string(to_string(t.op)) + ", not a parameter"}, loc);
    return;
  }
  if (t.type != value.type() || t.dims != value.dims()) {
    fail(error{error_code::shape_mismatch, "update: parameter \"" + t.attrs.name + "\" is " + to_string(t.type) +
                                               to_string(t.dims) + ", value is " + to_string(value.type()) +
                                               to_string(value.dims())}, loc);
    return;
  }
  for (const auto& u : state_->g.updates)
    if (u.target == target.id()) {
      fail(error{error_code::invalid_argument, "update: parameter \"" + t.attrs.name + "\" is updated twice"}, loc);
      return;
    }
  state_->g.updates.push_back({target.id(), value.id()});
}

expected<graph> builder::finish() const {
  if (state_->first_error) return tl::unexpected(*state_->first_error);
  return state_->g;
}

// ---- elementwise ----

expr operator-(const expr& x) { return unary(op_kind::neg, x, source_loc::current()); }
expr neg(const expr& x, source_loc loc) { return unary(op_kind::neg, x, loc); }
expr abs(const expr& x, source_loc loc) { return unary(op_kind::abs, x, loc); }
expr exp(const expr& x, source_loc loc) { return unary(op_kind::exp, x, loc); }
expr log(const expr& x, source_loc loc) { return unary(op_kind::log, x, loc); }
expr sqrt(const expr& x, source_loc loc) { return unary(op_kind::sqrt, x, loc); }
expr rsqrt(const expr& x, source_loc loc) { return unary(op_kind::rsqrt, x, loc); }
expr tanh(const expr& x, source_loc loc) { return unary(op_kind::tanh, x, loc); }
expr sin(const expr& x, source_loc loc) { return unary(op_kind::sin, x, loc); }
expr cos(const expr& x, source_loc loc) { return unary(op_kind::cos, x, loc); }
expr relu(const expr& x, source_loc loc) { return unary(op_kind::relu, x, loc); }
expr sigmoid(const expr& x, source_loc loc) { return unary(op_kind::sigmoid, x, loc); }
expr cast(const expr& x, dtype to, source_loc loc) {
  if (!x.owner()) return {};
  return x.owner()->make(op_kind::cast, {x}, {}, {to, x.dims()}, loc);
}

expr operator+(const operand& a, const operand& b) { return binary(op_kind::add, a, b, a.where); }
expr operator-(const operand& a, const operand& b) { return binary(op_kind::sub, a, b, a.where); }
expr operator*(const operand& a, const operand& b) { return binary(op_kind::mul, a, b, a.where); }
expr operator/(const operand& a, const operand& b) { return binary(op_kind::div, a, b, a.where); }
expr pow(const operand& a, const operand& b) { return binary(op_kind::pow, a, b, a.where); }
expr maximum(const operand& a, const operand& b) { return binary(op_kind::max, a, b, a.where); }
expr minimum(const operand& a, const operand& b) { return binary(op_kind::min, a, b, a.where); }
expr compare(const operand& a, const operand& b, compare_kind k) {
  attributes attrs;
  attrs.cmp = k;
  return binary(op_kind::compare, a, b, a.where, std::move(attrs));
}

expr select(const operand& cond, const operand& a, const operand& b) {
  builder* bld = owner_of({&cond, &a, &b});
  if (!bld) return {};
  // The condition is i32; numbers among a and b take the dtype of the other value operand.
  operand c = cond.is_scalar ? operand(bld->scalar(cond.scalar, dtype::i32, cond.where), cond.where) : cond;
  auto vals = broadcast_operands(*bld, {&a, &b}, cond.where);
  operand va(vals[0], a.where), vb(vals[1], b.where);
  auto xs = broadcast_operands(*bld, {&c, &va, &vb}, cond.where);
  return bld->make(op_kind::select, xs, {}, {}, cond.where);
}

// ---- matmul ----

expr matmul(const expr& a, const expr& b, source_loc loc) {
  builder* bld = owner_of({&a, &b});
  if (!bld) return {};
  if (!a.ok() || !b.ok()) return bld->make(op_kind::matmul, {a, b}, {}, {}, loc);
  if (a.rank() < 2 || b.rank() < 2)
    return bld->fail(error{error_code::shape_mismatch, "matmul: operands need rank >= 2, got " +
                                                           to_string(a.dims()) + " x " + to_string(b.dims())}, loc);
  // Broadcast the batch dimensions (all but the last two) like numpy.
  const shape ad = a.dims(), bd = b.dims();
  shape ba(ad.begin(), ad.end() - 2), bb(bd.begin(), bd.end() - 2);
  auto batch = broadcast_shapes(ba, bb);
  if (!batch) return bld->fail(error{error_code::shape_mismatch, "matmul: batch dimensions: " + batch.error().message}, loc);
  auto with_batch = [&](const expr& x) {
    shape s = *batch;
    s.push_back(x.dims()[x.dims().size() - 2]);
    s.push_back(x.dims().back());
    return s == x.dims() ? x : broadcast_to(x, s, loc);
  };
  return bld->make(op_kind::matmul, {with_batch(a), with_batch(b)}, {}, {}, loc);
}

expr linear(const expr& x, const expr& w, source_loc loc) {
  builder* bld = owner_of({&x, &w});
  if (!bld) return {};
  return bld->make(op_kind::linear, {x, w}, {}, {}, loc);
}

expr attention(const expr& q, const expr& k, const expr& v, const expr& pos, int64_t window, source_loc loc) {
  builder* bld = owner_of({&q, &k, &v, &pos});
  if (!bld) return {};
  attributes attrs;
  attrs.axis = window;
  return bld->make(op_kind::attention, {q, k, v, pos}, std::move(attrs), {}, loc);
}

expr kv_write(const expr& cache, const expr& value, const expr& pos, int64_t axis, source_loc loc) {
  builder* bld = owner_of({&cache, &value, &pos});
  if (!bld) return {};
  attributes attrs;
  attrs.axis = axis < 0 && cache.ok() ? axis + cache.rank() : axis;
  return bld->make(op_kind::kv_write, {cache, value, pos}, std::move(attrs), {}, loc);
}

// ---- reductions ----

namespace {
expr reduce(op_kind op, const expr& x, std::vector<int64_t> axes, bool keep_dims, source_loc loc) {
  if (!x.owner()) return {};
  attributes attrs;
  attrs.axes = normalise_axes(std::move(axes), x.rank());
  std::sort(attrs.axes.begin(), attrs.axes.end());
  attrs.keep_dims = keep_dims;
  return x.owner()->make(op, {x}, std::move(attrs), {}, loc);
}
}  // namespace

expr sum(const expr& x, std::vector<int64_t> axes, bool keep_dims, source_loc loc) {
  return reduce(op_kind::reduce_sum, x, std::move(axes), keep_dims, loc);
}
expr max_over(const expr& x, std::vector<int64_t> axes, bool keep_dims, source_loc loc) {
  return reduce(op_kind::reduce_max, x, std::move(axes), keep_dims, loc);
}
expr mean(const expr& x, std::vector<int64_t> axes, bool keep_dims, source_loc loc) {
  auto s = sum(x, axes, keep_dims, loc);
  if (!s.ok()) return s;
  const int64_t n = s.dims().empty() && x.dims().empty() ? 1 : element_count(x.dims()) / std::max<int64_t>(1, element_count(s.dims()));
  return operator/(operand(s, loc), operand(static_cast<double>(std::max<int64_t>(n, 1)), loc));
}
expr sum_all(const expr& x, source_loc loc) {
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < x.rank(); ++i) axes.push_back(i);
  return sum(x, axes, false, loc);
}
expr mean_all(const expr& x, source_loc loc) {
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < x.rank(); ++i) axes.push_back(i);
  return mean(x, axes, false, loc);
}

// ---- data movement ----

expr broadcast_to(const expr& x, shape to, source_loc loc) {
  if (!x.owner()) return {};
  if (x.ok() && x.dims() == to) return x;
  return x.owner()->make(op_kind::broadcast, {x}, {}, {x.type(), std::move(to)}, loc);
}

expr reshape(const expr& x, shape to, source_loc loc) {
  if (!x.owner()) return {};
  if (!x.ok()) return x;
  const auto wildcard = std::count(to.begin(), to.end(), -1);
  if (wildcard > 1) return x.owner()->fail(error{error_code::shape_mismatch, "reshape: more than one -1 in " + to_string(to)}, loc);
  if (wildcard == 1) {
    int64_t known = 1;
    for (auto d : to)
      if (d != -1) known *= d;
    const int64_t total = element_count(x.dims());
    if (known == 0 || total % known != 0)
      return x.owner()->fail(error{error_code::shape_mismatch, "reshape: cannot reshape " + to_string(x.dims()) + " to " + to_string(to)}, loc);
    std::replace(to.begin(), to.end(), int64_t{-1}, total / known);
  }
  if (x.dims() == to) return x;
  return x.owner()->make(op_kind::reshape, {x}, {}, {x.type(), std::move(to)}, loc);
}

expr permute(const expr& x, std::vector<int64_t> axes, source_loc loc) {
  if (!x.owner()) return {};
  attributes attrs;
  attrs.axes = normalise_axes(std::move(axes), x.rank());
  // A permutation that keeps the order of every axis longer than 1 moves no element: it is a
  // reshape, which kernels read as the buffer it views instead of through index arithmetic (a
  // decode step's attention output, [kv, group, 1, d] to [1, kv, group, d]).
  if (x.ok() && static_cast<int64_t>(attrs.axes.size()) == x.rank()) {
    std::vector<bool> seen(attrs.axes.size(), false);
    bool valid = true, ordered = true;
    int64_t last = -1;
    shape to;
    for (const int64_t a : attrs.axes) {
      valid = valid && a >= 0 && a < x.rank() && !seen[static_cast<size_t>(a)];
      if (!valid) break;
      seen[static_cast<size_t>(a)] = true;
      const int64_t len = x.dims()[static_cast<size_t>(a)];
      to.push_back(len);
      if (len != 1) {
        ordered = ordered && a > last;
        last = a;
      }
    }
    if (valid && ordered) return reshape(x, std::move(to), loc);
  }
  return x.owner()->make(op_kind::permute, {x}, std::move(attrs), {x.type(), {}}, loc);
}

expr transpose(const expr& x, source_loc loc) {
  if (!x.owner()) return {};
  if (x.ok() && x.rank() < 2)
    return x.owner()->fail(error{error_code::shape_mismatch, "transpose: needs rank >= 2, got " + to_string(x.dims())}, loc);
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < x.rank(); ++i) axes.push_back(i);
  if (axes.size() >= 2) std::swap(axes[axes.size() - 1], axes[axes.size() - 2]);
  return permute(x, axes, loc);
}

expr slice(const expr& x, std::vector<int64_t> starts, std::vector<int64_t> stops, source_loc loc) {
  if (!x.owner()) return {};
  attributes attrs;
  attrs.starts = std::move(starts);
  attrs.stops = std::move(stops);
  return x.owner()->make(op_kind::slice, {x}, std::move(attrs), {x.type(), {}}, loc);
}

expr slice_axis(const expr& x, int64_t axis, int64_t start, int64_t stop, source_loc loc) {
  if (!x.owner()) return {};
  if (!x.ok()) return x;
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank())
    return x.owner()->fail(error{error_code::invalid_argument, "slice: axis out of range for " + to_string(x.dims())}, loc);
  std::vector<int64_t> st(x.dims().size(), 0), sp = x.dims();
  st[static_cast<size_t>(axis)] = start;
  sp[static_cast<size_t>(axis)] = stop;
  return slice(x, st, sp, loc);
}

expr concat(const std::vector<expr>& xs, int64_t axis, source_loc loc) {
  builder* bld = nullptr;
  for (auto& x : xs)
    if (x.owner()) bld = x.owner();
  if (!bld) return {};
  if (axis < 0 && !xs.empty()) axis += xs[0].rank();
  attributes attrs;
  attrs.axis = axis;
  if (axis == 0) attrs.axis = 0;
  return bld->make(op_kind::concat, xs, std::move(attrs), {}, loc);
}

expr gather(const expr& table, const expr& indices, source_loc loc) {
  builder* bld = owner_of({&table, &indices});
  if (!bld) return {};
  return bld->make(op_kind::gather, {table, indices}, {}, {}, loc);
}

expr scatter_add(const expr& indices, const expr& updates, shape table_shape, source_loc loc) {
  builder* bld = owner_of({&indices, &updates});
  if (!bld) return {};
  return bld->make(op_kind::scatter_add, {indices, updates}, {}, {updates.type(), std::move(table_shape)}, loc);
}

}  // namespace mesh
