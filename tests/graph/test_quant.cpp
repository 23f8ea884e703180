// Block-quantized dtypes (graph/quant.hpp) and the two ops of model inference, linear and
// kv_write: byte counts, tensor checks, the quantizer against the reference decoder, typing and
// validation rules, and the reference evaluator. The decoder itself is checked against numpy
// in tests/models/test_dequantize.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "graph/builder.hpp"
#include "graph/evaluate.hpp"
#include "graph/quant.hpp"
#include "graph/validate.hpp"

using namespace mesh;

namespace {

constexpr dtype quantized[] = {dtype::q8_0, dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q4_k, dtype::q5_k, dtype::q6_k};

std::vector<double> random_values(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

graph finished(builder& b) {
  auto g = b.finish();
  INFO((g ? std::string() : g.error().to_string()));
  REQUIRE(g);
  return *g;
}

std::string validation_error(const graph& g) {
  auto ok = validate(g);
  return ok ? std::string() : ok.error().message;
}

}  // namespace

TEST_CASE("quantized dtypes: ggml's block sizes, byte counts and names", "[graph][quant]") {
  CHECK(block_elements(dtype::q8_0) == 32);
  CHECK(block_bytes(dtype::q8_0) == 34);
  CHECK(block_elements(dtype::q4_0) == 32);
  CHECK(block_bytes(dtype::q4_0) == 18);
  CHECK(block_elements(dtype::q4_k) == 256);
  CHECK(block_bytes(dtype::q4_k) == 144);
  CHECK(block_elements(dtype::q6_k) == 256);
  CHECK(block_bytes(dtype::q6_k) == 210);
  CHECK(block_elements(dtype::q4_1) == 32);
  CHECK(block_bytes(dtype::q4_1) == 20);
  CHECK(block_elements(dtype::q5_0) == 32);
  CHECK(block_bytes(dtype::q5_0) == 22);
  CHECK(block_elements(dtype::q5_1) == 32);
  CHECK(block_bytes(dtype::q5_1) == 24);
  CHECK(block_elements(dtype::q5_k) == 256);
  CHECK(block_bytes(dtype::q5_k) == 176);
  CHECK(block_bytes(dtype::bf16) == 2);
  CHECK(static_cast<int>(dtype::q8_0) == 4);  // wire values
  CHECK(static_cast<int>(dtype::q6_k) == 7);
  CHECK(static_cast<int>(dtype::q4_1) == 8);
  CHECK(static_cast<int>(dtype::q5_0) == 9);
  CHECK(static_cast<int>(dtype::q5_1) == 10);
  CHECK(static_cast<int>(dtype::q5_k) == 11);
  CHECK(dtype_count == 12);
  CHECK(std::string(to_string(dtype::q5_0)) == "q5_0");
  CHECK(std::string(to_string(dtype::q5_k)) == "q5_k");
  for (dtype t : quantized) CHECK(is_quantized(t));
  CHECK(std::string(to_string(dtype::q4_k)) == "q4_k");
  CHECK(!is_float(dtype::q4_0));
  CHECK(is_quantized(dtype::q6_k));
  CHECK(!is_quantized(dtype::i32));
  CHECK(byte_size(dtype::q4_k, {3, 512}) == 3 * 2 * 144);
  CHECK(byte_size(dtype::q8_0, {2, 5, 64}) == 10 * 2 * 34);
  CHECK(byte_size(dtype::f16, {3, 5}) == 30);
  CHECK(byte_size(dtype::q8_0, {2, 33}) == -1);  // not whole blocks
  CHECK(byte_size(dtype::q8_0, {}) == -1);       // no rows
  CHECK(*row_bytes(dtype::q6_k, 512) == 420);
  CHECK(*row_bytes(dtype::q5_0, 896) == 28 * 22);  // Qwen2.5-0.5B's hidden size: not whole 256s
  CHECK(byte_size(dtype::q5_0, {3, 96}) == 3 * 3 * 22);
  CHECK(byte_size(dtype::q5_k, {2, 512}) == 2 * 2 * 176);
  CHECK(byte_size(dtype::q5_k, {2, 896}) == -1);
  auto r = row_bytes(dtype::q4_0, 40);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "a row of 40 q4_0 elements is not a whole number of 32-element blocks");
}

