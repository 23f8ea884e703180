// The all-reduce of members on one host (host_reduce.hpp) over simulated regions and marks
// delivered in any order: every rank gets the same bits, each value summed in rank order; marks
// a rank following the protocol never sends are refused.
#include <catch2/catch.hpp>

#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "actors/host_reduce.hpp"

using namespace mesh;

namespace {

struct in_flight {
  int from, to, bucket, phase;
};

/// n ranks, buckets of `sizes`; each rank posts its buckets in order, marks are delivered in a
/// random order. Returns each rank's view of every bucket's sum, end to end.
std::vector<std::vector<float>> simulate(int n, const std::vector<size_t>& sizes, uint64_t seed, std::vector<std::vector<float>>& inputs,
                                         const parallel_runner& parallel = {}) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<host_reduce> ranks;
  for (int r = 0; r < n; ++r) ranks.emplace_back(r, n, sizes);
  std::vector<std::vector<float>> regions(static_cast<size_t>(n), std::vector<float>(ranks[0].region_floats(), -7.0f));
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) ranks[static_cast<size_t>(r)].set_region(q, regions[static_cast<size_t>(q)].data());
    ranks[static_cast<size_t>(r)].set_own_region(regions[static_cast<size_t>(r)].data());
    if (parallel) ranks[static_cast<size_t>(r)].set_parallel(parallel);
  }
  inputs.assign(static_cast<size_t>(n), {});
  std::deque<in_flight> net;
  const auto send = [&](int from, const host_reduce::events& e) {
    for (const auto& m : e.marks)
      for (int to = 0; to < n; ++to)
        if (to != from) net.push_back({from, to, m.bucket, m.phase});
  };
  std::vector<int> next_post(static_cast<size_t>(n), 0);
  const int buckets = static_cast<int>(sizes.size());
  while (true) {
    // Either a rank posts its next bucket (its device read it back), or a mark is delivered.
    std::vector<int> can_post;
    for (int r = 0; r < n; ++r)
      if (next_post[static_cast<size_t>(r)] < buckets) can_post.push_back(r);
    if (can_post.empty() && net.empty()) break;
    if (!can_post.empty() && (net.empty() || rng() % 2)) {
      const int r = can_post[rng() % can_post.size()];
      const int b = next_post[static_cast<size_t>(r)]++;
      auto& h = ranks[static_cast<size_t>(r)];
      float* in = regions[static_cast<size_t>(r)].data() + h.input_offset(b);
      for (size_t i = 0; i < sizes[static_cast<size_t>(b)]; ++i) {
        in[i] = u(rng);
        inputs[static_cast<size_t>(r)].push_back(in[i]);
      }
      send(r, h.posted(b));
      continue;
    }
    // Marks between one pair of ranks stay in order (the transport's order per peer): take the
    // first in-flight mark of a random pair.
    const size_t pick = rng() % net.size();
    const in_flight chosen = net[pick];
    size_t first = 0;
    while (net[first].from != chosen.from || net[first].to != chosen.to) ++first;
    const in_flight m = net[first];
    net.erase(net.begin() + static_cast<ptrdiff_t>(first));
    auto e = ranks[static_cast<size_t>(m.to)].on_mark(m.from, m.bucket, m.phase);
    REQUIRE(e);
    send(m.to, *e);
  }
  std::vector<std::vector<float>> out;
  for (auto& h : ranks) {
    REQUIRE(h.done());
    std::vector<float> all;
    for (int b = 0; b < buckets; ++b)
      for (auto piece : h.sum_pieces(b)) all.insert(all.end(), piece.begin(), piece.end());
    out.push_back(std::move(all));
  }
  return out;
}

}  // namespace

