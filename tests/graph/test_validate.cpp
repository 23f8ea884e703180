// validate() rejects every kind of malformed graph with an error naming the node and the rule.
#include <catch2/catch.hpp>

#include "graph/builder.hpp"
#include "graph/validate.hpp"

using namespace mesh;

namespace {

graph small_graph() {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 3});
  auto w = b.parameter("w", dtype::f32, {3, 4});
  b.output("y", relu(matmul(x, w)) + 1.0);
  b.update(w, w * 0.5);
  auto g = b.finish();
  REQUIRE(g);
  return *g;
}

void require_rejected(const graph& g, error_code code, const std::string& fragment) {
  auto r = validate(g);
  REQUIRE_FALSE(r);
  INFO(r.error().message);
  CHECK(r.error().code == code);
  CHECK(r.error().message.find(fragment) != std::string::npos);
}

}  // namespace

TEST_CASE("a built graph is valid", "[graph][validate]") { REQUIRE(validate(small_graph())); }

TEST_CASE("validate rejects forward references and cycles", "[graph][validate]") {
  auto g = small_graph();
  g.nodes[2].inputs[0] = 4;  // matmul reads a later node
  require_rejected(g, error_code::invalid_graph, "does not precede");
  auto self = small_graph();
  self.nodes[2].inputs[1] = 2;  // reads itself: a cycle
  require_rejected(self, error_code::invalid_graph, "node %2");
  auto negative = small_graph();
  negative.nodes[2].inputs[0] = -7;
  require_rejected(negative, error_code::invalid_graph, "does not precede");
}

TEST_CASE("validate rejects shape and dtype mismatches", "[graph][validate]") {
  auto g = small_graph();
  g.nodes[2].dims = {2, 5};  // declared shape disagrees with inference
  require_rejected(g, error_code::shape_mismatch, "declared f32[2,5]");
  auto t = small_graph();
  t.nodes[1].type = dtype::f16;  // matmul of f32 x f16
  require_rejected(t, error_code::dtype_mismatch, "matmul");
  auto u = small_graph();
  u.updates[0].value = 0;  // w <- x: wrong shape
  require_rejected(u, error_code::shape_mismatch, "update of \"w\"");
}

TEST_CASE("validate rejects out-of-range axes and attributes", "[graph][validate]") {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 3});
  b.output("s", sum(x, {1}));
  b.output("p", permute(x, {1, 0}));
  b.output("c", slice(x, {0, 0}, {1, 2}));
  auto g = b.finish();
  REQUIRE(g);
  REQUIRE(validate(*g));
  auto bad_axis = *g;
  bad_axis.nodes[1].attrs.axes = {2};
  require_rejected(bad_axis, error_code::invalid_graph, "axes out of range");
  auto bad_perm = *g;
  bad_perm.nodes[2].attrs.axes = {1, 1};
  require_rejected(bad_perm, error_code::invalid_graph, "not a permutation");
  auto bad_slice = *g;
  bad_slice.nodes[3].attrs.stops = {1, 9};
  require_rejected(bad_slice, error_code::invalid_graph, "out of range");
  auto hidden = *g;
  hidden.nodes[1].attrs.values = {1, 2, 3};  // data smuggled in an attribute the op does not use
  require_rejected(hidden, error_code::invalid_graph, "unexpected values");
  auto bad_op = *g;
  bad_op.nodes[1].op = static_cast<op_kind>(200);
  require_rejected(bad_op, error_code::invalid_graph, "unknown op");
  auto bad_type = *g;
  bad_type.nodes[0].type = static_cast<dtype>(77);
  require_rejected(bad_type, error_code::invalid_graph, "unknown dtype");
}

