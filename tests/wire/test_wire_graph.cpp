// WireGraph: round trips, and hostile bytes are rejected with errors (never a crash, never an
// unbounded allocation: this runs under ASan in CI).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "graph/builder.hpp"
#include "graph/validate.hpp"
#include "wire/wire_graph.hpp"
#include "../graph/random_graph.hpp"

using namespace mesh;

namespace {
wire_graph sample(uint64_t seed) {
  wire_graph w{test::random_graph(seed), {}};
  w.tensors["x"] = tensor::from_values(dtype::f32, w.g[w.g.find_leaf("x")].dims, std::vector<double>(
      static_cast<size_t>(element_count(w.g[w.g.find_leaf("x")].dims)), 1.5));
  w.tensors["h"] = tensor::from_values(dtype::f16, {3}, {1, 2, 3});
  return w;
}
}  // namespace

TEST_CASE("random valid graphs round-trip through WireGraph", "[wire][graph]") {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const wire_graph w = sample(seed);
    REQUIRE(validate(w.g));
    auto bytes = encode(w);
    REQUIRE(bytes);
    auto back = decode_wire_graph(bytes->data(), bytes->size());
    INFO((back ? std::string() : back.error().to_string()));
    REQUIRE(back);
    CHECK(*back == w);
  }
}

TEST_CASE("every truncation of a WireGraph is rejected", "[wire][graph]") {
  auto bytes = encode(sample(7));
  REQUIRE(bytes);
  for (size_t n = 0; n < bytes->size(); ++n) {
    auto r = decode_wire_graph(bytes->data(), n);
    REQUIRE_FALSE(r);
  }
  bytes->push_back(0);
  auto trailing = decode_wire_graph(bytes->data(), bytes->size());
  REQUIRE_FALSE(trailing);
  CHECK(trailing.error().message.find("trailing") != std::string::npos);
}

TEST_CASE("bit flips give an error or a graph that validates, never a crash", "[wire][graph]") {
  auto bytes = encode(sample(11));
  REQUIRE(bytes);
  std::mt19937_64 rng(5);
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    auto copy = *bytes;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) copy[rng() % copy.size()] ^= static_cast<char>(1u << (rng() % 8));
    auto r = decode_wire_graph(copy.data(), copy.size());
    if (!r) ++rejected;
    else CHECK(validate(r->g));
  }
  CHECK(rejected > 1000);
}

TEST_CASE("a version mismatch is a clear error", "[wire][graph]") {
  auto bytes = encode(sample(1));
  REQUIRE(bytes);
  // The version is the little-endian u32 after the 4-byte magic.
  (*bytes)[4] = 9;
  (*bytes)[5] = (*bytes)[6] = (*bytes)[7] = 0;
  auto r = decode_wire_graph(bytes->data(), bytes->size());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::version_mismatch);
  CHECK(r.error().message.find("version 9") != std::string::npos);
  (*bytes)[0] = 'X';
  CHECK(decode_wire_graph(bytes->data(), bytes->size()).error().code == error_code::decode_error);
}

TEST_CASE("oversized graphs and absurd lengths are rejected without allocating them", "[wire][graph]") {
  // A graph over the receiver's limits.
  auto bytes = encode(sample(3));
  REQUIRE(bytes);
  graph_limits small;
  small.max_nodes = 2;
  auto r = decode_wire_graph(bytes->data(), bytes->size(), small);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::limit_exceeded);
  // A header followed by a node count of 2^32 - 1: must fail fast, not reserve memory.
  std::vector<char> hostile(bytes->begin(), bytes->begin() + 8);
  for (uint8_t b : {0xff, 0xff, 0xff, 0xff}) hostile.push_back(static_cast<char>(b));
  hostile.resize(hostile.size() + 16, '\x01');
  REQUIRE_FALSE(decode_wire_graph(hostile.data(), hostile.size()));
  // A tensor whose bytes do not match its shape.
  wire_graph w = sample(4);
  w.tensors["x"].bytes.pop_back();
  auto bad = encode(w);
  REQUIRE(bad);
  auto t = decode_wire_graph(bad->data(), bad->size());
  REQUIRE_FALSE(t);
  CHECK(t.error().message.find("tensor \"x\"") != std::string::npos);
}

