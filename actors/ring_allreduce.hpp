#pragma once
/// The ring all-reduce's pure core: one rank's state machine for one round, no I/O.
///
/// The buffer is split into n chunks (n = ring size), each chunk into `pieces` so that a rank
/// forwards piece p as soon as it has it: every link stays busy (pipelining). Reduce-scatter takes
/// n-1 steps (each rank adds the chunk it receives to its own and forwards it), all-gather n-1
/// more (the fully reduced chunk is copied around). Each chunk's sum is computed once, by one
/// rank, in ring order, and then copied: every replica ends bit-identical.
///
/// A round is all or nothing: result() exists only when done(); a membership change aborts the
/// round (drop the object) and the caller starts a new round over the new ring with its original
/// data, so nothing is half applied. Messages carry the round id; stale ones are rejected.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "wire/states.hpp"

namespace mesh {

/// One piece of one step, sent from a rank to its successor in the ring.
struct allreduce_message {
  uint64_t round = 0;
  uint32_t step = 0;   ///< 0 .. 2(n-1)-1; the first n-1 are reduce-scatter
  uint32_t piece = 0;  ///< 0 .. pieces-1
  std::vector<uint8_t> payload;  ///< the piece's values in the round's wire format
  /// Written by the payload_placer instead (payload empty): `placed_bytes` at `placed_offset`.
  bool placed = false;
  uint64_t placed_offset = 0, placed_bytes = 0;
};

/// Where a rank's outgoing payloads may go instead of into their messages (its shared region,
/// train_engine::set_shared_memory): for a payload of `bytes`, a place to encode it (the address,
/// and the offset the message names), or none (the payload goes in the message).
using payload_placer = std::function<std::optional<std::pair<uint8_t*, uint64_t>>(size_t bytes)>;

/// Runs part(i) for every i in [0, parts), possibly on several threads at once, and returns when
/// all have returned (train_engine::set_parallel: the node's host-copy threads).
using parallel_runner = std::function<void(int64_t parts, const std::function<void(int64_t)>& part)>;

/// fn(from, to) over [0, count) in parts of `part` values, spread by `run` (all on the caller's
/// thread without one, or with a single part). Each part's `from` is a multiple of `part`.
void for_each_part(const parallel_runner& run, size_t count, size_t part, const std::function<void(size_t, size_t)>& fn);

/// A received piece without a copy of its payload (the message it came in still holds it).
struct allreduce_piece_ref {
  uint64_t round = 0;
  uint32_t step = 0, piece = 0;
  std::span<const uint8_t> payload;
};

class ring_allreduce {
 public:
  /// Rank `rank` of a ring of `n`, summing `data` (same length on every rank).
  ring_allreduce(uint64_t round, int rank, int n, std::vector<float> data, int pieces = 4,
                 wire_format format = wire_format::f32);
  /// The same round before this rank's data exists (it is still being computed): messages from
  /// the predecessor are taken already and applied when start(data) brings the data. They are
  /// at most one round's worth (each step and piece once), so nothing here grows without bound.
  ring_allreduce(uint64_t round, int rank, int n, int pieces, wire_format format);

  /// Payloads made from now on go where `place` says, when it gives a place.
  void set_placer(payload_placer place) { placer_ = std::move(place); }
  /// A piece's sums, copies and encodings are split into parts of parallel_part_values values
  /// that `run` spreads over threads (one piece of a 33 MB bucket on 4 ranks is 2 MB: on one
  /// thread the ring's passes over host memory bound a data-parallel step on one host).
  void set_parallel(parallel_runner run) { parallel_ = std::move(run); }
  /// Values per part (a multiple of the block formats' block).
  static constexpr size_t parallel_part_values = size_t{1} << 16;
  /// The messages to send to the successor when the round starts (the data was given).
  std::vector<allreduce_message> start();
  /// Gives this rank's data to a round made without it: what to send to the successor, the
  /// first pieces and what the messages taken so far forward.
  std::vector<allreduce_message> start(std::vector<float> data);

  /// A message from the predecessor. Returns what to forward, or an error for a message that
  /// does not belong to this round (wrong round, step, piece or size, or a duplicate).
  expected<std::vector<allreduce_message>> on_message(const allreduce_piece_ref& m);
  expected<std::vector<allreduce_message>> on_message(const allreduce_message& m) {
    return on_message(allreduce_piece_ref{m.round, m.step, m.piece, m.payload});
  }

