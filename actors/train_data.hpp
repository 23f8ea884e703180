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

#include "graph/error.hpp"
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

/// The given rows of every column (dimension 0 = examples), as one micro-batch of inputs.
expected<tensor_map> take_rows(const tensor_map& columns, const std::vector<int64_t>& rows);

}  // namespace mesh
