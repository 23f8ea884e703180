// The DSL reports shape errors as values, at the line that made them, and never crashes.
#include <catch2/catch.hpp>

#include <type_traits>
#include <utility>

#include "graph/builder.hpp"

using namespace mesh;

TEST_CASE("a shape error names the file, line, op and shapes", "[graph][builder]") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 3});
  auto w = b.parameter("w", dtype::f32, {2, 5});
  const int line = __LINE__ + 1;
  auto h = relu(matmul(x, w));
  auto y = h + 1.0;  // poisoned: built from a poisoned expression
  CHECK_FALSE(h.ok());
  CHECK_FALSE(y.ok());
  b.output("y", y);
  auto g = b.finish();
  REQUIRE_FALSE(g);
  CHECK(g.error().code == error_code::shape_mismatch);
  const auto& msg = g.error().message;
  INFO(msg);
  CHECK(msg.find("test_builder.cpp:" + std::to_string(line)) != std::string::npos);
  CHECK(msg.find("matmul") != std::string::npos);
  CHECK(msg.find("[4,3]") != std::string::npos);
  CHECK(msg.find("[2,5]") != std::string::npos);
}

TEST_CASE("operators report the line of the expression", "[graph][builder]") {
  builder b;
  auto a = b.input("a", dtype::f32, {2, 3});
  auto c = b.input("c", dtype::f32, {4});
  const int line = __LINE__ + 1;
  auto y = a + c;
  CHECK_FALSE(y.ok());
  REQUIRE(b.first_error());
  INFO(b.first_error()->message);
  CHECK(b.first_error()->message.find(":" + std::to_string(line) + ":") != std::string::npos);
  CHECK(b.first_error()->message.find("cannot broadcast [2,3] with [4]") != std::string::npos);
}

TEST_CASE("the builder rejects misuse with errors, not crashes", "[graph][builder]") {
  SECTION("duplicate names") {
    builder b;
    b.input("x", dtype::f32, {1});
    b.parameter("x", dtype::f32, {1});
    REQUIRE_FALSE(b.finish());
  }
  SECTION("float op on integers") {
    builder b;
    auto i = b.input("i", dtype::i32, {2});
    exp(i);
    REQUIRE_FALSE(b.finish());
    CHECK(b.first_error()->code == error_code::dtype_mismatch);
  }
  SECTION("bad axes, reshape and slice") {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 3});
    CHECK_FALSE(sum(x, {5}).ok());
    CHECK_FALSE(reshape(x, {4, -1}).ok());
    CHECK_FALSE(slice(x, {0, 2}, {2, 1}).ok());
    CHECK_FALSE(permute(x, {0, 0}).ok());
    REQUIRE_FALSE(b.finish());
  }
  SECTION("expressions from two builders") {
    builder b1, b2;
    auto x = b1.input("x", dtype::f32, {2});
    auto y = b2.input("y", dtype::f32, {2});
    CHECK_FALSE((x + y).ok());
  }
  SECTION("update of a non-parameter or of another shape") {
    builder b;
    auto x = b.input("x", dtype::f32, {2});
    auto p = b.parameter("p", dtype::f32, {3});
    b.update(x, x);
    REQUIRE_FALSE(b.finish());
    builder b2;
    auto p2 = b2.parameter("p", dtype::f32, {3});
    b2.update(p2, b2.fill(0, dtype::f32, {2}));
    REQUIRE_FALSE(b2.finish());
    (void)p;
  }
  SECTION("a default-constructed expression") {
    expr nothing;
    CHECK_FALSE((nothing + 1.0).ok());
    CHECK_FALSE(relu(nothing).ok());
  }
}

TEST_CASE("the first error wins and later ones do not overwrite it", "[graph][builder]") {
  builder b;
  auto x = b.input("x", dtype::f32, {2});
  const int line = __LINE__ + 1;
  auto bad = matmul(x, x);
  auto worse = reshape(bad, {7});
  (void)worse;
  sum(x, {3});
  REQUIRE(b.first_error());
  CHECK(b.first_error()->message.find(":" + std::to_string(line) + ":") != std::string::npos);
}