TEST_CASE("quantized tensors: check() wants whole blocks and exact byte counts", "[graph][quant]") {
  tensor t = tensor::zeros(dtype::q4_k, {2, 256});
  CHECK(t.bytes.size() == 288);
  CHECK(t.check());
  t.bytes.pop_back();
  auto bad = t.check();
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message == "tensor [2,256] of q4_k needs 288 bytes, has 287");
  tensor odd;
  odd.type = dtype::q8_0;
  odd.dims = {4, 48};
  auto e = odd.check();
  REQUIRE_FALSE(e);
  CHECK(e.error().message.find("not a multiple of the 32-element block") != std::string::npos);
  tensor scalar;
  scalar.type = dtype::q6_k;
  REQUIRE_FALSE(scalar.check());
  const tensor_view view{dtype::q8_0, {1, 32}, std::span<const uint8_t>(t.bytes.data(), 33)};
  auto v = view.check();
  REQUIRE_FALSE(v);
  CHECK(v.error().message == "tensor [1,32] of q8_0 needs 34 bytes, has 33");
}

TEST_CASE("the quantizer round-trips through the reference decoder within each format's precision", "[graph][quant]") {
  // Error bound relative to the largest magnitude: 8-bit ~1/127, 4-bit ~1/8 of a block's range;
  // the k-quants add the 6/8-bit rounding of their sub-block scales.
  // q4_1/q5_1 spend their levels on the block's [min, max]; a 5th bit halves a 4-bit step.
  const std::pair<dtype, double> bounds[] = {{dtype::q8_0, 0.01}, {dtype::q4_0, 0.13}, {dtype::q4_1, 0.1}, {dtype::q5_0, 0.07},
                                             {dtype::q5_1, 0.05}, {dtype::q4_k, 0.1},  {dtype::q5_k, 0.05}, {dtype::q6_k, 0.04}};
  for (const auto& [t, bound] : bounds) {
    INFO(to_string(t));
    const auto values = random_values(3 * 512, 7, 2.0);
    const tensor q = tensor::from_values(t, {3, 512}, values);
    REQUIRE(q.check());
    const auto back = q.to_doubles();
    double worst = 0;
    for (size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(back[i] - values[i]));
    CHECK(worst / 2.0 <= bound);
    // Element access decodes the same values as whole rows.
    for (int64_t i : {int64_t{0}, int64_t{31}, int64_t{255}, int64_t{256}, int64_t{777}, int64_t{1535}})
      CHECK(q.at(i) == back[static_cast<size_t>(i)]);
  }
  // All-zero and constant rows (a zero scale) stay exact.
  for (dtype t : quantized) {
    const tensor z = tensor::from_values(t, {1, 256}, std::vector<double>(256, 0.0));
    for (double x : z.to_doubles()) CHECK(x == 0.0);
  }
}

TEST_CASE("quantized dtypes are leaves read by linear (or dequantized by a cast) and nothing else", "[graph][quant][validate]") {
  {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 64});
    auto w = b.parameter("w", dtype::q8_0, {3, 64});
    b.output("y", linear(x, w));
    b.output("wf", cast(w, dtype::f32));
    CHECK(validation_error(finished(b)).empty());
  }
  {
    builder b;
    auto w = b.parameter("w", dtype::q4_0, {3, 64});
    b.output("y", w + w);
    auto g = b.finish();
    REQUIRE_FALSE(g);
    CHECK(g.error().message.find("quantized tensors are read only as the weight of linear") != std::string::npos);
  }
  {
    builder b;  // the weight shape must hold whole blocks
    b.parameter("w", dtype::q4_k, {3, 64});
    REQUIRE_FALSE(b.finish());
  }
  {
    builder b;  // a quantized tensor cannot be returned ...
    auto w = b.parameter("w", dtype::q6_k, {1, 256});
    b.output("w", w);
    const std::string e = validation_error(finished(b));
    CHECK(e.find("node %0 (parameter): output \"w\" is q6_k") != std::string::npos);
  }
  {
    builder b;  // ... nor updated
    auto w = b.parameter("w", dtype::q8_0, {1, 32});
    auto w2 = b.parameter("w2", dtype::q8_0, {1, 32});
    b.update(w, w2);
    CHECK(validation_error(finished(b)).find("quantized parameters are frozen") != std::string::npos);
  }
  {
    graph g;  // a hand-made graph that computes into a quantized dtype names the node
    node in;
    in.op = op_kind::input;
    in.type = dtype::f32;
    in.dims = {1, 32};
    in.attrs.name = "x";
    node c;
    c.op = op_kind::cast;
    c.type = dtype::q8_0;
    c.dims = {1, 32};
    c.inputs = {0};
    g.nodes = {in, c};
    CHECK(validation_error(g).find("node %1 (cast): cast: cannot produce q8_0") == 0);
  }
}

