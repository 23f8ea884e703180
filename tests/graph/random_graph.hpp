#pragma once
// Random valid graphs for round-trip tests and fuzz seeds.
#include <random>

#include "graph/builder.hpp"

namespace mesh::test {

/// A random valid graph of about `steps` ops over f32 matrices, with inputs, parameters,
/// constants, outputs and an update.
inline graph random_graph(uint64_t seed, int steps = 20) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  builder b;
  const int64_t r = 1 + static_cast<int64_t>(rng() % 4), c = 1 + static_cast<int64_t>(rng() % 4);
  std::vector<expr> xs = {b.input("x", dtype::f32, {r, c}), b.parameter("p", dtype::f32, {r, c}),
                          b.fill(0.5, dtype::f32, {r, c})};
  for (int s = 0; s < steps; ++s) {
    const expr a = xs[pick(xs.size())], z = xs[pick(xs.size())];
    expr y;
    switch (rng() % 9) {
      case 0: y = exp(a * 0.1); break;
      case 1: y = a.dims() == z.dims() ? a + z : a - 1.0; break;
      case 2: y = a.dims() == z.dims() ? maximum(a, z) : relu(a); break;
      case 3: y = a + sum(a, {0}, true); break;
      case 4: y = transpose(matmul(transpose(a), a)); y = matmul(a, y); break;
      case 5: y = select(compare(a, 0.0, compare_kind::gt), a, tanh(a)); break;
      case 6: y = reshape(transpose(reshape(a, {-1, 1})), a.dims()); break;
      case 7: y = concat({slice_axis(a, 0, 0, 1), slice_axis(a, 0, 1, a.dims()[0])}, 0); break;
      default: y = sigmoid(a) * 2.0; break;
    }
    if (y.ok()) xs.push_back(y);
  }
  b.output("out", xs.back());
  b.output("first", xs[3 % xs.size()]);
  b.update(xs[1], xs[xs.size() - 1].dims() == xs[1].dims() ? xs.back() : xs[1] * 0.5);
  auto g = b.finish();
  return g ? *g : graph{};
}

}  // namespace mesh::test
