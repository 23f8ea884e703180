#pragma once
/// Which rows of the dataset each micro-batch holds: the same answer on every node, with no
/// coordination beyond the seed.
///
/// Each epoch visits the examples in a fresh order (a Fisher-Yates shuffle driven by
/// std::mt19937_64, whose output the standard fixes bit for bit); micro-batch i of the run is
/// the i-th run of `size` consecutive examples in that order. The tail of an epoch that does not
/// fill a micro-batch is skipped, so every micro-batch has exactly `size` rows.
#include <cstdint>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"

namespace mesh {

class data_order {
 public:
  /// `examples` >= `size` >= 1 (checked by the caller).
  data_order(int64_t examples, int64_t size, uint64_t seed);
  /// The rows of micro-batch `index`.
  std::vector<int64_t> rows(uint64_t index);
  uint64_t per_epoch() const { return static_cast<uint64_t>(examples_ / size_); }

 private:
  int64_t examples_, size_;
  uint64_t seed_;
  uint64_t epoch_ = ~0ull;  ///< the epoch `order_` belongs to
  std::vector<int64_t> order_;
};

/// The dataset cut into shards, so that a worker holds only the rows it trains on.
///
/// The rows are permuted once (from the seed) and cut into S near-equal shards, S = the
/// micro-batches per step k, or fewer when the dataset is too small for k shards of one
/// micro-batch each. Micro-batch slot j of every step always draws from shard j mod S, with that
/// shard's own epoch order: which rows a micro-batch holds depends on the seed, k and the step,
/// never on how many workers there are or which one computes it. A worker computing slot j needs
/// only shard j mod S; when workers come or go, the shards move with the slots.
struct shard_plan {
  uint32_t shards = 1;          ///< S
  uint32_t micro_batches = 1;   ///< k
  uint32_t draws_per_step = 1;  ///< ceil(k / S): slots of a step that share one shard

  /// `rows` >= `micro_batch` >= 1 (checked by the caller).
  static shard_plan make(int64_t rows, int64_t micro_batch, uint32_t micro_batches);
  /// The shard that micro-batch `index` of the run (step * k + slot) draws from.
  uint32_t shard_of(uint64_t index) const { return static_cast<uint32_t>(index % micro_batches) % shards; }
  /// Which draw from that shard's order it is (its micro-batch index within the shard).
  uint64_t draw_of(uint64_t index) const {
    return (index / micro_batches) * draws_per_step + (index % micro_batches) / shards;
  }
};

/// The dataset's rows in the seeded order the shards are cut from (computed once per run).
std::vector<int64_t> shard_permutation(int64_t rows, uint64_t seed);
/// The rows that shard `shard` of `shards` holds, in the order it stores them: its slice of
/// `permutation`.
std::vector<int64_t> shard_rows(const std::vector<int64_t>& permutation, uint32_t shards, uint32_t shard);

/// The seed of shard `shard`'s own epoch order.
inline uint64_t shard_seed(uint64_t seed, uint32_t shard) { return seed ^ (0x9e3779b97f4a7c15ull * (shard + 1)); }

/// The given rows of every column (dimension 0 = examples), as one micro-batch of inputs.
expected<tensor_map> take_rows(const tensor_map& columns, const std::vector<int64_t>& rows);

}  // namespace mesh
