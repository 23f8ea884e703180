// Data-parallel and tensor-parallel plans rewritten into stages: run stage by stage (as the job
// engine does, values crossing stages by name), they give what the reference evaluator gives for
// the whole graph; graphs that mix batch rows are refused with the node that does it.
#include <catch2/catch.hpp>

#include <random>

#include "graph/builder.hpp"
#include "graph/evaluate.hpp"
#include "graph/fragment.hpp"
#include "graph/nn.hpp"
#include "graph/staged_plan.hpp"

using namespace mesh;

namespace {

std::vector<device_profile> devices(std::vector<double> gflops) {
  std::vector<device_profile> out;
  for (size_t i = 0; i < gflops.size(); ++i) out.push_back({"dev" + std::to_string(i), gflops[i], 10.0, 1.0, int64_t{1} << 40});
  return out;
}

tensor random_tensor(dtype t, shape s, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(element_count(s)));
  for (auto& x : v) x = t == dtype::i32 ? std::floor(u(rng)) : u(rng);
  return tensor::from_values(t, std::move(s), v);
}

/// Runs the stages in order, each one's fragment alone, as workers would.
tensor_map run_stages(const staged_job& s, const tensor_map& job) {
  auto bound = staged_tensors(s, job);
  REQUIRE(bound);
  tensor_map cuts, outputs;
  for (size_t k = 0; k < s.stages.stages.size(); ++k) {
    auto f = stage_fragment(s.g, s.stages, static_cast<int>(k));
    REQUIRE(f);
    tensor_map inputs, params;
    for (const auto& n : f->nodes) {
      if (n.op == op_kind::input) inputs[n.attrs.name] = n.attrs.name.rfind("cut.", 0) == 0 ? cuts.at(n.attrs.name) : bound->at(n.attrs.name);
      if (n.op == op_kind::parameter) params[n.attrs.name] = bound->at(n.attrs.name);
    }
    auto r = evaluate(*f, inputs, params);
    REQUIRE(r);
    for (auto& [name, t] : r->outputs) (name.rfind("cut.", 0) == 0 ? cuts : outputs)[name] = t;
  }
  return outputs;
}

void check_transfers_forward(const staged_job& s) {
  for (const auto& t : s.stages.transfers) CHECK(t.from_stage < t.to_stage);
}

void require_same(const tensor_map& got, const tensor_map& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(got.at(name).dims == t.dims);
    CHECK(normalised_error(got.at(name), t) < 1e-12);
  }
}

/// Rows that depend on their own row only: an embedding lookup, layer norm, an MLP with biases
/// (broadcast parameters), a constant added to every row, softmax over the last axis.
graph row_model(int64_t batch) {
  builder b;
  auto tokens = b.input("tokens", dtype::i32, {batch, 3});
  auto extra = b.input("extra", dtype::f32, {batch, 4});
  auto table = b.parameter("table", dtype::f32, {10, 4});
  auto e = gather(table, tokens);                            // [batch, 3, 4]
  auto flat = reshape(e, {batch, 12});
  auto h = concat({flat, extra}, 1);                         // [batch, 16]
  auto ln = nn::layer_norm(h, b.parameter("g", dtype::f32, {16}), b.parameter("beta", dtype::f32, {16}));
  auto m = nn::make_mlp(b, "mlp", {16, 8, 5});
  auto y = nn::softmax(m(ln) + 0.5);
  b.output("y", y);
  b.output("rowsum", sum(y * y, {1}));
  b.output("table_norm", sum(table * table, {0, 1}));  // no batch rows: from one replica
  return *b.finish();
}

tensor_map row_model_tensors(const graph& g, int64_t batch) {
  auto t = nn::init_parameters(g, 7);
  t["tokens"] = random_tensor(dtype::i32, {batch, 3}, 1, 0, 10);
  t["extra"] = random_tensor(dtype::f32, {batch, 4}, 2);
  return t;
}

tensor_map reference(const graph& g, const tensor_map& all) {
  tensor_map inputs, params;
  for (const auto& [name, t] : all) (g[g.find_leaf(name)].op == op_kind::input ? inputs : params)[name] = t;
  auto r = evaluate(g, inputs, params);
  REQUIRE(r);
  return r->outputs;
}

}  // namespace

TEST_CASE("slice_axis cuts any axis", "[graph][staged]") {
  auto t = tensor::from_floats({2, 3}, {0, 1, 2, 3, 4, 5});
  CHECK(slice_tensor(t, 0, 1, 2).to_floats() == std::vector<float>{3, 4, 5});
  CHECK(slice_tensor(t, 1, 1, 3).to_floats() == std::vector<float>{1, 2, 4, 5});
  CHECK(slice_tensor(t, 1, 2, 2).dims == shape{2, 0});
}

