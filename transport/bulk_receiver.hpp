#pragma once
// The receiving side of one connection's bulk streams, without I/O: each peer-opened
// unidirectional stream carries exactly one bulk frame (one message). This decodes the streams,
// decides how much flow-control credit each may get back under the connection's receive budget,
// and hands back complete messages. The connection feeds it what ngtcp2 delivers and applies the
// credit it answers; tests and a fuzzer drive it directly.
//
// The budget: a message gets credit beyond the peer's initial stream window only once the peer
// is admitted and the message's announced size fits what the budget has left. Messages that do
// not fit wait in the order the peer sent them, by stream id (a stream of small ones cannot starve
// a large one), and are granted as earlier ones finish or are dropped. So what one peer can make a
// node hold in unfinished messages is the budget plus one stream window per open stream.
// The connection hands messages over in that same order (ordered_inbox.hpp): one that finishes
// before an earlier one waits in its inbox, under a budget of the same size. A message ahead of
// the one the inbox waits for is therefore granted only while the inbox has room for it too
// (set_inbox), so credit given here never puts a peer that keeps to it past the inbox's budget.
// Delivered messages the application still holds (set_delivered, delivery_receipt.hpp) count
// against the same budget: they are granted nothing while those fill it.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "transport/buffer_pool.hpp"
#include "transport/frame.hpp"

namespace mesh::transport {

class bulk_receiver {
 public:
  struct config {
    frame_limits limits;
    uint64_t budget = uint64_t{4} << 30;  ///< raised to limits.bulk if below it
    uint64_t stream_window = 16u << 20;   ///< the peer's initial credit per stream
    buffer_pool* pool = nullptr;          ///< lends reused buffers for whole messages
  };
  explicit bulk_receiver(config cfg);
  bulk_receiver(const bulk_receiver&) = delete;  // its decoders call back into it
  bulk_receiver& operator=(const bulk_receiver&) = delete;

  /// What one call hands back.
  struct result {
    uint64_t credit = 0;                         ///< stream credit to return now for this stream
    std::optional<std::vector<uint8_t>> message; ///< the stream's message, at its FIN
  };
  /// The next `bytes` of stream `sid`, in order; `fin` when they end it. An error (malformed or
  /// oversized frame, anything after the one frame, FIN inside it) means the connection must close.
  expected<result> on_data(int64_t sid, std::span<const uint8_t> bytes, bool fin);
  /// The stream was reset or closed: drops it and returns its budget to waiting messages.
  void forget(int64_t sid);
  /// The peer proved itself: budget may be granted from now on (nothing is before).
  void admit();
  /// The bytes of delivered messages the application holds now: they take their share of the
  /// budget. Lowering it grants waiting messages what it frees (take_grants()).
  void set_delivered(uint64_t bytes);
  /// Where the connection's inbox stands: `next_sid` is the stream whose message it hands over
  /// next, `held` the bytes waiting there for an earlier message (its budget is this one),
  /// `next_marked` whether the marker of `next_sid`'s message has come (without it, that message
  /// too waits there when it completes). A message that may wait there (a later stream, or
  /// `next_sid` unmarked) is granted budget only while what the inbox holds, plus such messages
  /// granted already, plus it, fit. A change that frees room grants waiting messages what it
  /// frees (take_grants()). Until this is called no stream counts as ahead.
  void set_inbox(int64_t next_sid, uint64_t held, bool next_marked);
  /// Credit owed to waiting streams that were granted budget by forget() or admit() (or by the
  /// end of another stream inside on_data) since the last call: (stream, bytes) pairs.
  std::vector<std::pair<int64_t, uint64_t>> take_grants();

  uint64_t receiving() const { return receiving_; }    ///< payload bytes held in unfinished messages
  uint64_t peak() const { return peak_; }              ///< the most of them at once
  /// What may still be granted: the budget less unfinished messages' grants and delivered bytes.
  uint64_t budget_left() const { return budget_left_ > delivered_ ? budget_left_ - delivered_ : 0; }
  size_t open_streams() const { return streams_.size(); }
  size_t waiting() const { return queue_.size(); }

 private:
  struct stream {
    frame_decoder decoder;
    std::vector<frame> frames;
    uint64_t budgeted = 0;    // bytes of the budget it holds
    bool has_budget = false;
    bool queued = false;      // in queue_
    uint64_t uncredited = 0;  // received while waiting: credited when granted
    uint64_t held = 0;        // payload bytes counted in receiving_
    uint64_t buffered() const { return frames.empty() ? decoder.receiving_bytes() : frames.front().payload.size(); }
    std::optional<uint64_t> size() const {
      return frames.empty() ? decoder.receiving_length() : std::optional(uint64_t{frames.front().payload.size()});
    }
  };
  uint64_t reserve_for(int64_t sid, uint64_t length) const;
  /// Whether stream `sid`'s message of `size` bytes may be granted now (budget and inbox).
  bool fits(int64_t sid, uint64_t size) const;
  /// Waits for budget (`queue_`), in stream order.
  void enqueue(int64_t sid);
  void grant(stream& s, uint64_t size);
  void grant_waiting();

  config cfg_;
  bool admitted_ = false;
  uint64_t budget_;       // the budget, and the inbox's
  uint64_t budget_left_;  // the budget less what unfinished messages were granted
  uint64_t delivered_ = 0;
  uint64_t receiving_ = 0, peak_ = 0;
  std::map<int64_t, stream> streams_;
  std::deque<int64_t> queue_;  // waiting for budget, in stream order (the peer's send order)
  int64_t inbox_next_ = INT64_MAX;  // set_inbox(): streams after it may finish early
  bool inbox_next_marked_ = true;   // and it too, while its marker has not come
  uint64_t inbox_held_ = 0;
  /// Whether stream `sid`'s message, complete, would wait in the inbox (set_inbox).
  bool waits_in_inbox(int64_t sid) const { return sid > inbox_next_ || (sid == inbox_next_ && !inbox_next_marked_); }
  std::vector<std::pair<int64_t, uint64_t>> grants_;
};

}  // namespace mesh::transport
