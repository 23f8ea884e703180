// The ring all-reduce over a simulated network: every rank ends with the same bits, equal to the
// sum; messages may arrive in any order; hostile or stale messages are rejected.
#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <random>

#include "actors/ring_allreduce.hpp"

using namespace mesh;

namespace {

struct sim_result {
  std::vector<std::vector<float>> results;
  std::vector<double> exact;
  uint64_t bytes_per_rank = 0;
};

/// Runs one round on `n` ranks; in-flight messages are delivered in a random order.
sim_result simulate(int n, size_t len, int pieces, wire_format fmt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<ring_allreduce> ranks;
  sim_result r;
  r.exact.assign(len, 0.0);
  for (int k = 0; k < n; ++k) {
    std::vector<float> data(len);
    for (size_t i = 0; i < len; ++i) {
      data[i] = u(rng);
      r.exact[i] += data[i];
    }
    ranks.emplace_back(9, k, n, std::move(data), pieces, fmt);
  }
  std::vector<std::pair<int, allreduce_message>> flight;  // (destination, message)
  for (int k = 0; k < n; ++k)
    for (auto& m : ranks[static_cast<size_t>(k)].start()) flight.push_back({(k + 1) % n, std::move(m)});
  while (!flight.empty()) {
    const size_t i = rng() % flight.size();
    auto [to, m] = std::move(flight[i]);
    flight.erase(flight.begin() + static_cast<std::ptrdiff_t>(i));
    auto out = ranks[static_cast<size_t>(to)].on_message(m);
    REQUIRE(out);
    for (auto& f : *out) flight.push_back({(to + 1) % n, std::move(f)});
  }
  for (auto& k : ranks) {
    REQUIRE(k.done());
    r.results.push_back(k.result());
  }
  r.bytes_per_rank = ranks[0].bytes_sent();
  return r;
}

}  // namespace

TEST_CASE("ring all-reduce sums correctly and replicas are bit-identical", "[actors][allreduce]") {
  for (int n : {1, 2, 3, 5}) {
    for (size_t len : {size_t{1}, size_t{7}, size_t{1000}}) {
      for (int pieces : {1, 3}) {
        auto r = simulate(n, len, pieces, wire_format::f32, static_cast<uint64_t>(n * 1000 + static_cast<int>(len) + pieces));
        INFO("n=" << n << " len=" << len << " pieces=" << pieces);
        for (size_t k = 1; k < r.results.size(); ++k) REQUIRE(r.results[k] == r.results[0]);
        for (size_t i = 0; i < len; ++i) REQUIRE(std::abs(r.results[0][i] - r.exact[i]) < 1e-5);
      }
    }
  }
}

TEST_CASE("each rank sends 2(n-1)/n of the buffer", "[actors][allreduce]") {
  auto r = simulate(4, 4000, 2, wire_format::f32, 1);
  CHECK(r.bytes_per_rank == 2 * 3 * 1000 * 4);
  auto half = simulate(4, 4000, 2, wire_format::bf16, 1);
  CHECK(half.bytes_per_rank == r.bytes_per_rank / 2);
}

TEST_CASE("bf16 and f16 wire compression keep replicas identical and close", "[actors][allreduce]") {
  for (auto fmt : {wire_format::bf16, wire_format::f16}) {
    auto r = simulate(3, 500, 2, fmt, 4);
    for (size_t k = 1; k < r.results.size(); ++k) REQUIRE(r.results[k] == r.results[0]);
    for (size_t i = 0; i < r.exact.size(); ++i) CHECK(std::abs(r.results[0][i] - r.exact[i]) < 0.05);
  }
}

TEST_CASE("stale, duplicate and malformed messages are rejected without changing state", "[actors][allreduce]") {
  ring_allreduce a(5, 0, 3, std::vector<float>(9, 1.0f), 1), b(5, 1, 3, std::vector<float>(9, 2.0f), 1);
  auto first = a.start();
  REQUIRE(first.size() == 1);
  auto stale = first[0];
  stale.round = 4;
  CHECK_FALSE(b.on_message(stale));
  auto bad_step = first[0];
  bad_step.step = 99;
  CHECK_FALSE(b.on_message(bad_step));
  auto short_payload = first[0];
  short_payload.payload.pop_back();
  CHECK_FALSE(b.on_message(short_payload));
  REQUIRE(b.on_message(first[0]));
  CHECK_FALSE(b.on_message(first[0]));  // duplicate
  CHECK_FALSE(b.done());
}

TEST_CASE("a rank whose data comes late takes its predecessor's pieces and ends with the same sum", "[actors][allreduce]") {
  // The training worker makes its round when the step arrives and gives it the gradients when
  // they are computed; the predecessor may have sent its pieces by then. Rank 1 starts last.
  for (int n : {2, 3, 4}) {
    INFO("n " << n);
    const size_t len = 37;
    std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(len));
    std::vector<double> exact(len, 0.0);
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < len; ++i) {
        data[static_cast<size_t>(k)][i] = static_cast<float>(k + 1) * 0.25f + static_cast<float>(i);
        exact[i] += data[static_cast<size_t>(k)][i];
      }
    std::vector<ring_allreduce> ranks;
    for (int k = 0; k < n; ++k)
      if (k == 1) ranks.emplace_back(4, k, n, 2, wire_format::f32);
      else ranks.emplace_back(4, k, n, data[static_cast<size_t>(k)], 2, wire_format::f32);
    std::deque<std::pair<int, allreduce_message>> flight;
    for (int k = 0; k < n; ++k)
      if (k != 1)
        for (auto& m : ranks[static_cast<size_t>(k)].start()) flight.push_back({(k + 1) % n, std::move(m)});
    const auto deliver = [&] {
      while (!flight.empty()) {
        auto [to, m] = std::move(flight.front());
        flight.pop_front();
        auto out = ranks[static_cast<size_t>(to)].on_message(m);
        REQUIRE(out);
        for (auto& f : *out) flight.push_back({(to + 1) % n, std::move(f)});
      }
    };
    deliver();  // everything that can move without rank 1
    CHECK_FALSE(ranks[1].done());
    // A duplicate is refused also before the data.
    allreduce_message again{4, 0, 0, {}};
    CHECK_FALSE(ranks[1].on_message(again));
    for (auto& m : ranks[1].start(data[1])) flight.push_back({2 % n, std::move(m)});
    deliver();
    for (int k = 0; k < n; ++k) {
      REQUIRE(ranks[static_cast<size_t>(k)].done());
      for (size_t i = 0; i < len; ++i) CHECK(ranks[static_cast<size_t>(k)].result()[i] == Approx(exact[i]));
      CHECK(ranks[static_cast<size_t>(k)].result() == ranks[0].result());
    }
  }
}
