// Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, and the same draws for
// the same seed.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "models/sampler.hpp"

using namespace mesh;
using namespace mesh::models;

namespace {

sampler make(sampling_options o) {
  auto s = sampler::create(o);
  REQUIRE(s);
  return std::move(*s);
}

const std::vector<float> logits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};

}  // namespace

TEST_CASE("greedy picks the highest logit, the lowest id on a tie", "[models][sampler]") {
  auto s = make({});
  CHECK(s.sample(logits, {}) == 1);
  auto k1 = make({.temperature = 1.0f, .top_k = 1});
  CHECK(k1.sample(logits, {}) == 1);
  auto p = make({.temperature = 1.0f, .top_p = 0.01f});
  CHECK(p.sample(logits, {}) == 1);
}

TEST_CASE("first_argmax: the first largest logit at any length and position, NaN passed over", "[models][sampler]") {
  // Lengths around the 8 running maxima (tails of 0..7), the largest value at every position,
  // ties resolved to the lowest id, as std::max_element would.
  for (size_t n = 1; n <= 37; ++n)
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 1.7f);
      x[at] = 5.0f;
      if (at + 3 < n) x[at + 3] = 5.0f;  // a later tie
      INFO("n " << n << " at " << at);
      CHECK(first_argmax(x) == static_cast<int32_t>(at));
    }
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  CHECK(first_argmax(std::vector<float>{nan, 1.0f, 2.0f, nan, 2.0f}) == 2);
  CHECK(first_argmax(std::vector<float>{nan, nan}) == 0);
  CHECK(first_argmax(std::vector<float>{-inf, -inf, -inf}) == 0);
  CHECK(first_argmax(std::vector<float>{-inf, 1.0f, inf, 3.0f}) == 2);
  std::vector<float> big(128256, -2.0f);
  big[128255] = -1.0f;
  CHECK(first_argmax(big) == 128255);
}

TEST_CASE("the same seed gives the same draws, another seed others", "[models][sampler]") {
  sampling_options o{.temperature = 1.5f, .seed = 42};
  auto a = make(o), b = make(o);
  o.seed = 43;
  auto c = make(o);
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(logits, {}));
    db.push_back(b.sample(logits, {}));
    dc.push_back(c.sample(logits, {}));
  }
  CHECK(da == db);
  CHECK(da != dc);
}

TEST_CASE("temperature 1 draws with the softmax's probabilities", "[models][sampler]") {
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto s = make({.temperature = 1.0f, .seed = 7});
  std::vector<int> count(3);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.sample(l, {}))];
  CHECK(std::abs(count[0] / double(n) - 0.5) < 0.02);
  CHECK(std::abs(count[1] / double(n) - 0.3) < 0.02);
  CHECK(std::abs(count[2] / double(n) - 0.2) < 0.02);
}

TEST_CASE("top-k, top-p and min-p keep only the candidates they should", "[models][sampler]") {
  // Probabilities at temperature 1: ids 1 and 4 (logit 3) ~0.33 each, id 2 ~0.20, the rest small.
  auto in = [](const std::vector<int32_t>& allowed, sampler& s) {
    for (int i = 0; i < 500; ++i) {
      const int32_t t = s.sample(logits, {});
      if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) return false;
    }
    return true;
  };
  auto k2 = make({.temperature = 1.0f, .top_k = 2, .seed = 1});
  CHECK(in({1, 4}, k2));
  auto p = make({.temperature = 1.0f, .top_p = 0.6f, .seed = 2});
  CHECK(in({1, 4}, p));
  auto m = make({.temperature = 1.0f, .min_p = 0.5f, .seed = 3});  // 0.20 >= 0.5 * 0.33 keeps id 2
  CHECK(in({1, 2, 4}, m));
  auto m2 = make({.temperature = 1.0f, .min_p = 0.7f, .seed = 3});
  CHECK(in({1, 4}, m2));
}

TEST_CASE("the repetition penalty divides positive and multiplies negative logits of seen tokens", "[models][sampler]") {
  auto s = make({.repetition_penalty = 2.0f});
  const std::vector<int32_t> seen = {1, 4};
  CHECK(s.sample(logits, seen) == 2);  // 3 / 2 = 1.5 < 2.5
  const std::vector<float> negative = {-1.0f, -1.5f};
  const std::vector<int32_t> first = {0};
  CHECK(s.sample(negative, first) == 1);  // -1 * 2 = -2 < -1.5
}

TEST_CASE("log-probabilities: the log-softmax of the raw logits, the top ones highest first", "[models][sampler]") {
  // Expected values: torch.log_softmax in float64 of the same logits.
  auto t = token_log_probabilities(logits, 2, 3);
  CHECK(t.id == 2);
  CHECK(t.logprob == Approx(-1.5331733267730443).epsilon(1e-12));
  REQUIRE(t.top.size() == 3);
  CHECK(t.top[0].first == 1);  // 3.0 twice: the lower id first
  CHECK(t.top[1].first == 4);
  CHECK(t.top[2].first == 2);
  CHECK(t.top[0].second == Approx(-1.0331733267730443).epsilon(1e-12));
  CHECK(t.top[2].second == t.logprob);
  CHECK(token_log_probabilities(logits, 3, 0).top.empty());
  CHECK(token_log_probabilities(logits, 3, 0).logprob == Approx(-5.033173326773044).epsilon(1e-12));
  CHECK(token_log_probabilities(logits, 0, 100).top.size() == logits.size());  // clamped to the vocabulary

  // Large logits do not overflow.
  const std::vector<float> big = {1000.0f, 999.0f, -1e30f};
  auto b = token_log_probabilities(big, 1, 1);
  CHECK(b.logprob == Approx(-1.3132616875182228).epsilon(1e-9));
  CHECK(b.top[0].second == Approx(-0.31326168751822286).epsilon(1e-9));
  std::vector<float> wide(100, 0.5f);
  CHECK(token_log_probabilities(wide, 0, 50).top.size() == static_cast<size_t>(max_top_logprobs));
}

TEST_CASE("bad sampling options are errors", "[models][sampler]") {
  CHECK_FALSE(sampler::create({.temperature = NAN}));
  CHECK_FALSE(sampler::create({.top_k = -1}));
  CHECK_FALSE(sampler::create({.top_p = 0.0f}));
  CHECK_FALSE(sampler::create({.min_p = 1.5f}));
  auto r = sampler::create({.repetition_penalty = 0.0f});
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "sampling: repetition_penalty 0 must be a positive number");
}
