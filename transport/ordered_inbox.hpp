#pragma once
/// Restores, on the receiving side, the order in which one peer sent its control and bulk
/// messages: a pure class, no I/O.
///
/// Control messages travel in order on the peer's control stream; each bulk message travels on a
/// unidirectional stream of its own, so that packets of a large tensor never wait behind each
/// other's retransmissions, and may therefore complete before messages the peer sent earlier, or
/// after later ones. The sender marks each bulk message's place in the order with an empty
/// `bulk_next` frame on the control stream, queued when the message is: the n-th marker stands for
/// the peer's n-th bulk stream (streams are opened in the order messages are queued). The inbox
/// hands a message to the application once everything sent before it has been handed over.
///
/// What it holds is bounded: bytes of messages waiting for an earlier one (control messages
/// behind an unfinished bulk message, bulk messages that finished early) may not exceed the
/// budget, nor their number `max_held`; past either, the peer is in breach (an error the
/// connection closes on), never buffered without bound.
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "base/error.hpp"

namespace mesh::transport {

class ordered_inbox {
 public:
  struct message {
    bool bulk = false;
    std::vector<uint8_t> bytes;
  };

  /// At most this many messages wait at once (their bookkeeping costs memory too).
  static constexpr size_t max_held = 1 << 16;

  explicit ordered_inbox(uint64_t budget) : budget_(budget) {}

  /// A control message, in control-stream order. Appends to `out` what may be handed over now.
  expected<void> on_control(std::vector<uint8_t> bytes, std::vector<message>& out);
  /// A `bulk_next` marker: the peer's next bulk message takes this place in the order.
  expected<void> on_bulk_marker(std::vector<message>& out);
  /// Bulk message number `ordinal` (0 = the peer's first bulk stream) is complete.
  expected<void> on_bulk(uint64_t ordinal, std::vector<uint8_t> bytes, std::vector<message>& out);

  /// Whether bulk message `ordinal` is still to be handed over and not here yet (a peer that
  /// resets its stream then breaks its order).
  bool expects(uint64_t ordinal) const { return ordinal >= delivered_bulk_ && !early_bulk_.count(ordinal); }
  /// The bulk message (its ordinal) handed over next: until it is, later ones wait here.
  uint64_t next_bulk() const { return delivered_bulk_; }
  /// Whether that message's marker is here (anything queued starts with it: flush() hands over
  /// what comes before), so that it is handed over the moment it completes; without its marker
  /// a completed message waits here too.
  bool next_bulk_marked() const { return !queue_.empty(); }
  /// Bytes of messages waiting for an earlier one.
  uint64_t held_bytes() const { return held_bytes_; }
  /// Messages waiting (control messages queued, bulk messages finished early).
  size_t held() const { return queue_.size() + early_bulk_.size(); }

 private:
  struct slot {
    bool bulk = false;
    uint64_t ordinal = 0;        ///< bulk: which of the peer's bulk messages goes here
    std::vector<uint8_t> bytes;  ///< control: the message
  };
  expected<void> hold(uint64_t bytes);
  void flush(std::vector<message>& out);

  uint64_t budget_;
  uint64_t held_bytes_ = 0;
  uint64_t markers_ = 0;       ///< bulk_next markers seen: the next one stands for this ordinal
  uint64_t delivered_bulk_ = 0;  ///< bulk messages handed over
  std::deque<slot> queue_;       ///< in sent order, from the oldest not yet handed over
  std::map<uint64_t, std::vector<uint8_t>> early_bulk_;  ///< finished before their turn
};

}  // namespace mesh::transport
