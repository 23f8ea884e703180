// The partition planner: optimal pipeline cuts (against brute force), data/tensor parallel plans,
// fragments that reproduce the whole graph, and re-planning that moves only the dead device's part.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "graph/autodiff.hpp"
#include "graph/evaluate.hpp"
#include "graph/fragment.hpp"
#include "graph/nn.hpp"
#include "graph/optim.hpp"
#include "graph/planner.hpp"
#include "graph/validate.hpp"
#include "random_graph.hpp"

using namespace mesh;

namespace {

std::vector<device_profile> devices(std::vector<double> gflops, double link_gbps = 1e-3) {
  std::vector<device_profile> out;
  for (size_t i = 0; i < gflops.size(); ++i)
    out.push_back({"dev" + std::to_string(i), gflops[i] * 1e-6, 1e3, link_gbps, int64_t{1} << 40});
  return out;
}

graph mlp_inference(int64_t batch = 8) {
  builder b;
  auto x = b.input("x", dtype::f32, {batch, 6});
  auto m = nn::make_mlp(b, "mlp", {6, 16, 16, 16, 3});
  b.output("y", nn::softmax(m(x)));
  return *b.finish();
}

/// The best bottleneck over every way of cutting `n` positions into `k` stages.
double brute_force(const graph& g, const std::vector<device_profile>& devs) {
  const size_t n = schedule_order(g).size();
  double best = 1e300;
  std::vector<size_t> cuts(devs.size() - 1, 0);
  std::function<void(size_t, size_t)> rec = [&](size_t i, size_t from) {
    if (i == cuts.size()) {
      best = std::min(best, pipeline_cost(g, devs, cuts));
      return;
    }
    for (size_t c = from; c <= n; ++c) {
      cuts[i] = c;
      rec(i + 1, c);
    }
  };
  rec(0, 0);
  return best;
}

}  // namespace