namespace {

/// A model made by a factory: the builder leaves the function, its expressions with it.
struct small_model {
  builder b;
  expr x, w, h;
};

small_model make_small_model() {
  small_model m;
  m.x = m.b.input("x", dtype::f32, {4, 3});
  m.w = m.b.parameter("w", dtype::f32, {3, 2});
  m.h = relu(matmul(m.x, m.w));
  return m;
}

builder make_builder_with_input(expr& x) {
  builder b;
  x = b.input("x", dtype::f32, {2});
  return b;
}

}  // namespace

TEST_CASE("a builder moves, and its expressions follow it", "[graph][builder]") {
  static_assert(std::is_nothrow_move_constructible_v<builder> && std::is_nothrow_move_assignable_v<builder>);
  static_assert(!std::is_copy_constructible_v<builder> && !std::is_copy_assignable_v<builder>);
  SECTION("returned from a factory") {
    small_model m = make_small_model();
    // Moved again, so that the builder surely changed address whatever the compiler elided.
    small_model moved = std::move(m);
    CHECK(moved.h.owner() == &moved.b);
    CHECK(moved.x.dims() == shape{4, 3});
    moved.b.output("y", moved.h + moved.b.parameter("bias", dtype::f32, {2}));
    auto g = moved.b.finish();
    INFO((g ? std::string() : g.error().to_string()));
    REQUIRE(g);
    CHECK(g->find_leaf("w") == moved.w.id());
    CHECK(g->nodes[static_cast<size_t>(g->outputs.at(0).id)].dims == shape{4, 2});
  }
  SECTION("move construction and move assignment") {
    expr x;
    builder b = make_builder_with_input(x);
    builder c(std::move(b));
    CHECK(x.owner() == &c);
    auto y = x * 2.0;
    builder d;
    auto stale = d.input("z", dtype::f32, {1});
    (void)stale;  // d's own graph ends with the assignment below
    d = std::move(c);
    CHECK(x.owner() == &d);
    CHECK(y.owner() == &d);
    d.output("y", y + x);
    auto g = d.finish();
    REQUIRE(g);
    CHECK(g->find_leaf("x") == x.id());
    CHECK(g->find_leaf("z") < 0);
  }
  SECTION("errors recorded before the move are kept") {
    expr x;
    builder b = make_builder_with_input(x);
    auto bad = matmul(x, x);
    builder c = std::move(b);
    CHECK_FALSE((bad + 1.0).ok());
    REQUIRE(c.first_error());
    CHECK(c.first_error()->message.find("matmul") != std::string::npos);
  }
}

TEST_CASE("dims() is a value that stays right while nodes are added", "[graph][builder]") {
  static_assert(std::is_same_v<decltype(std::declval<expr>().dims()), shape>);
  builder b;
  auto x = b.input("x", dtype::f32, {5, 7});
  // Kept across many more nodes than the node vector had room for: a reference into it would
  // dangle here (AddressSanitizer reports the read as heap-use-after-free).
  const shape& kept = x.dims();
  expr y = x;
  for (int i = 0; i < 200; ++i) y = y + static_cast<double>(i);
  CHECK(kept == shape{5, 7});
  CHECK(y.dims() == shape{5, 7});
  CHECK(x.rank() == 2);
  CHECK(expr().dims().empty());
  CHECK(expr().rank() == 0);
}

TEST_CASE("expr::name() gives the name of an input or parameter", "[graph][builder]") {
  builder b;
  auto x = b.input("x", dtype::f32, {2});
  auto w = b.parameter("layer.w", dtype::f32, {2});
  CHECK(x.name() == "x");
  CHECK(w.name() == "layer.w");
  CHECK((x * w).name().empty());  // other nodes have no name
  CHECK(b.fill(1.0, dtype::f32, {2}).name().empty());
  CHECK(expr().name().empty());
  auto g = b.finish();
  REQUIRE(g);
  builder resumed(*g);  // names come from the graph, also when building on a finished one
  CHECK(resumed.at(w.id()).name() == "layer.w");
  CHECK(matmul(x, w).name().empty());  // poisoned (rank 1)
}