  bool done() const { return final_pieces_ == total_pieces(); }
  /// The sum over all ranks (valid only when done()).
  const std::vector<float>& result() const { return data_; }
  /// Moves the sum out (valid only when done(); the round holds no data after): the buffer the
  /// round was started with, so a caller may keep reusing it.
  std::vector<float> take_result() { return std::move(data_); }
  uint64_t round() const { return round_; }
  /// Messages taken from the predecessor so far (a stalled round's coordinator asks: the member
  /// after a silent one has taken the fewest).
  uint32_t taken() const { return static_cast<uint32_t>(std::count(seen_.begin(), seen_.end(), true)); }
  /// Bytes this rank sends in a whole round (for benchmarks: 2(n-1)/n of the buffer, per rank).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  size_t total_pieces() const { return static_cast<size_t>(n_) * static_cast<size_t>(pieces_); }
  /// Element range [begin, end) of piece p of chunk c.
  std::pair<size_t, size_t> range(int chunk, int piece) const;
  /// Writes the encoded values [from, to) of a piece at `out` (encoded_bytes(from) into the payload).
  using part_writer = std::function<void(uint8_t* out, size_t from, size_t to)>;
  /// The message of `step` for piece `piece` of chunk `chunk`, encoded from the data.
  allreduce_message make(uint32_t step, int chunk, int piece);
  /// The same, its payload (in the shared region where the placer gives a place) written part
  /// by part by `write`.
  allreduce_message make(uint32_t step, int chunk, int piece, const part_writer& write);
  int chunk_at(uint32_t step, bool received) const;
  /// Adds or copies a checked message (its slot marked seen) into the data; what to forward.
  expected<std::vector<allreduce_message>> apply(const allreduce_piece_ref& m);
  /// fn(from, to) over [0, count) values in parts (parallel_), each part's `from` on a block
  /// boundary, so that encoded bytes start at encoded_bytes(from).
  void in_parts(size_t count, const std::function<void(size_t, size_t)>& fn) const;

  uint64_t round_;
  int rank_, n_, pieces_;
  wire_format format_;
  std::vector<float> data_;
  std::vector<bool> seen_;  ///< (step, piece) already received
  bool has_data_ = true;
  std::vector<allreduce_message> taken_;  ///< received before the data, in order of arrival
  std::vector<float> received_;           ///< a reduce-scatter piece, decoded
  size_t final_pieces_ = 0;
  uint64_t bytes_sent_ = 0;
  payload_placer placer_;
  parallel_runner parallel_;
};

/// A step's all-reduce in buckets: one ring round per bucket, round ids base + b, each started as
/// soon as its bucket of this rank's data is ready (the gradients of the last layers while the
/// backward pass still computes the first ones). Buckets are independent rounds over the same
/// ring; the result is their results end to end. A bucket's messages before its data are taken,
/// as one round takes them.
class bucketed_allreduce {
 public:
  /// `buckets` >= 1 rounds; `base` a multiple of max_buckets.
  static constexpr int max_buckets = 256;
  bucketed_allreduce(uint64_t base, int rank, int n, int buckets, int pieces, wire_format format);

  int buckets() const { return static_cast<int>(rounds_.size()); }
  /// ring_allreduce::set_placer for every bucket's round.
  void set_placer(const payload_placer& place) {
    for (auto& r : rounds_) r.set_placer(place);
  }
  /// ring_allreduce::set_parallel for every bucket's round.
  void set_parallel(const parallel_runner& run) {
    for (auto& r : rounds_) r.set_parallel(run);
  }
  /// Whether a message of round `round` belongs to one of these buckets.
  bool owns(uint64_t round) const { return round >= base_ && round < base_ + rounds_.size(); }
  /// Bucket `bucket`'s data (once); the messages to send.
  std::vector<allreduce_message> start(int bucket, std::vector<float> data);
  bool started(int bucket) const { return started_[static_cast<size_t>(bucket)]; }
  /// A message from the predecessor, for the bucket its round names.
  expected<std::vector<allreduce_message>> on_message(const allreduce_piece_ref& m);
  expected<std::vector<allreduce_message>> on_message(const allreduce_message& m) {
    return on_message(allreduce_piece_ref{m.round, m.step, m.piece, m.payload});
  }

  bool done() const;
  /// Whether the round `round` (one of these buckets') is done.
  bool round_done(uint64_t round) const { return owns(round) && rounds_[static_cast<size_t>(round - base_)].done(); }
  /// Every bucket's sum, end to end (valid only when done()).
  std::vector<float> result() const;
  /// Each bucket's sum, moved out (valid only when done(); the rounds hold no data after; a
  /// bucket taken already by take_result is empty).
  std::vector<std::vector<float>> take_results();
  /// Bucket `bucket`'s sum, moved out (valid only when round_done for its round).
  std::vector<float> take_result(int bucket) { return rounds_[static_cast<size_t>(bucket)].take_result(); }
  uint32_t taken() const;
  uint64_t bytes_sent() const;

 private:
  uint64_t base_;
  std::vector<ring_allreduce> rounds_;
  std::vector<bool> started_;
};

}  // namespace mesh