TEST_CASE("pipeline cuts are optimal for the cost model (brute force)", "[graph][planner]") {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    graph g = test::random_graph(seed, 8);
    g.updates.clear();
    REQUIRE(validate(g));
    for (auto speeds : {std::vector<double>{1, 1}, {1, 3}, {2, 1, 1}, {1, 4, 2}}) {
      for (double link : {1e-3, 1e-6}) {
        const auto devs = devices(speeds, link);
        auto p = partition(g, devs, strategy::pipeline);
        REQUIRE(p);
        INFO("seed " << seed << ", " << speeds.size() << " devices, link " << link);
        CHECK(p->step_seconds == Approx(brute_force(g, devs)).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("a faster device gets a larger pipeline stage", "[graph][planner]") {
  const graph g = mlp_inference(64);
  auto p = partition(g, devices({1, 4}, 1e3), strategy::pipeline);
  REQUIRE(p);
  REQUIRE(p->stages.size() == 2);
  double flops[2] = {0, 0};
  for (int s = 0; s < 2; ++s)
    for (auto id : p->stages[static_cast<size_t>(s)].nodes) flops[s] += node_flops(g, id);
  CHECK(flops[1] > 2 * flops[0]);
}

TEST_CASE("running the stage fragments in order equals running the whole graph", "[graph][planner]") {
  const graph g = mlp_inference();
  auto p = partition(g, devices({1, 2, 1}, 1e3), strategy::pipeline);
  REQUIRE(p);
  REQUIRE(p->transfers.size() > 0);
  auto params = nn::init_parameters(g, 3);
  std::vector<double> xv(48);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::cos(static_cast<double>(i));
  const tensor x = tensor::from_values(dtype::f32, {8, 6}, xv);
  auto want = evaluate(g, {{"x", x}}, params);
  REQUIRE(want);

  tensor_map carried{{"x", x}};  // values flowing between stages, by name
  tensor_map results;
  for (int s = 0; s < static_cast<int>(p->stages.size()); ++s) {
    auto f = stage_fragment(g, *p, s);
    REQUIRE(f);
    REQUIRE(validate(*f));
    tensor_map inputs;
    for (const auto& n : f->nodes)
      if (n.op == op_kind::input) inputs[n.attrs.name] = carried.at(n.attrs.name);
    auto out = evaluate(*f, inputs, params);
    REQUIRE(out);
    for (auto& [name, t] : out->outputs) (name.rfind("cut.", 0) == 0 ? carried : results)[name] = t;
  }
  CHECK(normalised_error(results.at("y"), want->outputs.at("y")) == 0);
}

TEST_CASE("data parallel splits the batch by speed and all-reduces trainable parameters", "[graph][planner]") {
  builder b;
  auto x = b.input("x", dtype::f32, {30, 4});
  auto y = b.input("y", dtype::i32, {30});
  auto m = nn::make_mlp(b, "m", {4, 8, 2});
  auto loss = nn::cross_entropy(m(x), y);
  std::vector<expr> ps{m.layers[0].w, m.layers[0].b, m.layers[1].w, m.layers[1].b};
  optim::adam(b, ps, gradients(loss, ps), {});
  const graph g = *b.finish();
  auto p = partition(g, devices({1, 2}), strategy::data_parallel);
  REQUIRE(p);
  REQUIRE(p->shares.size() == 2);
  CHECK(p->shares[0].begin == 0);
  CHECK(p->shares[0].end == p->shares[1].begin);
  CHECK(p->shares[1].end == 30);
  CHECK(p->shares[1].end - p->shares[1].begin == 20);  // twice as fast, twice the rows
  CHECK(p->allreduce_bytes == (4 * 8 + 8 + 8 * 2 + 2) * 4);  // optimizer state is not reduced
  // Pipeline refuses the training graph: updates would cross stages.
  auto pl = partition(g, devices({1, 1}), strategy::pipeline);
  if (!pl) CHECK(pl.error().code == error_code::unsupported);
  // Automatic picks something that works.
  auto a = partition(g, devices({1, 2}), strategy::automatic);
  REQUIRE(a);
}

TEST_CASE("tensor parallel shards matmul weights by columns", "[graph][planner]") {
  const graph g = mlp_inference(8);
  auto p = partition(g, devices({1, 1, 2}), strategy::tensor_parallel);
  REQUIRE(p);
  CHECK(p->shards.size() == 4);  // one per layer weight
  for (const auto& sh : p->shards) {
    REQUIRE(sh.ranges.size() == 3);
    CHECK(sh.ranges.front().first == 0);
    CHECK(sh.ranges.back().second == g[sh.param].dims[1]);
    for (size_t d = 1; d < 3; ++d) CHECK(sh.ranges[d].first == sh.ranges[d - 1].second);
  }
  builder b;
  auto v = b.input("v", dtype::f32, {3});
  b.output("o", exp(v));
  auto none = partition(*b.finish(), devices({1, 1}), strategy::tensor_parallel);
  REQUIRE_FALSE(none);
  CHECK(partition(g, {}, strategy::pipeline).error().code == error_code::invalid_argument);
}

TEST_CASE("device speeds that are NaN, infinite, zero or negative give valid plans promptly", "[graph][planner]") {
  // A peer's profile is its own report. Before, NaN or an infinity reached a cast to int64
  // (undefined) and a remainder loop of ~2^63 turns; a negative speed gave negative columns.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  b.output("y", matmul(x, b.parameter("w", dtype::f32, {8, 16})));
  const graph g = *b.finish();
  const auto check_plan = [&](const plan& p) {
    CHECK(std::isfinite(p.step_seconds));
    CHECK(p.step_seconds >= 0);
    for (const auto& sh : p.shards) {
      const int64_t cols = g[sh.param].dims[1];
      int64_t next = 0;
      for (const auto& [first, second] : sh.ranges) {
        CHECK(first == next);
        CHECK(0 <= first);
        CHECK(first <= second);
        CHECK(second <= cols);
        next = second;
      }
      CHECK(next == cols);
    }
    int64_t rows = 0;
    for (const auto& s : p.shares) {
      CHECK(0 <= s.begin);
      CHECK(s.begin <= s.end);
      CHECK(s.end <= p.batch);
      rows += s.end - s.begin;
    }
    if (p.kind == strategy::data_parallel) CHECK(rows == p.batch);
  };
  for (double bad : {inf, -inf, 1e308, nan, -10.0, 0.0}) {
    for (int field = 0; field < 3; ++field) {  // gflops, mem_gbps, link_gbps
      std::vector<device_profile> devs{{"a", 10, 10, 1, int64_t{1} << 40}, {"b", 10, 10, 1, int64_t{1} << 40}};
      (field == 0 ? devs[1].gflops : field == 1 ? devs[1].mem_gbps : devs[1].link_gbps) = bad;
      for (auto s : {strategy::tensor_parallel, strategy::data_parallel, strategy::pipeline, strategy::automatic}) {
        INFO("speed " << bad << " in field " << field << ", " << to_string(s));
        auto p = partition(g, devs, s);
        REQUIRE(p);
        check_plan(*p);
      }
    }
  }
  // A device reporting no memory fits no work: it gets an empty stage, the other one all of it.
  for (int64_t mem : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    INFO("memory " << mem);
    std::vector<device_profile> devs{{"a", 10, 10, 1, int64_t{1} << 40}, {"b", 10, 10, 1, mem}};
    for (auto s : {strategy::pipeline, strategy::automatic}) {
      auto p = partition(g, devs, s);
      REQUIRE(p);
      check_plan(*p);
      if (s == strategy::pipeline) CHECK(p->stages[1].nodes.empty());
    }
  }
  // A speed that is not finite and positive counts as the slowest: the other device gets all
  // the columns; a huge finite one takes them all; with no usable speed at all, shares are equal.
  const auto ranges = [&](std::vector<double> gflops) {
    std::vector<device_profile> devs;
    for (double f : gflops) devs.push_back({"d", f, 10, 1, int64_t{1} << 40});
    auto p = partition(g, devs, strategy::tensor_parallel);
    REQUIRE(p);
    REQUIRE(p->shards.size() == 1);
    return p->shards[0].ranges;
  };
  using r = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(ranges({10, inf}) == r{{0, 16}, {16, 16}});
  CHECK(ranges({10, nan}) == r{{0, 16}, {16, 16}});
  CHECK(ranges({-10, 10}) == r{{0, 0}, {0, 16}});
  CHECK(ranges({10, 1e308}) == r{{0, 0}, {0, 16}});
  CHECK(ranges({1e308, 1e308}) == r{{0, 8}, {8, 16}});
  CHECK(ranges({nan, -1}) == r{{0, 8}, {8, 16}});
}

TEST_CASE("automatic partitioning picks the cheapest strategy", "[graph][planner]") {
  const graph g = mlp_inference(64);
  const auto devs = devices({1, 1, 1});
  auto a = partition(g, devs, strategy::automatic);
  REQUIRE(a);
  for (auto s : {strategy::pipeline, strategy::data_parallel, strategy::tensor_parallel})
    if (auto p = partition(g, devs, s)) CHECK(a->step_seconds <= p->step_seconds);
}

TEST_CASE("re-planning keeps survivors' work in place and moves only the dead device's", "[graph][planner]") {
  const graph g = mlp_inference(16);
  const auto devs = devices({1, 1, 1, 1}, 1e3);
  SECTION("pipeline") {
    auto p = partition(g, devs, strategy::pipeline);
    REQUIRE(p);
    for (int dead = 0; dead < 4; ++dead) {
      std::vector<device_profile> survivors = devs;
      survivors.erase(survivors.begin() + dead);
      auto r = replan(g, *p, dead, survivors);
      REQUIRE(r);
      REQUIRE(r->stages.size() == 3);
      size_t covered = 0;
      for (int old = 0, now = 0; old < 4; ++old) {
        if (old == dead) continue;
        const std::set<node_index> before(p->stages[static_cast<size_t>(old)].nodes.begin(), p->stages[static_cast<size_t>(old)].nodes.end());
        const std::set<node_index> after(r->stages[static_cast<size_t>(now)].nodes.begin(), r->stages[static_cast<size_t>(now)].nodes.end());
        CHECK(std::includes(after.begin(), after.end(), before.begin(), before.end()));
        covered += after.size();
        ++now;
      }
      CHECK(covered == schedule_order(g).size());
    }
  }
  SECTION("data parallel") {
    auto p = partition(g, devs, strategy::data_parallel);
    REQUIRE(p);
    std::vector<device_profile> survivors(devs.begin(), devs.begin() + 3);
    auto r = replan(g, *p, 3, survivors);
    REQUIRE(r);
    int64_t rows = 0;
    for (const auto& sh : r->shares) rows += sh.end - sh.begin;
    CHECK(rows == 16);
    for (int d = 0; d < 3; ++d) CHECK(r->shares[static_cast<size_t>(d)].begin == p->shares[static_cast<size_t>(d)].begin);
  }
  SECTION("tensor parallel") {
    auto p = partition(g, devs, strategy::tensor_parallel);
    REQUIRE(p);
    std::vector<device_profile> survivors(devs.begin() + 1, devs.end());
    auto r = replan(g, *p, 0, survivors);
    REQUIRE(r);
    for (size_t i = 0; i < r->shards.size(); ++i) {
      CHECK(r->shards[i].ranges.size() == 3);
      CHECK(r->shards[i].ranges[0].first == 0);
      CHECK(r->shards[i].ranges[1] == p->shards[i].ranges[2]);  // survivors keep their columns
    }
  }
}
