#pragma once
/// The all-reduce of members that all share one host: the pure core of one rank's step, no I/O.
///
/// Every member of the ring has mapped every other member's shared region (shared_region.hpp),
/// so no value needs to travel from hop to hop as in the ring (ring_allreduce.hpp). Each bucket
/// goes in two phases:
///   1. *posted*: a rank's bucket is in the input area of its own region (the device read it
///      back there) and it tells every other rank (a mark of phase 0);
///   2. *summed*: once all n ranks have posted the bucket, rank r adds share r of it (values
///      [r m / n, (r+1) m / n) of a bucket of m values, each start rounded down to a multiple of
///      share_align) over the n regions, in rank order, into the sum area of its own region,
///      and tells every other rank (a mark of phase 1).
/// When all n have summed, the bucket's sum lies in the n regions' sum areas, share by share
/// (sum_pieces): each rank writes it to its device from there. Each value is summed once, by one
/// rank, always in rank order: every replica gets the same bits. Per rank and bucket of m
/// values, host memory sees m values read and m/n written, against the ring's 2(n-1) hops, each
/// reading and writing its piece.
///
/// Regions are given as float arrays of region_floats() values each; their layout is fixed by
/// the bucket sizes (the same on every rank), so a mark need only name its bucket. A region is
/// reused from step to step: the coordinator issues the next step only when every member has
/// finished this one, so every rank has read the inputs; the sums, which each rank's device
/// writes read later, are written again only once every rank posted the bucket in a later step
/// (docs/training.md, "Peers on one host").
#include <cstdint>
#include <span>
#include <vector>

#include "actors/ring_allreduce.hpp"
#include "base/error.hpp"

namespace mesh {

class host_reduce {
 public:
  /// A mark to send to every other rank: bucket `bucket` reached phase `phase` here.
  struct mark {
    int bucket = 0;
    int phase = 0;  ///< 0 posted, 1 summed
  };
  /// What an event produced: marks to send to every other rank, buckets now summed everywhere.
  struct events {
    std::vector<mark> marks;
    std::vector<int> done;
  };

  /// Rank `rank` of `n` (n >= 2), buckets of `bucket_values[b]` values each; the sum areas from
  /// float `sum_base` of a region on (at least after the input areas; the train engine puts them
  /// past the room a ring step's pieces take, which a ring step right after this one may fill
  /// while a member still writes this step's sums to its device).
  host_reduce(int rank, int n, std::vector<size_t> bucket_values, size_t sum_base = 0);

  /// Floats a region holds: every bucket's input area, then (from sum_base) every sum area.
  size_t region_floats() const { return sum_base_ + total_; }
  /// Where bucket `b`'s input (its sum) starts in every region, in floats.
  size_t input_offset(int b) const { return offsets_[static_cast<size_t>(b)]; }
  size_t sum_offset(int b) const { return sum_base_ + offsets_[static_cast<size_t>(b)]; }
  size_t bucket_values(int b) const { return values_[static_cast<size_t>(b)]; }
  int buckets() const { return static_cast<int>(values_.size()); }
  int rank() const { return rank_; }
  int ranks() const { return n_; }

  /// The regions: rank i's at regions[i] (region_floats() each, this rank's writable), set
  /// before any event; a rank's may change (its region mapped again) between events.
  void set_region(int rank, const float* data);
  void set_own_region(float* data);
  /// Shares' sums are split into parts of ring_allreduce::parallel_part_values that `run`
  /// spreads over threads.
  void set_parallel(parallel_runner run) { parallel_ = std::move(run); }

  /// This rank's bucket `b` is in its region's input area.
  events posted(int b);
  /// A mark from rank `from`. Errors (invalid_argument) for a rank, bucket or phase out of
  /// range, a mark seen before, and a summed mark no rank following the protocol sends: before
  /// that rank's own post (its marks arrive in order) or before this rank posted (no rank can
  /// sum a bucket before every rank posted it).
  expected<events> on_mark(int from, int bucket, int phase);

  bool bucket_done(int b) const { return summed_[static_cast<size_t>(b)] == n_; }
  bool done() const { return done_ == buckets(); }
  /// Bucket `b`'s sum, end to end, as n pieces (rank i's share in rank i's region): valid once
  /// bucket_done(b), until the regions are reused.
  std::vector<std::span<const float>> sum_pieces(int b) const;
  /// The bucket's last value (the loss sum the last bucket ends with), once bucket_done(b).
  float last_value(int b) const;
  /// Marks taken from other ranks so far (a stalled round's probe).
  uint32_t taken() const { return taken_; }

 private:
  /// Shares start on multiples of this many values (64 bytes).
  static constexpr size_t share_align = 16;
  std::pair<size_t, size_t> share(int b, int rank) const;
  /// Sums this rank's share of bucket `b` into its sum area; the summed mark.
  void sum_share(int b, events& out);
  void note_summed(int b, events& out);

  int rank_, n_;
  std::vector<size_t> values_, offsets_;
  size_t total_ = 0, sum_base_ = 0;
  std::vector<const float*> regions_;
  float* own_ = nullptr;
  parallel_runner parallel_;
  /// Per bucket: ranks whose post / summed mark came (this rank's own included), and which.
  std::vector<int> posted_, summed_;
  std::vector<std::vector<uint8_t>> seen_;  ///< [bucket][rank * 2 + phase]
  int done_ = 0;
  uint32_t taken_ = 0;
};

}  // namespace mesh
