#pragma once
// The small training problem the process tests share (training and chaos): a two-moons MLP,
// its options, and the state one meshnode of its own reaches (the reference).
#include <algorithm>
#include <cmath>

#include "client/trainer.hpp"
#include "graph/datasets.hpp"
#include "graph/nn.hpp"
#include "node_harness.hpp"

namespace mesh::test {

struct problem {
  graph model;
  tensor_map params, data;
};

inline problem moons(int64_t micro_batch = 16) {
  problem p;
  builder b;
  auto x = b.input("x", dtype::f32, {micro_batch, 2});
  auto labels = b.input("labels", dtype::i32, {micro_batch});
  auto net = nn::make_mlp(b, "mlp", {2, 32, 2});
  b.output("loss", nn::cross_entropy(net(x), labels));
  p.model = *b.finish();
  p.params = nn::init_parameters(p.model, 5);
  auto [xs, ys] = datasets::two_moons(320, 3);
  p.data = {{"x", xs}, {"labels", ys}};
  return p;
}

inline train_options options(uint64_t steps) {
  train_options o;
  o.steps = steps;
  o.micro_batches = 6;
  o.optimizer = optim::adam_options{.lr = 0.02};
  o.timeout = std::chrono::minutes(3);
  return o;
}

/// Largest |a - b| / (1 + |b|) over every tensor of `b`.
inline double max_difference(const tensor_map& a, const tensor_map& b) {
  double worst = 0;
  for (const auto& [name, t] : b) {
    const auto x = a.at(name).to_doubles(), y = t.to_doubles();
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  }
  return worst;
}

/// The state a run of `steps` steps ends with on one meshnode of its own: the reference.
inline tensor_map single_node_state(const problem& p, uint64_t steps) {
  temp_dir dir;
  node_process solo(dir.path / "solo");
  auto c = client::connect(solo.endpoint(), member_options());
  REQUIRE(c);
  auto r = trainer(**c, p.model, p.params, p.data, options(steps)).fit();
  REQUIRE(r);
  return r->state;
}

}  // namespace mesh::test
