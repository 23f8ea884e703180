#include "actors/train_data.hpp"

#include <algorithm>
#include <cstring>
#include <random>

namespace mesh {

data_order::data_order(int64_t examples, int64_t size, uint64_t seed) : examples_(examples), size_(size), seed_(seed) {}

std::vector<int64_t> data_order::rows(uint64_t index) {
  const uint64_t epoch = index / per_epoch();
  if (epoch != epoch_) {
    order_.resize(static_cast<size_t>(examples_));
    for (int64_t i = 0; i < examples_; ++i) order_[static_cast<size_t>(i)] = i;
    // std::shuffle's algorithm is left to the library; this loop is the same everywhere.
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ull + epoch);
    for (int64_t i = examples_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
    epoch_ = epoch;
  }
  const auto first = static_cast<size_t>((index % per_epoch()) * static_cast<uint64_t>(size_));
  return {order_.begin() + static_cast<std::ptrdiff_t>(first),
          order_.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(size_))};
}

shard_plan shard_plan::make(int64_t rows, int64_t micro_batch, uint32_t micro_batches) {
  shard_plan p;
  p.micro_batches = std::max<uint32_t>(micro_batches, 1);
  const auto fit = static_cast<uint64_t>(rows / std::max<int64_t>(micro_batch, 1));
  p.shards = static_cast<uint32_t>(std::clamp<uint64_t>(fit, 1, p.micro_batches));
  p.draws_per_step = (p.micro_batches + p.shards - 1) / p.shards;
  return p;
}

std::vector<int64_t> shard_permutation(int64_t rows, uint64_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) all[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(seed * 0xbf58476d1ce4e5b9ull + 1);  // the same Fisher-Yates loop as data_order
  for (int64_t i = rows - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(j)]);
  }
  return all;
}

std::vector<int64_t> shard_rows(const std::vector<int64_t>& permutation, uint32_t shards, uint32_t shard) {
  const auto rows = static_cast<uint64_t>(permutation.size());
  const auto first = static_cast<size_t>(rows * shard / shards), last = static_cast<size_t>(rows * (shard + 1) / shards);
  return {permutation.begin() + static_cast<std::ptrdiff_t>(first), permutation.begin() + static_cast<std::ptrdiff_t>(last)};
}

expected<tensor_map> take_rows(const tensor_map& columns, const std::vector<int64_t>& rows) {
  tensor_map out;
  for (const auto& [name, col] : columns) {
    if (col.dims.empty()) return make_error(error_code::invalid_argument, "dataset column \"" + name + "\" is a scalar");
    const int64_t n = col.dims[0];
    const size_t row_bytes = col.bytes.size() / static_cast<size_t>(std::max<int64_t>(n, 1));
    tensor t;
    t.type = col.type;
    t.dims = col.dims;
    t.dims[0] = static_cast<int64_t>(rows.size());
    t.bytes.resize(row_bytes * rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= n) return make_error(error_code::invalid_argument, "row " + std::to_string(rows[i]) + " is outside column \"" + name + "\"");
      std::memcpy(t.bytes.data() + i * row_bytes, col.bytes.data() + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
    }
    out[name] = std::move(t);
  }
  return out;
}

}  // namespace mesh
