// The DSL reports shape errors as values, at the line that made them, and never crashes.
#include <catch2/catch.hpp>

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
