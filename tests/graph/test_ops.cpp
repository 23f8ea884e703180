// Every op of the closed set against hand-computed values, with broadcasting and edge shapes.
#include <cmath>

#include "eval_helpers.hpp"

using namespace mesh;
using mesh::test::require_close;
using mesh::test::run;

TEST_CASE("unary ops match hand-computed values", "[graph][ops]") {
  const std::vector<double> xs = {-2.0, -0.5, 0.0, 0.5, 2.0};
  struct row {
    expr (*make)(const expr&, source_loc);
    double (*want)(double);
  };
  const row rows[] = {
      {&neg, [](double x) { return -x; }},
      {&mesh::abs, [](double x) { return std::fabs(x); }},
      {&mesh::exp, [](double x) { return std::exp(x); }},
      {&mesh::tanh, [](double x) { return std::tanh(x); }},
      {&mesh::sin, [](double x) { return std::sin(x); }},
      {&mesh::cos, [](double x) { return std::cos(x); }},
      {&relu, [](double x) { return x > 0 ? x : 0.0; }},
      {&sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }},
  };
  for (const auto& r : rows) {
    builder b;
    b.output("y", r.make(b.constant(tensor::from_values(dtype::f32, {5}, xs)), source_loc::current()));
    std::vector<double> want;
    for (double x : xs) want.push_back(static_cast<float>(r.want(x)));
    require_close(run(b), want, 1e-6);
  }
  // Ops defined only for positive inputs.
  builder b;
  auto p = b.constant(tensor::from_values(dtype::f32, {3}, {0.25, 1.0, 4.0}));
  b.output("y", concat({log(p), sqrt(p), rsqrt(p)}, 0));
  require_close(run(b), {std::log(0.25), 0.0, std::log(4.0), 0.5, 1.0, 2.0, 2.0, 1.0, 0.5}, 1e-6);
}