TEST_CASE("a pipeline plan is its own stages", "[graph][staged]") {
  const graph g = row_model(6);
  auto p = partition(g, devices({1, 1}), strategy::pipeline);
  REQUIRE(p);
  auto s = stage_plan(g, *p);
  REQUIRE(s);
  CHECK(s->g == g);
  const auto all = row_model_tensors(g, 6);
  require_same(run_stages(*s, all), reference(g, all));
}

TEST_CASE("data parallel stages equal the whole graph", "[graph][staged]") {
  for (int64_t batch : {1, 7, 16}) {
    const graph g = row_model(batch);
    auto p = partition(g, devices({1, 2, 3}), strategy::data_parallel);
    REQUIRE(p);
    auto s = stage_plan(g, *p);
    REQUIRE(s);
    check_transfers_forward(*s);
    const auto all = row_model_tensors(g, batch);
    require_same(run_stages(*s, all), reference(g, all));
    // Each replica reads only its own rows of the inputs.
    for (const auto& piece : s->pieces) CHECK(piece.end - piece.begin <= batch);
  }
}

TEST_CASE("data parallel after a re-plan (split, out-of-order shares) still equals the graph", "[graph][staged]") {
  const graph g = row_model(11);
  const auto devs = devices({1, 2, 3});
  auto p = partition(g, devs, strategy::data_parallel);
  REQUIRE(p);
  auto q = replan(g, *p, 0, {devs[1], devs[2]});
  REQUIRE(q);
  auto s = stage_plan(g, *q);
  REQUIRE(s);
  const auto all = row_model_tensors(g, 11);
  require_same(run_stages(*s, all), reference(g, all));
}

TEST_CASE("data parallel refuses graphs that mix batch rows", "[graph][staged]") {
  builder b;
  auto x = b.input("x", dtype::f32, {8, 4});
  auto labels = b.input("labels", dtype::i32, {8});
  auto m = nn::make_mlp(b, "m", {4, 3});
  b.output("loss", nn::cross_entropy(m(x), labels));  // a mean over the batch
  const graph g = *b.finish();
  auto p = partition(g, devices({1, 1}), strategy::data_parallel);
  REQUIRE(p);
  auto s = stage_plan(g, *p);
  REQUIRE_FALSE(s);
  CHECK_THAT(s.error().message, Catch::Contains("batch axis") && Catch::Contains("pipeline"));

  builder t;
  auto a = t.input("a", dtype::f32, {4, 4});
  t.output("at", matmul(permute(a, {1, 0}), a));
  const graph gt = *t.finish();
  auto pt = partition(gt, devices({1, 1}), strategy::data_parallel);
  REQUIRE(pt);
  CHECK_FALSE(stage_plan(gt, *pt));
}

TEST_CASE("tensor parallel stages equal the whole graph", "[graph][staged]") {
  SECTION("an MLP") {
    builder b;
    auto x = b.input("x", dtype::f32, {5, 6});
    auto m = nn::make_mlp(b, "mlp", {6, 16, 9, 3});
    b.output("y", m(x));
    const graph g = *b.finish();
    auto all = nn::init_parameters(g, 3);
    all["x"] = random_tensor(dtype::f32, {5, 6}, 4);
    const auto devs = devices({1, 2, 3});
    auto p = partition(g, devs, strategy::tensor_parallel);
    REQUIRE(p);
    auto s = stage_plan(g, *p);
    REQUIRE(s);
    check_transfers_forward(*s);
    require_same(run_stages(*s, all), reference(g, all));
    // After device 1 dies, its columns go to a neighbour: still the same result.
    auto q = replan(g, *p, 1, {devs[0], devs[2]});
    REQUIRE(q);
    auto sq = stage_plan(g, *q);
    REQUIRE(sq);
    require_same(run_stages(*sq, all), reference(g, all));
  }
  SECTION("a transformer block (matmuls through broadcast parameters)") {
    builder b;
    auto x = b.input("x", dtype::f32, {2, 4, 8});
    auto blk = nn::make_transformer_block(b, "blk", 8, 2);
    b.output("y", blk(x));
    const graph g = *b.finish();
    auto all = nn::init_parameters(g, 5);
    all["x"] = random_tensor(dtype::f32, {2, 4, 8}, 6);
    auto p = partition(g, devices({1, 1}), strategy::tensor_parallel);
    REQUIRE(p);
    auto s = stage_plan(g, *p);
    REQUIRE(s);
    CHECK(s->stages.stages.size() > 2);
    require_same(run_stages(*s, all), reference(g, all));
  }
}

