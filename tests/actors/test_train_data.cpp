// Dataset shards and data order (actors/train_data.hpp): shards cover every row once, the plan
// shrinks the shard count when the dataset is small, and a micro-batch's rows depend on the
// seed, the slot and the step only.
#include <catch2/catch.hpp>

#include <set>

#include "actors/train_data.hpp"

using namespace mesh;

TEST_CASE("shards partition the rows and the plan fits the dataset", "[actors][train]") {
  for (const auto& [rows, micro_batch, k] : {std::tuple{200, 16, 6u}, {40, 16, 6u}, {16, 16, 4u}, {1000, 1, 7u}}) {
    INFO(rows << " rows, micro-batch " << micro_batch << ", " << k << " slots");
    const auto plan = shard_plan::make(rows, micro_batch, k);
    CHECK(plan.shards == std::min<uint32_t>(k, static_cast<uint32_t>(rows / micro_batch)));
    std::set<int64_t> seen;
    size_t total = 0;
    const auto permutation = shard_permutation(rows, 9);
    for (uint32_t s = 0; s < plan.shards; ++s) {
      const auto r = shard_rows(permutation, plan.shards, s);
      CHECK(static_cast<int64_t>(r.size()) >= micro_batch);  // every shard fills a micro-batch
      seen.insert(r.begin(), r.end());
      total += r.size();
    }
    CHECK(total == static_cast<size_t>(rows));
    CHECK(seen.size() == static_cast<size_t>(rows));  // each row in exactly one shard
    // Slots sharing a shard draw different micro-batches of it within a step.
    std::set<std::pair<uint32_t, uint64_t>> draws;
    for (uint64_t step = 0; step < 3; ++step)
      for (uint32_t j = 0; j < k; ++j) {
        const uint64_t m = step * k + j;
        CHECK(plan.shard_of(m) == j % plan.shards);
        CHECK(draws.insert({plan.shard_of(m), plan.draw_of(m)}).second);
      }
  }
}

TEST_CASE("a shard's order is a permutation per epoch, fixed by the seed", "[actors][train]") {
  data_order a(33, 16, shard_seed(5, 2)), b(33, 16, shard_seed(5, 2)), other(33, 16, shard_seed(5, 3));
  CHECK(a.per_epoch() == 2);
  const auto first = a.rows(0), second = a.rows(1);
  std::set<int64_t> epoch(first.begin(), first.end());
  epoch.insert(second.begin(), second.end());
  CHECK(epoch.size() == 32);  // two micro-batches of one epoch never repeat a row
  CHECK(b.rows(1) == second);
  CHECK(b.rows(0) == first);
  CHECK(other.rows(0) != first);
}
