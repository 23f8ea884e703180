// libFuzzer target for the kernel compiler's pure half (gpu::lower, gpu::emit): graphs come from
// peers, so every valid graph must lower and emit without crashing, whatever its shapes. The
// fuzz bytes drive a small graph builder that only makes well-typed ops (so nearly every input is
// a valid graph): elementwise ops, reductions over any axes, broadcasts, reshapes, permutes,
// slices, concats, gathers, matmuls (plain and transposed), softmax, layer norm, f16/bf16 casts
// and selects. Lowering runs with low split thresholds so that split reductions, rows kernels
// and their checks are reached on small tensors; emission runs for several device
// capabilities. No shader is compiled here (test_gpu_codegen compiles every kernel kind).
// Small all-f32 graphs also run differentially: the CPU back end against the reference
// evaluator, on the same random inputs and parameters (an i32 read through a float once made
// them differ past 2^24; this would have found it).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gpu/executor.hpp"
#include "graph/evaluate.hpp"

#include "graph/builder.hpp"
#include "graph/nn.hpp"
#include "graph/validate.hpp"
#include "gpu/glsl.hpp"
#include "gpu/plan.hpp"

namespace {

using namespace mesh;

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
expr step(builder& b, byte_source& in, std::vector<expr>& vals, int& params) {
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

/// Random inputs and parameters for `g` from `seed`: floats in [-1, 1], i32 (gather indices) in
/// [-1, 8] so that some fall out of range.
void random_bindings(const graph& g, uint64_t seed, tensor_map& inputs, tensor_map& params) {
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

/// Whether every value is finite and small enough that f32 rounding differences stay small.
bool tame(const tensor& t) {
  for (int64_t i = 0; i < t.size(); ++i)
    if (!std::isfinite(t.at(i)) || std::abs(t.at(i)) > 1e4) return false;
  return true;
}

/// The CPU back end and the reference evaluator agree on a small all-f32 graph.
void differential(const graph& g, uint64_t seed) {
  int64_t total = 0;
  for (const auto& n : g.nodes) {
    if (n.type != dtype::f32 && !(n.type == dtype::i32 && n.op == op_kind::input)) return;
    total += element_count(n.dims);
  }
  if (total > 20000) return;  // keeps the fuzzer fast
  tensor_map inputs, params;
  random_bindings(g, seed, inputs, params);
  const auto cpu = gpu::make_cpu_executor(1);  // fresh: parameter names repeat with other shapes
  if (!cpu->set_parameters(params)) std::abort();
  auto id = cpu->load(g);
  if (!id) std::abort();
  auto got = cpu->run(*id, inputs);
  tensor_map ref_params = params;
  auto want = evaluate(g, inputs, ref_params);
  if (!got || !want) std::abort();
  for (const auto& [name, w] : *want) {
    const tensor& c = got->at(name);
    if (!tame(w) || !tame(c)) continue;  // overflow or NaN: rounding order decides, not a bug
    if (normalised_error(c, w) > 1e-3) {
      std::fprintf(stderr, "cpu and reference differ on output %s: normalised error %g\n", name.c_str(), normalised_error(c, w));
      for (node_id i = 0; i < g.size(); ++i) {
        std::fprintf(stderr, "  %%%d %s [", static_cast<int>(i), std::string(to_string(g[i].op)).c_str());
        for (auto d : g[i].dims) std::fprintf(stderr, " %lld", static_cast<long long>(d));
        std::fprintf(stderr, " ] <-");
        for (auto in : g[i].inputs) std::fprintf(stderr, " %%%d", static_cast<int>(in));
        std::fprintf(stderr, "\n");
      }
      for (int64_t i = 0; i < std::min<int64_t>(c.size(), 8); ++i) std::fprintf(stderr, "  [%lld] cpu %g ref %g\n", static_cast<long long>(i), c.at(i), w.at(i));
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  byte_source in{data, size};
  builder b;
  std::vector<expr> vals{b.input("x", dtype::f32, {1 + in.below(6), 1 + in.below(300)})};
  int params = 0;
  for (int i = 0; i < 24 && !in.done(); ++i) {
    const expr y = step(b, in, vals, params);
    if (!y.ok()) continue;
    if (element_count(y.dims()) > (1 << 20)) continue;
    vals.push_back(y);
  }
  b.output("out", vals.back());
  if (vals.size() > 2) b.output("mid", vals[vals.size() / 2]);
  auto g = b.finish();
  if (!g) return 0;  // an op the generator did not guard (the builder said why): not a codegen input
  if (!validate(*g)) std::abort();  // the builder only makes valid graphs

  gpu::split_options split;  // thresholds low enough for small tensors
  split.min_reduced = 8;
  split.min_slice = 8;
  split.target_groups = 16;
  split.max_slices = 8;
  const gpu::plan p = gpu::lower(*g, split, 2);
  gpu::device_caps caps[3];
  caps[0].subgroup_arithmetic = true;
  caps[0].storage16 = true;
  caps[1].storage16 = true;
  caps[1].shared_memory_bytes = 49152;
  caps[1].coopmat_f16 = true;
  caps[2].storage16 = false;  // f16/bf16 graphs must be refused, not crash
  caps[2].unroll_loops = false;
  for (const auto& c : caps)
    for (const auto& k : p.kernels) {
      auto src = gpu::emit(*g, p, k, c);
      if (!src) continue;
      if (src->bindings.empty() || src->writes < 1 || src->writes > src->bindings.size() || src->glsl.empty()) std::abort();
      for (auto id : src->bindings)
        if (id < 0 || id >= g->size() + static_cast<node_id>(p.scratch.size())) std::abort();
    }
  uint64_t seed = size;
  for (size_t i = 0; i < size; ++i) seed = seed * 131 + data[i];
  differential(*g, seed);
  return 0;
}