namespace {
/// A decode step: a quantized weight read by linear, a kv_write into a cache, and the weight's
/// blocks among the tensors.
wire_graph inference_sample() {
  builder b;
  auto x = b.input("x", dtype::f32, {1, 64});
  auto w = b.parameter("w", dtype::q4_0, {3, 64});
  auto cache = b.parameter("cache", dtype::f16, {4, 3});
  auto pos = b.input("pos", dtype::i32, {});
  auto y = linear(x, w);
  auto kv = kv_write(cache, reshape(cast(y, dtype::f16), {1, 3}), pos, 0);
  b.update(cache, kv);
  b.output("y", sum_all(cast(kv, dtype::f32)));
  auto g = b.finish();
  REQUIRE(g);
  wire_graph out{*g, {}};
  std::vector<double> values(192);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01 * static_cast<double>(i) - 0.9;
  out.tensors["w"] = tensor::from_values(dtype::q4_0, {3, 64}, values);
  out.tensors["k6"] = tensor::from_values(dtype::q6_k, {1, 256}, std::vector<double>(256, 0.25));
  // Every other block type travels as its bytes too (Q5_0 rows of 3 blocks: 66 bytes).
  out.tensors["q41"] = tensor::from_values(dtype::q4_1, {1, 32}, std::vector<double>(values.begin(), values.begin() + 32));
  out.tensors["q50"] = tensor::from_values(dtype::q5_0, {2, 96}, values);
  out.tensors["q51"] = tensor::from_values(dtype::q5_1, {3, 64}, values);
  out.tensors["k5"] = tensor::from_values(dtype::q5_k, {1, 256}, std::vector<double>(256, -0.5));
  return out;
}
}  // namespace

TEST_CASE("quantized tensors, linear and kv_write round-trip through WireGraph", "[wire][graph][quant]") {
  const wire_graph w = inference_sample();
  auto bytes = encode(w);
  REQUIRE(bytes);
  auto back = decode_wire_graph(bytes->data(), bytes->size());
  INFO((back ? std::string() : back.error().to_string()));
  REQUIRE(back);
  CHECK(*back == w);
  for (size_t n = 0; n < bytes->size(); n += 7) REQUIRE_FALSE(decode_wire_graph(bytes->data(), n));
}

TEST_CASE("hostile WireGraphs with quantized tensors are refused", "[wire][graph][quant]") {
  {  // a block short
    wire_graph w = inference_sample();
    w.tensors["w"].bytes.resize(w.tensors["w"].bytes.size() - 18);
    auto bytes = encode(w);
    REQUIRE(bytes);
    auto r = decode_wire_graph(bytes->data(), bytes->size());
    REQUIRE_FALSE(r);
    CHECK(r.error().message == "WireGraph tensor \"w\": tensor [3,64] of q4_0 needs 108 bytes, has 90");
  }
  {  // a shape that is not whole blocks
    wire_graph w = inference_sample();
    w.tensors["k6"].dims = {2, 128};
    auto bytes = encode(w);
    REQUIRE(bytes);
    auto r = decode_wire_graph(bytes->data(), bytes->size());
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("not a multiple of the 256-element block") != std::string::npos);
  }
  {  // a quantized leaf of a shape without whole blocks, and one used by an elementwise op
    wire_graph w = inference_sample();
    w.g.nodes[1].dims = {3, 48};
    auto bytes = encode(w);
    REQUIRE(bytes);
    auto r = decode_wire_graph(bytes->data(), bytes->size());
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("node %1 (parameter)") == 0);
    wire_graph e = inference_sample();
    e.g.nodes[4].op = op_kind::add;  // linear(x, w) -> add(x, w)
    auto eb = encode(e);
    REQUIRE(eb);
    auto er = decode_wire_graph(eb->data(), eb->size());
    REQUIRE_FALSE(er);
    CHECK(er.error().message.find("node %4 (add)") == 0);
  }
  {  // dtype values past the last one
    wire_graph w = inference_sample();
    auto bytes = encode(w);
    REQUIRE(bytes);
    // The first node's dtype byte follows magic, version, node count and its op byte.
    REQUIRE((*bytes)[13] == static_cast<char>(dtype::f32));
    (*bytes)[13] = static_cast<char>(dtype_count);
    REQUIRE_FALSE(decode_wire_graph(bytes->data(), bytes->size()));
  }
}