TEST_CASE("linear: x [..., k] times w [n, k] transposed, any weight dtype, typed like x", "[graph][linear]") {
  builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 4});
  auto w = b.parameter("w", dtype::f32, {5, 4});
  auto y = linear(x, w);
  CHECK(y.dims() == shape{2, 3, 5});
  auto x16 = b.input("x16", dtype::f16, {4});
  CHECK(linear(x16, w).type() == dtype::f16);
  CHECK(linear(x16, w).dims() == shape{5});
  b.output("y", y);
  const graph g = finished(b);
  const auto xs = random_values(24, 1), ws = random_values(20, 2);
  auto out = evaluate(g, {{"x", tensor::from_values(dtype::f32, {2, 3, 4}, xs)}, {"x16", tensor::zeros(dtype::f16, {4})}},
                      {{"w", tensor::from_values(dtype::f32, {5, 4}, ws)}});
  REQUIRE(out);
  const auto got = out->outputs.at("y").to_doubles();
  for (int r = 0; r < 6; ++r)
    for (int j = 0; j < 5; ++j) {
      double want = 0;
      for (int p = 0; p < 4; ++p) want += static_cast<double>(static_cast<float>(xs[r * 4 + p])) * static_cast<float>(ws[j * 4 + p]);
      CHECK(got[static_cast<size_t>(r * 5 + j)] == Approx(want).epsilon(1e-6));
    }
  builder bad;
  auto bx = bad.input("x", dtype::f32, {2, 4});
  auto bw = bad.parameter("w", dtype::f32, {4, 5});  // [k, n]: the other layout
  linear(bx, bw);
  auto e = bad.finish();
  REQUIRE_FALSE(e);
  CHECK(e.error().message.find("linear: needs x [..., k] and w [n, k], got [2,4] and [4,5]") != std::string::npos);
}

TEST_CASE("linear with a quantized weight evaluates on its decoded values", "[graph][linear][quant]") {
  for (dtype t : quantized) {
    INFO(to_string(t));
    builder b;
    auto x = b.input("x", dtype::f32, {3, 256});
    auto w = b.parameter("w", t, {7, 256});
    b.output("y", linear(x, w));
    b.output("wf", cast(w, dtype::f32));
    const graph g = finished(b);
    const tensor wq = tensor::from_values(t, {7, 256}, random_values(7 * 256, 3));
    const tensor xt = tensor::from_values(dtype::f32, {3, 256}, random_values(3 * 256, 4));
    auto out = evaluate(g, {{"x", xt}}, {{"w", wq}});
    REQUIRE(out);
    const auto wd = wq.to_doubles(), xd = xt.to_doubles(), y = out->outputs.at("y").to_doubles();
    CHECK(out->outputs.at("wf").to_doubles() == wd);
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 7; ++j) {
        double want = 0;
        for (int p = 0; p < 256; ++p) want += xd[static_cast<size_t>(r * 256 + p)] * wd[static_cast<size_t>(j * 256 + p)];
        CHECK(y[static_cast<size_t>(r * 7 + j)] == Approx(want).epsilon(1e-5).margin(1e-5));
      }
    // evaluate_nodes hands a quantized leaf back as bound, not re-encoded.
    auto nodes = evaluate_nodes(g, {{"x", xt}}, {{"w", wq}});
    REQUIRE(nodes);
    CHECK((*nodes)[1] == wq);
  }
}

TEST_CASE("kv_write writes the value at a runtime position and is the cache's update", "[graph][kv_write]") {
  builder b;
  auto cache = b.parameter("cache", dtype::f32, {2, 5, 3});  // [heads, positions, dim]
  auto v = b.input("v", dtype::f32, {2, 2, 3});
  auto pos = b.input("pos", dtype::i32, {});
  auto updated = kv_write(cache, v, pos, -2);
  b.update(cache, updated);
  b.output("sum", sum_all(updated));
  const graph g = finished(b);
  CHECK(validation_error(g).empty());
  const auto cv = random_values(30, 5), vv = random_values(12, 6);
  const tensor c0 = tensor::from_values(dtype::f32, {2, 5, 3}, cv);
  const tensor vt = tensor::from_values(dtype::f32, {2, 2, 3}, vv);
  auto out = evaluate(g, {{"v", vt}, {"pos", tensor::from_ints({}, {3})}}, {{"cache", c0}});
  REQUIRE(out);
  const auto after = out->params.at("cache").to_doubles();
  for (int h = 0; h < 2; ++h)
    for (int p = 0; p < 5; ++p)
      for (int d = 0; d < 3; ++d) {
        const size_t i = static_cast<size_t>((h * 5 + p) * 3 + d);
        const double want = p >= 3 ? static_cast<float>(vv[static_cast<size_t>((h * 2 + p - 3) * 3 + d)]) : static_cast<float>(cv[i]);
        CHECK(after[i] == want);
      }
  // A slice past the end is an error in the checked mode, dropped as on a device otherwise.
  auto strict = evaluate(g, {{"v", vt}, {"pos", tensor::from_ints({}, {4})}}, {{"cache", c0}});
  REQUIRE_FALSE(strict);
  CHECK(strict.error().message.find("kv_write (node 3): position 4 + 2 rows does not fit the 5 rows") == 0);
  auto lenient = evaluate(g, {{"v", vt}, {"pos", tensor::from_ints({}, {4})}}, {{"cache", c0}}, index_check::as_devices);
  REQUIRE(lenient);
  CHECK(lenient->params.at("cache").at(4 * 3) == static_cast<float>(vv[0]));
}