TEST_CASE("binary ops broadcast like numpy", "[graph][ops]") {
  builder b;
  auto a = b.constant(tensor::from_values(dtype::f32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  auto c = b.constant(tensor::from_values(dtype::f32, {2, 1}, {100, 200}));
  auto r = b.constant(tensor::from_values(dtype::f32, {3}, {10, 20, 30}));
  b.output("add", a + r);
  b.output("sub", a - c);
  b.output("mul", a * 2.0);
  b.output("div", 12.0 / a);
  b.output("pow", pow(a, 2.0));
  b.output("max", maximum(a, 3.5));
  b.output("min", minimum(a, c));
  b.output("outer", c * r);  // [2,1] x [3] -> [2,3]
  const tensor_map out = mesh::test::run_all(b);
  require_close(out.at("add").to_doubles(), {11, 22, 33, 14, 25, 36});
  require_close(out.at("sub").to_doubles(), {-99, -98, -97, -196, -195, -194});
  require_close(out.at("mul").to_doubles(), {2, 4, 6, 8, 10, 12});
  require_close(out.at("div").to_doubles(), {12, 6, 4, 3, 2.4, 2}, 1e-6);
  require_close(out.at("pow").to_doubles(), {1, 4, 9, 16, 25, 36});
  require_close(out.at("max").to_doubles(), {3.5, 3.5, 3.5, 4, 5, 6});
  require_close(out.at("min").to_doubles(), {1, 2, 3, 4, 5, 6});
  require_close(out.at("outer").to_doubles(), {1000, 2000, 3000, 2000, 4000, 6000});
  CHECK(out.at("outer").dims == shape{2, 3});
}

TEST_CASE("compare, select and cast", "[graph][ops]") {
  builder b;
  auto x = b.constant(tensor::from_values(dtype::f32, {4}, {-1.5, 0, 2.7, 3}));
  auto y = b.constant(tensor::from_values(dtype::f32, {4}, {0, 0, 3, 3}));
  b.output("lt", compare(x, y, compare_kind::lt));
  b.output("eq", compare(x, y, compare_kind::eq));
  b.output("ge", compare(x, y, compare_kind::ge));
  b.output("sel", select(compare(x, 0.0, compare_kind::gt), x, -x));
  b.output("int", cast(x, dtype::i32));
  b.output("half", cast(b.constant(tensor::from_values(dtype::f32, {1}, {1.0 / 3.0})), dtype::f16));
  const tensor_map out = mesh::test::run_all(b);
  CHECK(out.at("lt").type == dtype::i32);
  require_close(out.at("lt").to_doubles(), {1, 0, 1, 0});
  require_close(out.at("eq").to_doubles(), {0, 1, 0, 1});
  require_close(out.at("ge").to_doubles(), {0, 1, 0, 1});
  require_close(out.at("sel").to_doubles(), {1.5, 0, 2.7, 3}, 1e-6);
  require_close(out.at("int").to_doubles(), {-1, 0, 2, 3});
  CHECK(out.at("half").at(0) == Approx(0.333251953125));  // nearest f16 to 1/3
}

TEST_CASE("integer arithmetic truncates, and division by zero gives zero", "[graph][ops]") {
  builder b;
  auto a = b.constant(tensor::from_ints({4}, {7, -7, 5, 3}));
  auto d = b.constant(tensor::from_ints({4}, {2, 2, 0, -1}));
  b.output("y", a / d);
  require_close(run(b), {3, -3, 0, -3});
}

TEST_CASE("matmul, batched and with broadcast batch dimensions", "[graph][ops]") {
  builder b;
  auto a = b.constant(tensor::from_values(dtype::f32, {2, 2, 3}, {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0}));
  auto w = b.constant(tensor::from_values(dtype::f32, {3, 2}, {1, 0, 0, 1, 1, 1}));
  b.output("y", matmul(a, w));  // w broadcast over the batch
  require_close(run(b), {4, 5, 10, 11, 1, 0, 0, 1});
}

TEST_CASE("reductions over chosen axes, with and without keep_dims", "[graph][ops]") {
  builder b;
  auto x = b.constant(tensor::from_values(dtype::f32, {2, 3}, {1, 5, 3, 4, 2, 6}));
  b.output("y", sum(x, {1}));
  b.output("s0", sum(x, {0}, true));
  b.output("all", sum_all(x));
  b.output("max", max_over(x, {-1}));
  b.output("mean", mean(x, {0, 1}));
  const tensor_map out = mesh::test::run_all(b);
  require_close(out.at("y").to_doubles(), {9, 12});
  require_close(out.at("s0").to_doubles(), {5, 7, 9});
  CHECK(out.at("s0").dims == shape{1, 3});
  require_close(out.at("all").to_doubles(), {21});
  CHECK(out.at("all").dims.empty());
  require_close(out.at("max").to_doubles(), {5, 6});
  require_close(out.at("mean").to_doubles(), {3.5});
}

TEST_CASE("data movement: broadcast, reshape, permute, slice, concat", "[graph][ops]") {
  builder b;
  auto x = b.constant(tensor::from_values(dtype::f32, {2, 3}, {0, 1, 2, 3, 4, 5}));
  b.output("y", permute(x, {1, 0}));
  b.output("bc", broadcast_to(b.constant(tensor::from_values(dtype::f32, {3}, {7, 8, 9})), {2, 3}));
  b.output("rs", reshape(x, {3, -1}));
  b.output("sl", slice(x, {0, 1}, {2, 3}));
  b.output("cat0", concat({x, x}, 0));
  b.output("cat1", concat({x, slice_axis(x, 1, 0, 1)}, 1));
  const tensor_map out = mesh::test::run_all(b);
  require_close(out.at("y").to_doubles(), {0, 3, 1, 4, 2, 5});
  require_close(out.at("bc").to_doubles(), {7, 8, 9, 7, 8, 9});
  CHECK(out.at("rs").dims == shape{3, 2});
  require_close(out.at("sl").to_doubles(), {1, 2, 4, 5});
  CHECK(out.at("cat0").dims == shape{4, 3});
  require_close(out.at("cat1").to_doubles(), {0, 1, 2, 0, 3, 4, 5, 3});
}

TEST_CASE("gather and scatter_add pick and add rows", "[graph][ops]") {
  builder b;
  auto table = b.constant(tensor::from_values(dtype::f32, {3, 2}, {1, 2, 3, 4, 5, 6}));
  auto idx = b.constant(tensor::from_ints({2, 2}, {2, 0, 2, 1}));
  b.output("y", gather(table, idx));
  auto upd = b.constant(tensor::from_values(dtype::f32, {2, 2, 2}, {1, 1, 2, 2, 3, 3, 4, 4}));
  b.output("sa", scatter_add(idx, upd, {3, 2}));
  const tensor_map out = mesh::test::run_all(b);
  CHECK(out.at("y").dims == shape{2, 2, 2});
  require_close(out.at("y").to_doubles(), {5, 6, 1, 2, 5, 6, 3, 4});
  require_close(out.at("sa").to_doubles(), {2, 2, 4, 4, 4, 4});
}

TEST_CASE("an out-of-range gather or scatter_add index is an error that names the node and the index",
          "[graph][ops]") {
  builder b;
  auto table = b.parameter("table", dtype::f32, {3, 2});
  auto idx = b.input("idx", dtype::i32, {2, 2});
  auto picked = gather(table, idx);
  b.output("y", picked);
  auto g = b.finish();
  REQUIRE(g);
  const tensor_map params{{"table", tensor::from_values(dtype::f32, {3, 2}, {1, 2, 3, 4, 5, 6})}};
  for (int bad : {3, 7, -1}) {
    auto r = evaluate(*g, {{"idx", tensor::from_ints({2, 2}, {2, 0, bad, 1})}}, params);
    REQUIRE_FALSE(r);
    INFO(r.error().message);
    CHECK(r.error().code == error_code::invalid_argument);
    CHECK(r.error().message.find("gather (node " + std::to_string(picked.id()) + ")") != std::string::npos);
    CHECK(r.error().message.find("index " + std::to_string(bad) + " at position 2") != std::string::npos);
    CHECK(r.error().message.find("input \"idx\"") != std::string::npos);
    CHECK(r.error().message.find("3 rows") != std::string::npos);
  }
  // As on a device (index_check::as_devices), the bad index reads zeros instead.
  auto dev = evaluate(*g, {{"idx", tensor::from_ints({2, 2}, {2, 0, 7, 1})}}, params, index_check::as_devices);
  REQUIRE(dev);
  require_close(dev->outputs.at("y").to_doubles(), {5, 6, 1, 2, 0, 0, 3, 4});

  builder s;
  auto sidx = s.input("idx", dtype::i32, {2});
  auto added = scatter_add(sidx, s.fill(1.0, dtype::f32, {2, 2}), {3, 2});
  s.output("sa", added);
  auto sg = s.finish();
  REQUIRE(sg);
  auto r = evaluate(*sg, {{"idx", tensor::from_ints({2}, {1, 5})}}, {});
  REQUIRE_FALSE(r);
  INFO(r.error().message);
  CHECK(r.error().message.find("scatter_add (node " + std::to_string(added.id()) + "): index 5 at position 1") !=
        std::string::npos);
  auto sdev = evaluate(*sg, {{"idx", tensor::from_ints({2}, {1, 5})}}, {}, index_check::as_devices);
  REQUIRE(sdev);
  require_close(sdev->outputs.at("sa").to_doubles(), {0, 0, 1, 1, 0, 0});
}

TEST_CASE("edge shapes: rank 0, size-1 and empty dimensions", "[graph][ops]") {
  builder b;
  auto s = b.scalar(3.0);
  auto e = b.fill(1.0, dtype::f32, {0, 4});
  auto one = b.fill(2.0, dtype::f32, {1, 1});
  b.output("y", s * s + 1.0);
  b.output("empty", sum(e * 2.0, {0}));
  b.output("empty_mm", matmul(e, b.fill(1.0, dtype::f32, {4, 2})));
  b.output("one", one + b.fill(1.0, dtype::f32, {3, 1}));
  const tensor_map out = mesh::test::run_all(b);
  require_close(out.at("y").to_doubles(), {10});
  require_close(out.at("empty").to_doubles(), {0, 0, 0, 0});
  CHECK(out.at("empty_mm").dims == shape{0, 2});
  require_close(out.at("one").to_doubles(), {3, 3, 3});
}

TEST_CASE("inputs and parameters bind by name, updates come back beside the outputs", "[graph][ops]") {
  builder b;
  auto x = b.input("x", dtype::f32, {2});
  auto p = b.parameter("p", dtype::f32, {2});
  auto q = b.parameter("q", dtype::f32, {2});
  b.output("y", x * p + q);
  b.update(p, p + x);
  auto g = b.finish();
  REQUIRE(g);
  const tensor_map params{{"p", tensor::from_floats({2}, {1, 2})}, {"q", tensor::from_floats({2}, {0, 1})}};
  auto out = evaluate(*g, {{"x", tensor::from_floats({2}, {3, 4})}}, params);
  REQUIRE(out);
  require_close(out->outputs.at("y").to_doubles(), {3, 9});
  REQUIRE(out->outputs.size() == 1);
  // The returned parameters are the given ones with the updates applied; the argument is untouched.
  REQUIRE(out->params.size() == 2);
  require_close(out->params.at("p").to_doubles(), {4, 6});
  require_close(out->params.at("q").to_doubles(), {0, 1});
  require_close(params.at("p").to_doubles(), {1, 2});
  // A second run from the returned parameters continues from the update.
  auto again = evaluate(*g, {{"x", tensor::from_floats({2}, {3, 4})}}, out->params);
  REQUIRE(again);
  require_close(again->outputs.at("y").to_doubles(), {12, 25});
  require_close(again->params.at("p").to_doubles(), {7, 10});
  // Missing and mistyped bindings are clear errors.
  auto missing = evaluate(*g, {}, params);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("\"x\"") != std::string::npos);
  auto wrong = evaluate(*g, {{"x", tensor::from_floats({3}, {1, 2, 3})}}, params);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code == error_code::shape_mismatch);
}

TEST_CASE("i32 sums and scatter_adds wrap exactly past 2^53", "[graph][ops]") {
  // 2^23 * INT_MAX = 2^54 - 2^23: a double accumulator passes 2^53 on the way and rounds, giving
  // -4194304; the exact value modulo 2^32 (what every device's int adds give) is -2^23.
  const int64_t n = int64_t{1} << 23;
  builder b;
  auto c = b.fill(2147483647.0, dtype::i32, {n});
  b.output("sum", sum_all(c));
  b.output("sa", scatter_add(b.fill(0.0, dtype::i32, {n}), c, {1}));
  const tensor_map out = mesh::test::run_all(b);
  CHECK(out.at("sum").at(0) == -8388608);
  CHECK(out.at("sa").at(0) == -8388608);
}
