// Training on the CPU reference evaluator learns: an MLP fits XOR and two-moons with SGD and Adam
// written as graph updates (forward, backward and optimizer step in one graph).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "graph/autodiff.hpp"
#include "graph/datasets.hpp"
#include "graph/evaluate.hpp"
#include "graph/nn.hpp"
#include "graph/optim.hpp"
#include "graph/simplify.hpp"
#include "graph/validate.hpp"

using namespace mesh;

namespace {

using dataset = datasets::labelled;

struct trained {
  double first_loss = 0, last_loss = 0, accuracy = 0;
};

/// Builds one training-step graph (loss, logits, gradients, optimizer update), simplifies it,
/// then runs `steps` steps on the reference evaluator.
trained train(const dataset& d, int hidden, int steps, bool use_adam) {
  const int64_t n = d.x.dims[0];
  builder b;
  auto x = b.input("x", dtype::f32, {n, 2});
  auto labels = b.input("labels", dtype::i32, {n});
  auto model = nn::make_mlp(b, "mlp", {2, hidden, 2});
  auto logits = model(x);
  auto loss = nn::cross_entropy(logits, labels);
  std::vector<expr> params;
  for (auto& l : model.layers) {
    params.push_back(l.w);
    params.push_back(l.b);
  }
  auto grads = gradients(loss, params);
  if (use_adam) optim::adam(b, params, grads, {.lr = 0.05});
  else optim::sgd(b, params, grads, {.lr = 0.5, .momentum = 0.9});
  b.output("loss", loss);
  b.output("logits", logits);
  auto g = b.finish();
  INFO((g ? std::string() : g.error().to_string()));
  REQUIRE(g);
  const graph step = simplify(*g);
  REQUIRE(validate(step));
  auto params_now = nn::init_parameters(step, 7);
  const tensor_map inputs{{"x", d.x}, {"labels", d.y}};
  trained t;
  tensor_map out;
  for (int s = 0; s < steps; ++s) {
    auto r = evaluate(step, inputs, params_now);
    REQUIRE(r);
    out = std::move(r->outputs);
    params_now = std::move(r->params);
    if (s == 0) t.first_loss = out.at("loss").at(0);
  }
  t.last_loss = out.at("loss").at(0);
  const auto lg = out.at("logits").to_doubles();
  int correct = 0;
  for (int64_t i = 0; i < n; ++i) correct += ((lg[2 * i + 1] > lg[2 * i]) ? 1 : 0) == d.y.at(i);
  t.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return t;
}

}  // namespace

TEST_CASE("an MLP learns XOR with SGD + momentum", "[graph][training]") {
  auto t = train(datasets::xor_points(), 8, 300, false);
  INFO("loss " << t.first_loss << " -> " << t.last_loss);
  CHECK(t.last_loss < 0.05);
  CHECK(t.accuracy == 1.0);
}

TEST_CASE("an MLP learns XOR with Adam", "[graph][training]") {
  auto t = train(datasets::xor_points(), 8, 200, true);
  INFO("loss " << t.first_loss << " -> " << t.last_loss);
  CHECK(t.last_loss < 0.05);
  CHECK(t.accuracy == 1.0);
}

TEST_CASE("an MLP learns two-moons with Adam", "[graph][training]") {
  auto t = train(datasets::two_moons(128, 3), 16, 200, true);
  INFO("loss " << t.first_loss << " -> " << t.last_loss << ", accuracy " << t.accuracy);
  CHECK(t.last_loss < 0.3 * t.first_loss);
  CHECK(t.accuracy >= 0.95);
}

TEST_CASE("Adam on f16 and bf16 parameters computes in f32: a zero gradient is no NaN", "[graph][training]") {
  // In f16, eps = 1e-8 rounds to 0 and so does sqrt(v) for a zero gradient: 0 / 0 was NaN.
  std::map<dtype, std::vector<double>> after;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    INFO(to_string(t));
    builder b;
    auto x = b.input("x", t, {2});
    auto p = b.parameter("p", t, {2});
    auto grads = gradients(sum_all(p * x), {p});  // d/dp = x = [1, 0]
    optim::adam(b, {p}, grads, {});
    auto g = b.finish();
    REQUIRE(g);
    tensor_map params{{"p", tensor::from_values(t, {2}, {0.5, 0.5})},
                      {"opt.adam.t", tensor::scalar(0)},
                      {"opt.adam.m.p", tensor::zeros(t, {2})},
                      {"opt.adam.v.p", tensor::zeros(t, {2})}};
    auto r = evaluate(*g, {{"x", tensor::from_values(t, {2}, {1.0, 0.0})}}, params);
    REQUIRE(r);
    for (const char* name : {"p", "opt.adam.m.p", "opt.adam.v.p"}) {
      INFO(name);
      REQUIRE(r->params.at(name).type == t);
      for (double v : r->params.at(name).to_doubles()) CHECK(std::isfinite(v));
    }
    after[t] = r->params.at("p").to_doubles();
  }
  // One step with bias correction moves p by lr * g / (|g| + eps): 0.5 - 0.001 and 0.5.
  CHECK(after[dtype::f32][0] == Approx(0.499).epsilon(1e-6));
  CHECK(after[dtype::f32][1] == 0.5);
  for (dtype t : {dtype::f16, dtype::bf16})
    for (size_t i = 0; i < 2; ++i) {
      INFO(to_string(t) << " element " << i);
      CHECK(std::abs(after[t][i] - after[dtype::f32][i]) <= (t == dtype::f16 ? 5e-4 : 2e-3));
    }
}

TEST_CASE("cross_entropy with a label outside the classes is an error that names the labels", "[graph][nn]") {
  builder b;
  auto logits = b.input("logits", dtype::f32, {3, 4});
  auto labels = b.input("labels", dtype::i32, {3});
  b.output("loss", nn::cross_entropy(logits, labels));
  auto g = b.finish();
  REQUIRE(g);
  // Equal logits: every in-range label costs log(4). A label out of range once got a one-hot row
  // of zeros and cost nothing, which lowered the loss.
  const tensor lg = tensor::zeros(dtype::f32, {3, 4});
  auto ok = evaluate(*g, {{"logits", lg}, {"labels", tensor::from_ints({3}, {0, 3, 1})}}, {});
  REQUIRE(ok);
  CHECK(ok->outputs.at("loss").at(0) == Approx(std::log(4.0)));
  for (const graph& run : {*g, simplify(*g)})
    for (int bad : {4, 100, -1}) {
      auto r = evaluate(run, {{"logits", lg}, {"labels", tensor::from_ints({3}, {0, bad, 1})}}, {});
      REQUIRE_FALSE(r);
      INFO(r.error().message);
      CHECK(r.error().code == error_code::invalid_argument);
      CHECK(r.error().message.find("index " + std::to_string(bad) + " at position 1") != std::string::npos);
      CHECK(r.error().message.find("input \"labels\"") != std::string::npos);
      CHECK(r.error().message.find("4 rows") != std::string::npos);
    }
}