TEST_CASE("kv_write with a position per row puts each row in its place and skips negative ones", "[graph][kv_write]") {
  builder b;
  auto cache = b.parameter("cache", dtype::f32, {6, 2});  // two sequences of 3 rows: a batch's slots
  auto v = b.input("v", dtype::f32, {3, 2});
  auto rows = b.input("rows", dtype::i32, {3});
  b.update(cache, kv_write(cache, v, rows, 0));
  const graph g = finished(b);
  CHECK(validation_error(g).empty());
  const tensor c0 = tensor::from_floats({6, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const tensor vt = tensor::from_floats({3, 2}, {-1, -2, -3, -4, -5, -6});
  auto out = evaluate(g, {{"v", vt}, {"rows", tensor::from_ints({3}, {4, -1, 1})}}, {{"cache", c0}});
  REQUIRE(out);
  // Row 0 to cache row 4, row 1 nowhere, row 2 to cache row 1.
  CHECK(out->params.at("cache").to_doubles() == std::vector<double>{0, 1, -5, -6, 4, 5, 6, 7, -1, -2, 10, 11});
  auto strict = evaluate(g, {{"v", vt}, {"rows", tensor::from_ints({3}, {0, 6, 1})}}, {{"cache", c0}});
  REQUIRE_FALSE(strict);
  CHECK(strict.error().message.find("kv_write (node 3): row 1 to position 6 does not fit the 6 rows") == 0);
  builder bad;  // one position per row, no more, no less
  auto bc = bad.parameter("cache", dtype::f32, {6, 2});
  kv_write(bc, bad.input("v", dtype::f32, {3, 2}), bad.input("rows", dtype::i32, {2}), 0);
  auto e = bad.finish();
  REQUIRE_FALSE(e);
  CHECK(e.error().message.find("pos must be an i32 scalar or one i32 per row of the value (3)") != std::string::npos);
}

TEST_CASE("kv_write's cache is a parameter that nothing else reads, updated with it", "[graph][kv_write][validate]") {
  {
    builder b;  // no update
    auto cache = b.parameter("cache", dtype::f32, {4, 2});
    auto pos = b.input("pos", dtype::i32, {});
    b.output("y", kv_write(cache, b.input("v", dtype::f32, {1, 2}), pos, 0));
    CHECK(validation_error(finished(b)).find("must update parameter \"cache\" with this kv_write") != std::string::npos);
  }
  {
    builder b;  // another reader would see the cache half-written
    auto cache = b.parameter("cache", dtype::f32, {4, 2});
    auto pos = b.input("pos", dtype::i32, {});
    auto w = kv_write(cache, b.input("v", dtype::f32, {1, 2}), pos, 0);
    b.update(cache, w);
    b.output("old", cache * 2.0);
    CHECK(validation_error(finished(b)).find("is read by another node or returned") != std::string::npos);
  }
  {
    builder b;  // not a parameter
    auto cache = b.input("cache", dtype::f32, {4, 2});
    b.output("y", kv_write(cache, b.input("v", dtype::f32, {1, 2}), b.input("pos", dtype::i32, {}), 0));
    CHECK(validation_error(finished(b)).find("must be a parameter") != std::string::npos);
  }
  {
    builder b;  // typing: pos must be an i32 scalar, the value must fit
    auto cache = b.parameter("cache", dtype::f32, {4, 2});
    kv_write(cache, b.input("v", dtype::f32, {5, 2}), b.input("pos", dtype::i32, {}), 0);
    auto e = b.finish();
    REQUIRE_FALSE(e);
    CHECK(e.error().message.find("does not fit cache [4,2] along axis 0") != std::string::npos);
  }
}
