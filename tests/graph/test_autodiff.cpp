// Gradients of every differentiable op and of the composites against central finite differences,
// evaluated in exact double precision (evaluate_exact), so the comparison can be tight.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>

#include "graph/autodiff.hpp"
#include "graph/evaluate.hpp"
#include "graph/nn.hpp"
#include "graph/validate.hpp"

using namespace mesh;

namespace {

/// Builds y = f(vars), forms loss = sum(y * r) with a fixed random r (so every output element
/// matters with a distinct weight), and checks d loss / d var against finite differences.
/// `fixed` gives values for leaves that are not variables (labels, indices).
void check_gradients(builder& b, const expr& y, const std::vector<expr>& vars, double lo = -1.0, double hi = 1.0,
                     std::map<std::string, std::vector<double>> fixed = {}) {
  REQUIRE(y.ok());
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> weight(-1.0, 1.0), value(lo, hi);
  std::vector<double> r(static_cast<size_t>(element_count(y.dims())));
  for (auto& v : r) v = weight(rng);
  const expr loss = sum_all(y * b.constant(tensor::from_values(dtype::f32, y.dims(), r)));
  const auto grads = gradients(loss, vars);
  auto g = b.finish();
  INFO((g ? std::string() : g.error().to_string()));
  REQUIRE(g);
  auto valid = validate(*g);
  INFO((valid ? std::string() : valid.error().to_string()));
  REQUIRE(valid);

  auto leaves = fixed;
  for (const auto& v : vars) {
    const auto& n = g->nodes[static_cast<size_t>(v.id())];
    std::vector<double> xs(static_cast<size_t>(element_count(n.dims)));
    for (auto& x : xs) x = value(rng);
    leaves[n.attrs.name] = xs;
  }
  for (const auto& n : g->nodes)  // other leaves (parameters not checked here) get fixed random values
    if ((n.op == op_kind::input || n.op == op_kind::parameter) && !leaves.count(n.attrs.name)) {
      std::vector<double> xs(static_cast<size_t>(element_count(n.dims)));
      for (auto& x : xs) x = value(rng);
      leaves[n.attrs.name] = xs;
    }
  auto base = evaluate_exact(*g, leaves);
  REQUIRE(base);
  const auto loss_at = [&](const std::map<std::string, std::vector<double>>& l) {
    auto vals = evaluate_exact(*g, l);
    REQUIRE(vals);
    return (*vals)[static_cast<size_t>(loss.id())][0];
  };
  const double h = 1e-6;
  for (size_t k = 0; k < vars.size(); ++k) {
    const std::string name = g->nodes[static_cast<size_t>(vars[k].id())].attrs.name;
    const auto& analytic = (*base)[static_cast<size_t>(grads[k].id())];
    REQUIRE(analytic.size() == leaves[name].size());
    for (size_t i = 0; i < analytic.size(); ++i) {
      auto plus = leaves, minus = leaves;
      plus[name][i] += h;
      minus[name][i] -= h;
      const double numeric = (loss_at(plus) - loss_at(minus)) / (2 * h);
      INFO("d loss / d " << name << "[" << i << "]: autodiff " << analytic[i] << ", finite difference " << numeric);
      REQUIRE(std::abs(analytic[i] - numeric) <= 1e-5 * std::max(1.0, std::abs(numeric)));
    }
  }
}

}  // namespace

TEST_CASE("gradients of unary ops", "[graph][autodiff]") {
  using fn = expr (*)(const expr&, source_loc);
  const std::pair<const char*, fn> anywhere[] = {{"neg", &neg},   {"abs", &mesh::abs}, {"exp", &mesh::exp},
                                                  {"tanh", &mesh::tanh}, {"sin", &mesh::sin}, {"cos", &mesh::cos},
                                                  {"relu", &relu}, {"sigmoid", &sigmoid}};
  for (auto [name, f] : anywhere) {
    DYNAMIC_SECTION(name) {
      builder b;
      auto x = b.input("x", dtype::f32, {2, 3});
      check_gradients(b, f(x, source_loc::current()), {x});
    }
  }
  const std::pair<const char*, fn> positive[] = {{"log", &mesh::log}, {"sqrt", &mesh::sqrt}, {"rsqrt", &rsqrt}};
  for (auto [name, f] : positive) {
    DYNAMIC_SECTION(name) {
      builder b;
      auto x = b.input("x", dtype::f32, {5});
      check_gradients(b, f(x, source_loc::current()), {x}, 0.5, 2.0);
    }
  }
  SECTION("cast") {
    builder b;
    auto x = b.input("x", dtype::f32, {3});
    check_gradients(b, cast(cast(x, dtype::f16), dtype::f32) * x, {x});
  }
}

TEST_CASE("gradients of binary ops with broadcasting", "[graph][autodiff]") {
  const char* names[] = {"add", "sub", "mul", "div", "max", "min", "pow"};
  for (const char* name : names) {
    DYNAMIC_SECTION(name) {
      builder b;
      auto x = b.input("x", dtype::f32, {2, 3});
      auto y = b.input("y", dtype::f32, {3});
      const std::string n = name;
      expr out = n == "add" ? x + y : n == "sub" ? x - y : n == "mul" ? x * y : n == "div" ? x / y
               : n == "max" ? maximum(x, y) : n == "min" ? minimum(x, y) : pow(x, y);
      check_gradients(b, out, {x, y}, 0.5, 2.0);
    }
  }
}

