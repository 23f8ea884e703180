#pragma once
// Well-typed random graphs driven by a byte string: the fuzz target fuzz_gpu_codegen feeds it
// fuzz bytes, test_gpu_random feeds it seeded random bytes. Nearly every byte string gives a
// valid graph: each step only makes ops whose shapes and dtypes fit (elementwise ops, reductions
// over any axes, the row pattern, broadcasts, reshapes, permutes, slices including empty ones,
// concats, gathers, plain and transposed matmuls, softmax, layer norm, f16/bf16 casts, selects,
// fresh inputs).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/nn.hpp"
#include "graph/tensor.hpp"

namespace mesh::test {

/// Reads the fuzz input a byte at a time (zeros once it runs out).
struct byte_source {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t next() { return at < size ? data[at++] : 0; }
  bool done() const { return at >= size; }
  int64_t below(int64_t n) { return n <= 1 ? 0 : next() % n; }
};

/// One well-typed op on the values built so far; returns an invalid expr when the bytes chose
/// something that would not type-check (the caller skips it).
inline expr step(builder& b, byte_source& in, std::vector<expr>& vals, int& params) {
  const expr& a = vals[static_cast<size_t>(in.below(static_cast<int64_t>(vals.size())))];
  const expr& c = vals[static_cast<size_t>(in.below(static_cast<int64_t>(vals.size())))];
  const shape d = a.dims();
  const auto rank = static_cast<int64_t>(d.size());
  const bool same = a.dims() == c.dims() && a.type() == c.type();
  const bool is_float = a.type() != dtype::i32;
  switch (in.below(16)) {
    case 0: {
      if (!is_float) return -a;
      switch (in.below(5)) {
        case 0: return exp(a * 0.1);
        case 1: return tanh(a);
        case 2: return sqrt(abs(a) + 1.0);
        case 3: return relu(a);
        default: return sigmoid(a);
      }
    }
    case 1:
      if (!same) return a * 2.0;
      switch (in.below(4)) {
        case 0: return a + c;
        case 1: return a - c;
        case 2: return a * c;
        default: return maximum(a, c);
      }
    case 2: {  // a reduction over a subset of axes
      if (rank == 0 || !is_float) return {};
      std::vector<int64_t> axes;
      const uint8_t mask = in.next();
      for (int64_t i = 0; i < rank; ++i)
        if (mask & (1u << i)) axes.push_back(i);
      if (axes.empty()) axes.push_back(rank - 1);
      const bool keep = mask & 0x80;
      return (mask & 0x40) ? max_over(a, axes, keep) : sum(a, axes, keep);
    }
    case 3: {  // the row pattern: a value per row broadcast back over the row
      if (rank == 0 || !is_float) return {};
      const expr r = (in.next() & 1) ? max_over(a, {rank - 1}, true) : mean(a, {rank - 1}, true);
      return (in.next() & 1) ? exp(a - r) : a * r;
    }
    case 4: {  // broadcast a size-1 axis (or add a leading one)
      shape to = d;
      bool grew = false;
      for (auto& x : to)
        if (x == 1) x = 1 + in.below(6), grew = true;
      if (!grew || to.size() < 4) to.insert(to.begin(), 1 + in.below(3));
      return broadcast_to(a, to);
    }
    case 5: {  // reshape: flatten, or split the element count into two axes
      const int64_t n = element_count(d);
      const int64_t k = 1 + in.below(6);
      if (n % k == 0 && (in.next() & 1)) return reshape(a, {n / k, k});
      return reshape(a, {n});
    }
    case 6: {  // permute
      if (rank < 2) return {};
      std::vector<int64_t> axes(static_cast<size_t>(rank));
      for (int64_t i = 0; i < rank; ++i) axes[static_cast<size_t>(i)] = i;
      for (int64_t i = rank - 1; i > 0; --i) std::swap(axes[static_cast<size_t>(i)], axes[static_cast<size_t>(in.below(i + 1))]);
      return permute(a, axes);
    }
    case 7: {  // slice one axis
      if (rank == 0) return {};
      const int64_t ax = in.below(rank), len = d[static_cast<size_t>(ax)];
      const int64_t start = in.below(len + 1), stop = start + in.below(len - start + 1);
      return slice_axis(a, ax, start, stop);
    }
    case 8:
      if (!same || rank == 0) return {};
      return concat({a, c}, in.below(rank));
    case 9: {  // matmul, plain or through transposes
      if (rank < 2 || rank > 3 || !is_float) return {};
      std::vector<int64_t> swap(static_cast<size_t>(rank));
      for (int64_t i = 0; i < rank; ++i) swap[static_cast<size_t>(i)] = i;
      std::swap(swap[static_cast<size_t>(rank - 1)], swap[static_cast<size_t>(rank - 2)]);
      const expr t = permute(a, swap);
      switch (in.below(3)) {
        case 0: return matmul(a, t);                // [.., m, k] x [.., k, m]
        case 1: return matmul(t, a);                // [.., k, m] x [.., m, k]
        default: {
          if (rank != 2) return matmul(a, t);
          const expr w = b.parameter("w" + std::to_string(params++), a.type(), {d[1], 1 + in.below(40)});
          return relu(matmul(a, w) + 1.0);
        }
      }
    }
    case 10:
      if (rank == 0 || !is_float) return {};
      return (in.next() & 1) ? nn::softmax(a) : nn::log_softmax(a);
    case 11: {
      if (rank == 0 || !is_float) return {};
      const int64_t len = d.back();
      const expr g = b.parameter("g" + std::to_string(params++), a.type(), {len});
      const expr be = b.parameter("b" + std::to_string(params++), a.type(), {len});
      return nn::layer_norm(a, g, be);
    }
    case 12:
      if (!same || !is_float) return {};
      return select(compare(a, 0.0, compare_kind::gt), a, c);
    case 13: {
      if (!is_float) return {};
      const dtype t = (in.next() & 1) ? dtype::f16 : dtype::bf16;
      return (in.next() & 1) ? cast(a, t) : cast(cast(a, t), dtype::f32);
    }
    case 14: {  // gather rows of a
      if (rank < 1 || d[0] == 0) return {};
      const expr idx = b.input("i" + std::to_string(params++), dtype::i32, {1 + in.below(5)});
      return gather(a, idx);
    }
    default: {  // a fresh input
      shape s;
      const int64_t r = 1 + in.below(3);
      for (int64_t i = 0; i < r; ++i) s.push_back(1 + in.below(9) * (1 + in.below(40)));
      if (element_count(s) > 20000) s = {7, 5};
      return b.input("x" + std::to_string(params++), dtype::f32, s);
    }
  }
}

/// A graph of up to `steps` ops from `bytes`, with outputs "out" (the last value) and "mid";
/// an error when the bytes chose an op the generator does not guard.
inline expected<graph> graph_from_bytes(const uint8_t* data, size_t size, int steps = 24) {
  byte_source in{data, size};
  builder b;
  std::vector<expr> vals{b.input("x", dtype::f32, {1 + in.below(6), 1 + in.below(300)})};
  int params = 0;
  for (int i = 0; i < steps && !in.done(); ++i) {
    const expr y = step(b, in, vals, params);
    if (!y.ok()) continue;
    if (element_count(y.dims()) > (1 << 20)) continue;
    vals.push_back(y);
  }
  b.output("out", vals.back());
  if (vals.size() > 2) b.output("mid", vals[vals.size() / 2]);
  return b.finish();
}

/// Random inputs and parameters for `g` from `seed`: floats in [-1, 1], i32 (gather indices) in
/// [-1, 8] so that some fall out of range.
inline void random_bindings(const graph& g, uint64_t seed, tensor_map& inputs, tensor_map& params) {
  for (const auto& n : g.nodes) {
    if (n.op != op_kind::input && n.op != op_kind::parameter) continue;
    std::vector<double> v(static_cast<size_t>(element_count(n.dims)));
    for (auto& x : v) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(seed >> 11) / 9007199254740992.0;
      x = n.type == dtype::i32 ? std::floor(-1 + u * 10) : -1 + 2 * u;
    }
    (n.op == op_kind::input ? inputs : params)[n.attrs.name] = tensor::from_values(n.type, n.dims, v);
  }
}

/// Whether `g` computes in f32 only (i32 inputs, the gather indices, allowed) and holds at most
/// `max_elements` elements over all its nodes: the graphs compared with the reference under one
/// f32 tolerance (f16 rounding, amplified by later ops, would need per-graph bounds).
inline bool small_f32_graph(const graph& g, int64_t max_elements) {
  int64_t total = 0;
  for (const auto& n : g.nodes) {
    if (n.type != dtype::f32 && !(n.type == dtype::i32 && n.op == op_kind::input)) return false;
    total += element_count(n.dims);
  }
  return total <= max_elements;
}

/// Whether every value is finite and small enough that f32 rounding differences stay small.
inline bool tame(const tensor& t) {
  for (int64_t i = 0; i < t.size(); ++i)
    if (!std::isfinite(t.at(i)) || std::abs(t.at(i)) > 1e4) return false;
  return true;
}

}  // namespace mesh::test
