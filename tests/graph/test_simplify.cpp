// The simplifier shrinks graphs without changing what they compute.
#include <catch2/catch.hpp>

#include "graph/autodiff.hpp"
#include "graph/evaluate.hpp"
#include "graph/nn.hpp"
#include "graph/simplify.hpp"
#include "graph/validate.hpp"

using namespace mesh;

TEST_CASE("constant folding, identities and CSE", "[graph][simplify]") {
  builder b;
  auto x = b.input("x", dtype::f32, {3});
  auto two = b.scalar(1.0) + b.scalar(1.0);          // folds to a splat 2
  auto y = (x * 1.0 + 0.0) * two;                     // identities vanish
  auto z = exp(x) + exp(x);                           // CSE merges the two exps
  auto dead = sin(x);                                 // not needed by any output
  (void)dead;
  b.output("y", y);
  b.output("z", neg(neg(z)));
  auto g = b.finish();
  REQUIRE(g);
  simplify_stats st;
  const graph s = simplify(*g, &st);
  REQUIRE(validate(s));
  CHECK(st.folded > 0);
  CHECK(st.rewritten > 0);
  CHECK(st.merged > 0);
  CHECK(st.removed > 0);
  CHECK(s.nodes.size() < g->nodes.size());
  int exps = 0;
  for (const auto& n : s.nodes) exps += n.op == op_kind::exp;
  CHECK(exps == 1);
  const tensor_map in{{"x", tensor::from_floats({3}, {0.5f, -1, 2})}};
  auto a = evaluate(*g, in, {}), c = evaluate(s, in, {});
  REQUIRE(a);
  REQUIRE(c);
  CHECK(normalised_error(a->outputs.at("y"), c->outputs.at("y")) == 0);
  CHECK(normalised_error(a->outputs.at("z"), c->outputs.at("z")) < 1e-7);
}

TEST_CASE("a transformer gradient graph shrinks and keeps its values", "[graph][simplify]") {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 8});
  auto blk = nn::make_transformer_block(b, "blk", 8, 2);
  auto loss = mean_all(blk(x) * blk(x));
  auto gs = gradients(loss, {blk.attn.wq, blk.up.w});
  b.output("loss", loss);
  b.output("gq", gs[0]);
  b.output("gu", gs[1]);
  auto g = b.finish();
  REQUIRE(g);
  const graph s = simplify(*g);
  REQUIRE(validate(s));
  INFO(g->nodes.size() << " -> " << s.nodes.size() << " nodes");
  CHECK(s.nodes.size() * 10 < g->nodes.size() * 8);  // at least 20% smaller
  auto params = nn::init_parameters(*g, 1);
  std::vector<double> xv(48);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(static_cast<double>(i));
  const tensor_map in{{"x", tensor::from_values(dtype::f32, {2, 3, 8}, xv)}};
  auto a = evaluate(*g, in, params), c = evaluate(s, in, params);
  REQUIRE(a);
  REQUIRE(c);
  for (const char* name : {"loss", "gq", "gu"}) CHECK(normalised_error(a->outputs.at(name), c->outputs.at(name)) < 1e-6);
}

TEST_CASE("simplify keeps inputs, parameters and updates", "[graph][simplify]") {
  builder b;
  auto x = b.input("unused", dtype::f32, {2});
  auto p = b.parameter("p", dtype::f32, {2});
  b.update(p, p + 0.0);
  (void)x;
  auto g = b.finish();
  REQUIRE(g);
  const graph s = simplify(*g);
  REQUIRE(validate(s));
  CHECK(s.find_leaf("unused") >= 0);
  REQUIRE(s.updates.size() == 1);
  CHECK(s.updates[0].target == s.find_leaf("p"));
}