TEST_CASE("gradients of select, matmul and reductions", "[graph][autodiff]") {
  SECTION("select") {
    builder b;
    auto x = b.input("x", dtype::f32, {4});
    auto y = b.input("y", dtype::f32, {4});
    check_gradients(b, select(compare(x, y, compare_kind::gt), x * 2.0, y * y), {x, y});
  }
  SECTION("batched matmul with a broadcast weight") {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 3, 4});
    auto w = b.input("w", dtype::f32, {4, 5});
    check_gradients(b, matmul(x, w), {x, w});
  }
  SECTION("reduce_sum and reduce_max, keep_dims or not") {
    builder b;
    auto x = b.input("x", dtype::f32, {3, 4, 2});
    check_gradients(b, concat({reshape(sum(x, {0, 2}), {4}), reshape(max_over(x, {1}, true), {6})}, 0), {x});
  }
}

TEST_CASE("tied maxima share the gradient of reduce_max, which sums to the output's", "[graph][autodiff]") {
  // Finite differences have no answer at a tie; the rule is binary max's: the gradient over the
  // operands sums to g (binary max gives it all to the first; reduce_max splits it equally).
  builder b;
  auto x = b.input("x", dtype::f32, {2});
  auto m = b.input("m", dtype::f32, {2, 3, 2});
  auto gx = gradients(max_over(x, {0}), {x});
  // Over axes {1, 2} of m: group 0 has three tied maxima (5), group 1 a single one (9).
  auto gm = gradients(sum_all(max_over(m, {1, 2}) * b.constant(tensor::from_floats({2}, {1.f, 3.f}))), {m});
  b.output("gx", gx[0]);
  b.output("gm", gm[0]);
  auto g = b.finish();
  REQUIRE(g);
  auto out = evaluate(*g, {{"x", tensor::from_floats({2}, {1.f, 1.f})},
                           {"m", tensor::from_floats({2, 3, 2}, {5, 1, 5, 0, 2, 5, 9, 1, 2, 3, 4, 8})}}, {});
  REQUIRE(out);
  CHECK(out->outputs.at("gx").to_doubles() == std::vector<double>{0.5, 0.5});
  const auto gmv = out->outputs.at("gm").to_doubles();
  const double third = static_cast<double>(1.0f / 3.0f);
  for (size_t i = 0; i < 6; ++i) CHECK(gmv[i] == ((i == 0 || i == 2 || i == 5) ? Approx(third) : Approx(0.0)));
  for (size_t i = 6; i < 12; ++i) CHECK(gmv[i] == (i == 6 ? 3.0 : 0.0));
  CHECK(gmv[0] + gmv[2] + gmv[5] == Approx(1.0));
}

TEST_CASE("gradients of data movement and gather/scatter", "[graph][autodiff]") {
  SECTION("broadcast, reshape, permute") {
    builder b;
    auto x = b.input("x", dtype::f32, {3, 1});
    check_gradients(b, permute(reshape(broadcast_to(x, {2, 3, 4}), {6, 4}), {1, 0}), {x});
  }
  SECTION("slice and concat") {
    builder b;
    auto x = b.input("x", dtype::f32, {4, 5});
    auto y = b.input("y", dtype::f32, {2, 5});
    check_gradients(b, concat({slice(x, {1, 1}, {3, 4}), slice_axis(y, 1, 0, 3)}, 0), {x, y});
  }
  SECTION("gather and scatter_add") {
    builder b;
    auto table = b.input("table", dtype::f32, {5, 3});
    auto upd = b.input("upd", dtype::f32, {4, 3});
    auto idx = b.input("idx", dtype::i32, {4});
    auto out = concat({gather(table, idx), scatter_add(idx, upd, {5, 3})}, 0);
    check_gradients(b, out, {table, upd}, -1, 1, {{"idx", {1, 3, 1, 4}}});
  }
}

