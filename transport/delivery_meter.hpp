#pragma once
/// A connection's delivery rate, measured from its running count of acknowledged bytes over
/// windows long enough to smooth out how acknowledgements arrive.
///
/// Why not ngtcp2's own figure: acknowledgements come in bursts (behind a shaped link's queue,
/// delayed and coalesced), and ngtcp2 0.12's per-acknowledgement samples read 1.0-1.4 GB/s on a
/// veth shaped to 125 MB/s. A limit derived from them came out different on every connection of
/// an all-reduce ring, which is what leaves ring links idle (docs/training.md). A window of at
/// least 10 ms and two round trips holds many bursts, so its rate is the link's.
#include <cstdint>

namespace mesh::transport {

class delivery_meter {
 public:
  static constexpr uint64_t min_window_ns = 10'000'000;

  /// `acked_total`: bytes acknowledged so far on the connection (never decreasing);
  /// `rtt_ns`: its current round-trip estimate. Call it as often as convenient.
  void sample(uint64_t now_ns, uint64_t acked_total, uint64_t rtt_ns);

  /// The highest rate of any completed window, bytes per second; 0 before the first one ends.
  /// The best, not the latest: windows spent waiting for data to send measure the application,
  /// not the path.
  uint64_t best_rate() const { return best_; }

 private:
  bool started_ = false;
  uint64_t start_ns_ = 0, start_acked_ = 0, best_ = 0;
};

}  // namespace mesh::transport