TEST_CASE("host all-reduce: every rank gets the same bits, each value summed in rank order", "[host_reduce]") {
  for (int n : {2, 3, 4, 5}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      const std::vector<size_t> sizes{1000, 1, 0, 3, 257};
      std::vector<std::vector<float>> inputs;
      auto got = simulate(n, sizes, seed * 100 + static_cast<uint64_t>(n), inputs);
      const size_t total = inputs[0].size();
      std::vector<float> expect(total);
      for (size_t i = 0; i < total; ++i) {
        float s = inputs[0][i];
        for (int r = 1; r < n; ++r) s += inputs[static_cast<size_t>(r)][i];
        expect[i] = s;
      }
      for (const auto& g : got) {
        REQUIRE(g.size() == total);
        CHECK(std::memcmp(g.data(), expect.data(), total * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("host all-reduce: a share split over threads gives the same bits", "[host_reduce]") {
  const parallel_runner threads = [](int64_t parts, const std::function<void(int64_t)>& part) {
    std::vector<std::thread> ts;
    for (int64_t p = 0; p < parts; ++p) ts.emplace_back([&part, p] { part(p); });
    for (auto& t : ts) t.join();
  };
  const std::vector<size_t> sizes{3 * ring_allreduce::parallel_part_values + 17, 5};
  std::vector<std::vector<float>> in_one, in_many;
  auto one = simulate(3, sizes, 9, in_one);
  auto many = simulate(3, sizes, 9, in_many, threads);
  REQUIRE(in_one == in_many);
  REQUIRE(one.size() == many.size());
  for (size_t r = 0; r < one.size(); ++r) CHECK(std::memcmp(one[r].data(), many[r].data(), one[r].size() * sizeof(float)) == 0);
}

TEST_CASE("host all-reduce: the layout and the last value", "[host_reduce]") {
  CHECK(host_reduce(0, 2, {10, 4}, 37).sum_offset(0) == 48);  // past the base asked for, on a 64-byte boundary
  CHECK(host_reduce(0, 2, {10, 4}, 37).region_floats() == 80);
  host_reduce h(1, 3, {10, 100});
  CHECK(h.input_offset(0) == 0);
  CHECK(h.input_offset(1) == 16);  // 64-byte boundaries
  CHECK(h.sum_offset(0) == 128);    // right after the input areas unless a base is asked for
  CHECK(h.sum_offset(1) == 144);
  CHECK(h.region_floats() == 256);
  std::vector<std::vector<float>> regions(3, std::vector<float>(256, 0.0f));
  for (int r = 0; r < 3; ++r) h.set_region(r, regions[static_cast<size_t>(r)].data());
  h.set_own_region(regions[1].data());
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < 100; ++i) regions[static_cast<size_t>(r)][16 + i] = static_cast<float>(r + 1) * (i == 99 ? 10.0f : 1.0f);
  REQUIRE(h.posted(1).marks.size() == 1);
  REQUIRE(h.on_mark(0, 1, 0));
  // Every rank posted: this rank sums its share, values [100/3, 200/3) with each start rounded
  // down to 16 values (64 bytes): [32, 64).
  auto e = h.on_mark(2, 1, 0);
  REQUIRE(e);
  REQUIRE(e->marks.size() == 1);
  CHECK(e->marks[0].phase == 1);
  CHECK(regions[1][144 + 31] == 0.0f);
  CHECK(regions[1][144 + 32] == 6.0f);
  CHECK(regions[1][144 + 63] == 6.0f);
  CHECK(regions[1][144 + 64] == 0.0f);
  // The others' shares, [0, 32) and [64, 100), as they would sum them.
  for (size_t i = 0; i < 32; ++i) regions[0][144 + i] = 6.0f;
  for (size_t i = 64; i < 100; ++i) regions[2][144 + i] = i == 99 ? 60.0f : 6.0f;
  REQUIRE(h.on_mark(0, 1, 1));
  auto last = h.on_mark(2, 1, 1);
  REQUIRE(last);
  REQUIRE(last->done == std::vector<int>{1});
  CHECK(h.bucket_done(1));
  CHECK_FALSE(h.done());
  CHECK(h.last_value(1) == 60.0f);
  auto pieces = h.sum_pieces(1);
  REQUIRE(pieces.size() == 3);
  const size_t sizes[] = {32, 32, 36};
  for (size_t r = 0; r < 3; ++r) {
    CHECK(pieces[r].size() == sizes[r]);
    CHECK((pieces[r].data() - regions[r].data()) % 16 == 0);  // each share 64-byte aligned in its region
  }
}

TEST_CASE("host all-reduce: marks no rank following the protocol sends are refused", "[host_reduce]") {
  host_reduce h(0, 3, {8});
  std::vector<float> mine(h.region_floats()), a(h.region_floats()), b(h.region_floats());
  h.set_own_region(mine.data());
  h.set_region(1, a.data());
  h.set_region(2, b.data());
  const auto refused = [&](int from, int bucket, int phase, const char* why) {
    auto e = h.on_mark(from, bucket, phase);
    REQUIRE_FALSE(e);
    CHECK(e.error().code == error_code::invalid_argument);
    CHECK_THAT(e.error().message, Catch::Contains(why));
  };
  refused(0, 0, 0, "no other rank");
  refused(3, 0, 0, "no other rank");
  refused(-1, 0, 0, "no other rank");
  refused(1, 1, 0, "no such bucket");
  refused(1, -1, 0, "no such bucket");
  refused(1, 0, 2, "no such phase");
  refused(1, 0, 1, "summed before its rank posted");
  REQUIRE(h.on_mark(1, 0, 0));
  refused(1, 0, 0, "seen before");
  refused(1, 0, 1, "summed before this rank posted");
  CHECK(h.taken() == 1);
  // Nothing refused changed the round: it still completes.
  REQUIRE(h.posted(0).marks.size() == 1);
  auto e = h.on_mark(2, 0, 0);
  REQUIRE(e);
  REQUIRE(h.on_mark(1, 0, 1));
  REQUIRE(h.on_mark(2, 0, 1));
  CHECK(h.done());
}
