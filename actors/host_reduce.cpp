#include "actors/host_reduce.hpp"

#include <algorithm>
#include <string>

namespace mesh {

host_reduce::host_reduce(int rank, int n, std::vector<size_t> bucket_values, size_t sum_base)
    : rank_(rank), n_(std::max(n, 1)), values_(std::move(bucket_values)), regions_(static_cast<size_t>(n_), nullptr),
      posted_(values_.size(), 0), summed_(values_.size(), 0), seen_(values_.size(), std::vector<uint8_t>(2 * static_cast<size_t>(n_), 0)) {
  for (size_t v : values_) {
    offsets_.push_back(total_);
    total_ += (v + 15) & ~size_t{15};  // each bucket's areas on a 64-byte boundary
  }
  sum_base_ = (std::max(sum_base, total_) + 15) & ~size_t{15};
}

void host_reduce::set_region(int rank, const float* data) {
  if (rank >= 0 && rank < n_) regions_[static_cast<size_t>(rank)] = data;
}

void host_reduce::set_own_region(float* data) {
  own_ = data;
  set_region(rank_, data);
}

std::pair<size_t, size_t> host_reduce::share(int b, int rank) const {
  const size_t m = values_[static_cast<size_t>(b)];
  // Each share but the first starts on a multiple of share_align values: with the areas on
  // 64-byte boundaries every share then starts 64-byte aligned in every region, where a GPU's
  // copy engine moves it at full speed (a copy 4 bytes off runs at about half).
  const auto start = [&](int r) {
    return r >= n_ ? m : m * static_cast<size_t>(r) / static_cast<size_t>(n_) / share_align * share_align;
  };
  return {start(rank), start(rank + 1)};
}

host_reduce::events host_reduce::posted(int b) {
  events out;
  if (b < 0 || b >= buckets() || seen_[static_cast<size_t>(b)][static_cast<size_t>(rank_) * 2]) return out;
  seen_[static_cast<size_t>(b)][static_cast<size_t>(rank_) * 2] = 1;
  out.marks.push_back({b, 0});
  if (++posted_[static_cast<size_t>(b)] == n_) sum_share(b, out);
  return out;
}

expected<host_reduce::events> host_reduce::on_mark(int from, int bucket, int phase) {
  const auto bad = [&](const std::string& why) {
    return make_error(error_code::invalid_argument, "host all-reduce mark (rank " + std::to_string(from) + ", bucket " + std::to_string(bucket) +
                                                        ", phase " + std::to_string(phase) + "): " + why);
  };
  if (from < 0 || from >= n_ || from == rank_) return bad("no other rank of " + std::to_string(n_));
  if (bucket < 0 || bucket >= buckets()) return bad("no such bucket of " + std::to_string(buckets()));
  if (phase != 0 && phase != 1) return bad("no such phase");
  auto& seen = seen_[static_cast<size_t>(bucket)];
  const size_t at = static_cast<size_t>(from) * 2;
  if (seen[at + static_cast<size_t>(phase)]) return bad("seen before");
  if (phase == 1 && !seen[at]) return bad("summed before its rank posted");
  if (phase == 1 && !seen[static_cast<size_t>(rank_) * 2]) return bad("summed before this rank posted");
  seen[at + static_cast<size_t>(phase)] = 1;
  ++taken_;
  events out;
  if (phase == 0) {
    if (++posted_[static_cast<size_t>(bucket)] == n_) sum_share(bucket, out);
  } else {
    note_summed(bucket, out);
  }
  return out;
}

void host_reduce::sum_share(int b, events& out) {
  const auto range = share(b, rank_);
  const size_t lo = range.first, hi = range.second;  // (captured below: no structured binding)
  const size_t in = input_offset(b), sum = sum_offset(b);
  const auto part = [&](size_t from, size_t to) {
    float* dst = own_ + sum + from;
    const float* first = regions_[0] + in + from;
    std::copy(first, first + (to - from), dst);
    for (int r = 1; r < n_; ++r) {
      const float* src = regions_[static_cast<size_t>(r)] + in + from;
      for (size_t i = 0; i < to - from; ++i) dst[i] += src[i];
    }
  };
  for_each_part(parallel_, hi - lo, ring_allreduce::parallel_part_values, [&](size_t from, size_t to) { part(lo + from, lo + to); });
  seen_[static_cast<size_t>(b)][static_cast<size_t>(rank_) * 2 + 1] = 1;
  out.marks.push_back({b, 1});
  note_summed(b, out);
}

void host_reduce::note_summed(int b, events& out) {
  if (++summed_[static_cast<size_t>(b)] == n_) {
    ++done_;
    out.done.push_back(b);
  }
}

std::vector<std::span<const float>> host_reduce::sum_pieces(int b) const {
  std::vector<std::span<const float>> out;
  for (int r = 0; r < n_; ++r) {
    const auto [lo, hi] = share(b, r);
    out.emplace_back(regions_[static_cast<size_t>(r)] + sum_offset(b) + lo, hi - lo);
  }
  return out;
}

float host_reduce::last_value(int b) const {
  const size_t m = values_[static_cast<size_t>(b)];
  if (m == 0) return 0;
  // The last value is in the share of the last rank with a non-empty share: rank n-1's.
  return regions_[static_cast<size_t>(n_ - 1)][sum_offset(b) + m - 1];
}

}  // namespace mesh