TEST_CASE("validate rejects absurd sizes and counts", "[graph][validate]") {
  auto g = small_graph();
  g.nodes[0].dims = {int64_t{1} << 40, int64_t{1} << 40};  // overflows any sane bound
  require_rejected(g, error_code::limit_exceeded, "exceeds");
  // No elements, but huge other dimensions: strides and reductions over them would still
  // multiply them (a CPU worker aborted on a 2^62-entry index table).
  auto empty_but_huge = small_graph();
  empty_but_huge.nodes[0].dims = {0, int64_t{1} << 31, int64_t{1} << 31};
  require_rejected(empty_but_huge, error_code::limit_exceeded, "exceeds");
  {
    builder b;  // an empty tensor of sane dimensions stays valid
    auto x = b.input("x", dtype::f32, {0, 3});
    b.output("s", sum(x, {1}));
    REQUIRE(b.finish());
    CHECK(validate(*b.finish()));
  }
  CHECK(bounded_element_count({0, 1 << 20, 1 << 20}, 1 << 30) == -1);
  CHECK(bounded_element_count({0, 1 << 10, 1 << 10}, 1 << 30) == 0);
  CHECK(bounded_element_count({3, 4}, 12) == 12);
  CHECK(bounded_element_count({3, 4}, 11) == -1);
  CHECK(bounded_element_count({}, 1) == 1);
  tensor t;
  t.type = dtype::f32;
  t.dims = {0, int64_t{1} << 40, int64_t{1} << 40};
  CHECK_FALSE(t.check());
  auto rank = small_graph();
  rank.nodes[0].dims = {1, 1, 1, 1, 1, 1, 1, 2};
  require_rejected(rank, error_code::limit_exceeded, "rank 8");
  auto neg = small_graph();
  neg.nodes[0].dims = {2, -3};
  require_rejected(neg, error_code::limit_exceeded, "negative");
  graph_limits tight;
  tight.max_nodes = 3;
  auto r = validate(small_graph(), tight);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::limit_exceeded);
  tight = {};
  tight.max_total_bytes = 64;
  CHECK_FALSE(validate(small_graph(), tight));
}

TEST_CASE("validate rejects bad outputs, updates and names", "[graph][validate]") {
  auto g = small_graph();
  g.outputs.push_back({"y", 0});
  require_rejected(g, error_code::invalid_graph, "used twice");
  auto o = small_graph();
  o.outputs[0].id = 99;
  require_rejected(o, error_code::invalid_graph, "missing node");
  auto u = small_graph();
  u.updates.push_back(u.updates[0]);
  require_rejected(u, error_code::invalid_graph, "updated twice");
  auto t = small_graph();
  t.updates[0].target = 0;  // an input, not a parameter
  require_rejected(t, error_code::invalid_graph, "not a parameter");
  auto n = small_graph();
  n.nodes[1].attrs.name = "x";
  require_rejected(n, error_code::invalid_graph, "used twice");
  auto c = small_graph();
  c.nodes[0].op = op_kind::constant;
  c.nodes[0].attrs = {};
  c.nodes[0].attrs.values = {1, 2};  // 2 values for 6 elements
  require_rejected(c, error_code::invalid_graph, "2 values");
}

TEST_CASE("a FLOP bomb of splatted constants is refused before it runs", "[graph][validate][budget]") {
  // Two 20,000 x 20,000 splats (a few bytes in a message, 1.6 GB each as values) multiplied:
  // 1.6e13 FLOP, hours on a CPU.
  builder b;
  auto a = b.fill(1.0, dtype::f32, {20000, 20000});
  auto c = b.fill(2.0, dtype::f32, {20000, 20000});
  b.output("y", matmul(a, c));
  auto g = b.finish();
  REQUIRE(g);  // the builder's own checks use the default budget, which this is within
  graph_limits node;
  node.max_flops = 1e13;  // meshnode's default --max-job-gflop
  auto r = validate(*g, node);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::limit_exceeded);
  CHECK_THAT(r.error().message, Catch::Contains("node %2"));
  CHECK_THAT(r.error().message, Catch::Contains("more than 10000 GFLOP"));
  node.max_flops = 2e13;
  CHECK(validate(*g, node));
}

TEST_CASE("scatter_add costs one FLOP per update, however small its result", "[graph][cost]") {
  builder b;
  auto idx = b.input("idx", dtype::i32, {100000});
  auto upd = b.input("upd", dtype::f32, {100000, 64});
  b.output("y", scatter_add(idx, upd, {2, 64}));
  auto g = b.finish();
  REQUIRE(g);
  graph_limits tight;
  tight.max_flops = 1e6;  // the result has 128 elements; the updates 6.4 million
  auto r = validate(*g, tight);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("GFLOP"));
}