TEST_CASE("tensor parallel leaves alone matmuls it cannot split by the parameter's columns", "[graph][staged]") {
  const auto devs = devices({1, 1});
  SECTION("a [k, 1] parameter broadcast to [k, n]: its columns are not the matmul's") {
    // Sharding w1's single column gave the staged matmul 1 column instead of 16.
    builder b;
    auto x = b.input("x", dtype::f32, {4, 8});
    auto w1 = b.parameter("w1", dtype::f32, {8, 1});
    auto w2 = b.parameter("w2", dtype::f32, {8, 16});
    b.output("y", matmul(x, broadcast_to(w1, {8, 16})) + matmul(x, w2));
    b.output("y1", matmul(x, broadcast_to(w1, {8, 16})));
    const graph g = *b.finish();
    auto all = nn::init_parameters(g, 8);
    all["w1"] = random_tensor(dtype::f32, {8, 1}, 9);
    all["x"] = random_tensor(dtype::f32, {4, 8}, 10);
    auto p = partition(g, devs, strategy::tensor_parallel);
    REQUIRE(p);
    REQUIRE(p->shards.size() == 1);
    CHECK(p->shards[0].param == g.find_leaf("w2"));
    auto s = stage_plan(g, *p);
    INFO((s ? std::string() : s.error().to_string()));
    REQUIRE(s);
    CHECK(s->g[s->g.find_output("y1")].dims == shape{4, 16});
    require_same(run_stages(*s, all), reference(g, all));
    // With nothing else to split there is no tensor-parallel plan (not a wrong one).
    builder b1;
    auto x1 = b1.input("x", dtype::f32, {4, 8});
    b1.output("y", matmul(x1, broadcast_to(b1.parameter("w", dtype::f32, {8, 1}), {8, 16})));
    CHECK_FALSE(partition(*b1.finish(), devs, strategy::tensor_parallel));
  }
  SECTION("a matmul with 0 columns") {
    // Sharding a [k, 0] parameter left no part to join: a concat of 0 inputs, an internal error.
    builder b;
    auto x = b.input("x", dtype::f32, {4, 8});
    b.output("none", matmul(x, b.parameter("w0", dtype::f32, {8, 0})));
    b.output("y", matmul(x, b.parameter("w", dtype::f32, {8, 16})));
    const graph g = *b.finish();
    auto all = nn::init_parameters(g, 11);
    all["w0"] = tensor::zeros(dtype::f32, {8, 0});
    all["x"] = random_tensor(dtype::f32, {4, 8}, 12);
    auto p = partition(g, devs, strategy::tensor_parallel);
    REQUIRE(p);
    REQUIRE(p->shards.size() == 1);
    CHECK(p->shards[0].param == g.find_leaf("w"));
    auto s = stage_plan(g, *p);
    INFO((s ? std::string() : s.error().to_string()));
    REQUIRE(s);
    require_same(run_stages(*s, all), reference(g, all));
    builder b0;
    auto x0 = b0.input("x", dtype::f32, {4, 8});
    b0.output("y", matmul(x0, b0.parameter("w", dtype::f32, {8, 0})));
    CHECK_FALSE(partition(*b0.finish(), devs, strategy::tensor_parallel));
  }
  SECTION("column ranges that do not tile the parameter are refused, not staged into an invalid graph") {
    builder b;
    auto x = b.input("x", dtype::f32, {4, 8});
    b.output("y", matmul(x, b.parameter("w", dtype::f32, {8, 16})));
    const graph g = *b.finish();
    auto p = partition(g, devs, strategy::tensor_parallel);
    REQUIRE(p);
    for (auto bad : std::vector<std::vector<std::pair<int64_t, int64_t>>>{{{0, 8}, {8, 20}}, {{0, 8}, {9, 16}}, {{0, 8}}, {{8, 16}, {0, 8}}}) {
      plan q = *p;
      q.shards[0].ranges = bad;
      auto s = stage_plan(g, q);
      REQUIRE_FALSE(s);
      CHECK(s.error().code == error_code::invalid_argument);
    }
  }
}

TEST_CASE("one-shot data and tensor parallel plans refuse parameter updates", "[graph][staged]") {
  builder b;
  auto x = b.input("x", dtype::f32, {4, 2});
  auto w = b.parameter("w", dtype::f32, {2, 2});
  b.output("y", matmul(x, w));
  b.update(w, w * 0.5);
  const graph g = *b.finish();
  for (auto k : {strategy::data_parallel, strategy::tensor_parallel}) {
    auto p = partition(g, devices({1, 1}), k);
    REQUIRE(p);
    auto s = stage_plan(g, *p);
    REQUIRE_FALSE(s);
    CHECK_THAT(s.error().message, Catch::Contains("trainer"));
  }
}