TEST_CASE("gradients of the composites", "[graph][autodiff]") {
  SECTION("softmax and log_softmax") {
    builder b;
    auto x = b.input("x", dtype::f32, {3, 4});
    check_gradients(b, concat({nn::softmax(x), nn::log_softmax(x, 0)}, 0), {x});
  }
  SECTION("cross-entropy") {
    builder b;
    auto logits = b.input("logits", dtype::f32, {4, 5});
    auto labels = b.input("labels", dtype::i32, {4});
    check_gradients(b, nn::cross_entropy(logits, labels), {logits}, -2, 2, {{"labels", {0, 4, 2, 2}}});
  }
  SECTION("mean squared error") {
    builder b;
    auto p = b.input("p", dtype::f32, {6});
    auto t = b.input("t", dtype::f32, {6});
    check_gradients(b, nn::mse(p, t), {p, t});
  }
  SECTION("layer norm") {
    builder b;
    auto x = b.input("x", dtype::f32, {3, 6});
    auto gamma = b.input("gamma", dtype::f32, {6});
    auto beta = b.input("beta", dtype::f32, {6});
    check_gradients(b, nn::layer_norm(x, gamma, beta), {x, gamma, beta});
  }
  SECTION("two-layer MLP") {
    builder b;
    auto x = b.input("x", dtype::f32, {4, 3});
    auto m = nn::make_mlp(b, "mlp", {3, 5, 2});
    check_gradients(b, m(x), {x, m.layers[0].w, m.layers[0].b, m.layers[1].w, m.layers[1].b});
  }
  SECTION("causal self-attention") {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 3, 4});
    auto att = nn::make_attention(b, "att", 4, 2);
    check_gradients(b, att(x), {x, att.wq, att.wk, att.wv, att.wo});
  }
  SECTION("transformer block") {
    builder b;
    auto x = b.input("x", dtype::f32, {1, 3, 4});
    auto blk = nn::make_transformer_block(b, "blk", 4, 2);
    check_gradients(b, blk(x), {x, blk.ln1_gamma, blk.attn.wq, blk.attn.wo, blk.up.w, blk.down.b, blk.ln2_beta});
  }
}

TEST_CASE("gradients of linear: d/dx = dy @ w, d/dw = dy^T x over the batch dims", "[graph][autodiff][linear]") {
  SECTION("f32 weight, batch dims") {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 3, 4});
    auto w = b.input("w", dtype::f32, {5, 4});
    check_gradients(b, linear(x, w), {x, w});
  }
  SECTION("one row, with an epilogue") {
    builder b;
    auto x = b.input("x", dtype::f32, {7});
    auto w = b.input("w", dtype::f32, {3, 7});
    check_gradients(b, tanh(linear(x, w)), {x, w});
  }
  SECTION("a quantized weight is dequantized for d/dx (its values given exactly here)") {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 32});
    b.parameter("w", dtype::q8_0, {3, 32});
    check_gradients(b, linear(x, b.at(1)), {x});
  }
}

TEST_CASE("gradients refuse quantized weights and kv_write", "[graph][autodiff]") {
  {
    builder b;
    auto x = b.input("x", dtype::f32, {1, 32});
    auto w = b.parameter("w", dtype::q4_0, {2, 32});
    auto gs = gradients(sum_all(linear(x, w)), {w});
    CHECK_FALSE(gs[0].ok());
    auto g = b.finish();
    REQUIRE_FALSE(g);
    CHECK(g.error().message.find("is q4_0: quantized weights are frozen") != std::string::npos);
  }
  {
    builder b;
    auto cache = b.parameter("cache", dtype::f32, {4, 2});
    auto v = b.input("v", dtype::f32, {1, 2});
    auto kv = kv_write(cache, v, b.input("pos", dtype::i32, {}), 0);
    b.update(cache, kv);
    auto gs = gradients(sum_all(kv * kv), {v});
    CHECK_FALSE(gs[0].ok());
    auto g = b.finish();
    REQUIRE_FALSE(g);
    CHECK(g.error().message.find("kv_write (node %3) is not differentiable") != std::string::npos);
  }
}

TEST_CASE("gradients reject a non-scalar loss and give zeros for unused variables", "[graph][autodiff]") {
  builder b;
  auto x = b.input("x", dtype::f32, {3});
  auto unused = b.input("u", dtype::f32, {2});
  auto gs = gradients(sum_all(x * x), {x, unused});
  REQUIRE(gs[1].ok());
  b.output("gu", gs[1]);
  auto g = b.finish();
  REQUIRE(g);
  auto out = evaluate(*g, {{"x", tensor::from_floats({3}, {1, 2, 3})}, {"u", tensor::from_floats({2}, {5, 5})}}, {});
  REQUIRE(out);
  CHECK(out->outputs.at("gu").to_doubles() == std::vector<double>{0, 0});

  builder b2;
  auto v = b2.input("v", dtype::f32, {3});
  auto bad = gradients(v * 2.0, {v});
  CHECK_FALSE(bad[0].ok());
  REQUIRE_FALSE(b2.finish());
}

TEST_CASE("gradients of a deep MLP (the builder's node list reallocates mid-rule)", "[graph][autodiff]") {
  // Regression: unbroadcast held a reference to a shape inside the node list while adding nodes;
  // a 4-layer MLP made the list grow at that moment and the bias gradients read freed memory.
  builder b;
  auto x = b.input("x", dtype::f32, {16, 2});
  auto labels = b.input("labels", dtype::i32, {16});
  auto net = nn::make_mlp(b, "mlp", {2, 8, 8, 8, 2});
  b.output("loss", nn::cross_entropy(net(x), labels));
  auto g = b.finish();
  REQUIRE(g);
  std::vector<node_index> params;
  for (node_index i = 0; i < g->size(); ++i)
    if ((*g)[i].op == op_kind::parameter) params.push_back(i);
  auto gg = grad(*g, g->find_output("loss"), params);
  REQUIRE(gg);
  for (size_t i = 0; i < params.size(); ++i) CHECK(gg->g[gg->grads[i]].dims == (*g)[params[i]].dims);
}
