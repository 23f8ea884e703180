#include "transport/delivery_meter.hpp"

#include <algorithm>

namespace mesh::transport {

void delivery_meter::sample(uint64_t now_ns, uint64_t acked_total, uint64_t rtt_ns) {
  if (!started_ || acked_total < start_acked_ || now_ns < start_ns_) {
    started_ = true;
    start_ns_ = now_ns;
    start_acked_ = acked_total;
    return;
  }
  const uint64_t elapsed = now_ns - start_ns_;
  if (elapsed < std::max(min_window_ns, 2 * rtt_ns)) return;
  const double rate = static_cast<double>(acked_total - start_acked_) * 1e9 / static_cast<double>(elapsed);
  best_ = std::max(best_, static_cast<uint64_t>(rate));
  start_ns_ = now_ns;
  start_acked_ = acked_total;
}

}  // namespace mesh::transport
