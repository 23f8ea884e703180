// The ring all-reduce over a simulated network: every rank ends with the same bits, equal to the
// sum; messages may arrive in any order; hostile or stale messages are rejected.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cmath>
#include <limits>
#include <deque>
#include <random>
#include <thread>

#include "actors/allreduce_codec.hpp"
#include "actors/ring_allreduce.hpp"

using namespace mesh;

namespace {

/// Replaces xs with decode(encode(xs)): what a receiver gets, bit for bit.
void round_trip(float* xs, size_t count, wire_format f) {
  std::vector<uint8_t> bytes;
  encode(xs, count, f, bytes);
  decode(bytes.data(), count, f, xs);
}

struct sim_result {
  std::vector<std::vector<float>> results;
  std::vector<double> exact;
  uint64_t bytes_per_rank = 0;
};

/// Runs one round on `n` ranks; in-flight messages are delivered in a random order.
sim_result simulate(int n, size_t len, int pieces, wire_format fmt, uint64_t seed, const parallel_runner& parallel = {}) {
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
    if (parallel) ranks.back().set_parallel(parallel);
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

TEST_CASE("a piece's passes split over threads give the same bits as on one thread, in every wire format", "[actors][allreduce]") {
  // Pieces of 2.3 parts and a ragged end: parts end on block boundaries, the last one short.
  // Every part runs on its own thread, started last part first.
  std::atomic<int64_t> parts_run{0};
  const parallel_runner threaded = [&](int64_t parts, const std::function<void(int64_t)>& part) {
    std::vector<std::thread> ts;
    for (int64_t p = parts - 1; p >= 0; --p) ts.emplace_back([&part, p] { part(p); });
    for (auto& t : ts) t.join();
    parts_run += parts;
  };
  const size_t len = 3 * 2 * (2 * ring_allreduce::parallel_part_values + ring_allreduce::parallel_part_values / 3) + 77;
  for (auto fmt : {wire_format::f32, wire_format::bf16, wire_format::f16, wire_format::int8, wire_format::fp4}) {
    INFO("format " << static_cast<int>(fmt));
    parts_run = 0;
    const auto one = simulate(3, len, 2, fmt, 41);
    const auto many = simulate(3, len, 2, fmt, 41, threaded);
    CHECK(parts_run > 0);
    CHECK(many.bytes_per_rank == one.bytes_per_rank);
    for (size_t k = 0; k < 3; ++k) CHECK(std::memcmp(many.results[k].data(), one.results[k].data(), len * sizeof(float)) == 0);
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

TEST_CASE("block formats: sizes, round trips within their steps, zeros, signs and NaN blocks", "[actors][allreduce]") {
  for (size_t count : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{100}}) {
    INFO("count " << count);
    const size_t blocks = (count + 31) / 32;
    CHECK(encoded_bytes(count, wire_format::int8) == blocks * 4 + count);
    CHECK(encoded_bytes(count, wire_format::fp4) == blocks * 4 + (count / 32) * 16 + (count % 32 + 1) / 2);
    CHECK(encoded_bytes(count, wire_format::f32) == count * 4);
    CHECK(encoded_bytes(count, wire_format::bf16) == count * 2);
  }
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> xs(100);
  for (auto& x : xs) x = u(rng) * (u(rng) > 0 ? 1.0f : 1e-3f);  // blocks of mixed magnitudes
  xs[5] = 0;
  for (const auto f : {wire_format::int8, wire_format::fp4}) {
    INFO(to_string(f));
    std::vector<uint8_t> bytes;
    encode(xs.data(), xs.size(), f, bytes);
    REQUIRE(bytes.size() == encoded_bytes(xs.size(), f));
    std::vector<float> ys(xs.size());
    decode(bytes.data(), xs.size(), f, ys.data());
    for (size_t b0 = 0; b0 < xs.size(); b0 += 32) {
      float top = 0;
      for (size_t i = b0; i < std::min(xs.size(), b0 + 32); ++i) top = std::max(top, std::abs(xs[i]));
      for (size_t i = b0; i < std::min(xs.size(), b0 + 32); ++i) {
        INFO("i " << i << " x " << xs[i] << " decoded " << ys[i]);
        CHECK((ys[i] == 0 || (ys[i] > 0) == (xs[i] > 0)));  // signs kept
        if (f == wire_format::int8) {
          CHECK(std::abs(ys[i] - xs[i]) <= top / 127 / 2 * 1.0001f);  // half a step
        } else if (std::abs(xs[i]) >= top * 0.0110485f) {     // above 2^-6.5 of the block's largest
          CHECK(std::abs(ys[i]) <= std::abs(xs[i]) * 1.41422f);  // the nearest power of two in the log domain
          CHECK(std::abs(ys[i]) >= std::abs(xs[i]) / 1.41422f);
        } else {
          CHECK(ys[i] == 0);
        }
      }
    }
    CHECK(ys[5] == 0);
    // round_trip is decode(encode(x)) in place.
    std::vector<float> again = xs;
    round_trip(again.data(), again.size(), f);
    CHECK(again == ys);
    // A block with a NaN or an infinity decodes to NaN (only that block); all zeros stay zeros.
    std::vector<float> bad(64, 0.5f), zeros(40, 0.0f);
    bad[3] = std::numeric_limits<float>::infinity();
    round_trip(bad.data(), bad.size(), f);
    round_trip(zeros.data(), zeros.size(), f);
    CHECK(std::isnan(bad[0]));
    CHECK(std::isnan(bad[31]));
    CHECK(bad[32] == 0.5f);
    CHECK(std::all_of(zeros.begin(), zeros.end(), [](float z) { return z == 0; }));
  }
}

TEST_CASE("int8 and fp4 all-reduce: replicas bit-identical, sums within the formats' steps, fewer bytes", "[actors][allreduce]") {
  const auto ref = simulate(3, 960, 2, wire_format::f32, 5);
  for (const auto& [f, tolerance] : {std::pair{wire_format::int8, 0.03}, std::pair{wire_format::fp4, 0.35}}) {
    INFO(to_string(f));
    auto r = simulate(3, 960, 2, f, 5);
    for (size_t k = 1; k < r.results.size(); ++k) REQUIRE(r.results[k] == r.results[0]);
    double err = 0, size = 0;
    for (size_t i = 0; i < r.exact.size(); ++i) {
      err += std::abs(r.results[0][i] - r.exact[i]);
      size += std::abs(r.exact[i]);
    }
    CHECK(err / size < tolerance);  // mean error relative to the mean |sum|
    CHECK(r.bytes_per_rank == encoded_bytes(160, f) * 8);  // 2(n-1) steps x 2 pieces of 160 values
    CHECK(r.bytes_per_rank * (f == wire_format::int8 ? 3 : 6) < ref.bytes_per_rank);
  }
  // A piece one byte short is refused.
  ring_allreduce a(5, 0, 3, std::vector<float>(100, 1.0f), 1, wire_format::fp4), b(5, 1, 3, std::vector<float>(100, 2.0f), 1, wire_format::fp4);
  auto first = a.start();
  REQUIRE(first.size() == 1);
  auto short_payload = first[0];
  short_payload.payload.pop_back();
  CHECK_FALSE(b.on_message(short_payload));
  CHECK(b.on_message(first[0]));
}
