#include <catch2/catch.hpp>

#include "transport/delivery_meter.hpp"

using mesh::transport::delivery_meter;

namespace {
constexpr uint64_t ms = 1'000'000;
}

TEST_CASE("delivery meter: bursty acknowledgements measure the mean rate, not the burst's",
          "[transport][delivery_meter]") {
  // 125 MB/s delivered as 250 KB acknowledged at once every 2 ms: per-burst samples would read
  // a rate without bound; the meter's windows hold several bursts.
  delivery_meter m;
  uint64_t acked = 0;
  for (uint64_t t = 0; t <= 200 * ms; t += 2 * ms) {
    m.sample(t, acked, 100'000);
    m.sample(t + 1000, acked += 250'000, 100'000);  // the burst lands within a microsecond
  }
  INFO("best rate " << m.best_rate());
  CHECK(m.best_rate() >= 118'000'000);
  CHECK(m.best_rate() <= 140'000'000);
}

TEST_CASE("delivery meter: the best window counts, idle windows do not lower it", "[transport][delivery_meter]") {
  delivery_meter m;
  CHECK(m.best_rate() == 0);
  uint64_t acked = 0, t = 0;
  for (; t <= 50 * ms; t += ms) m.sample(t, acked += 100'000, 50'000);  // 100 MB/s
  const uint64_t busy = m.best_rate();
  CHECK(busy >= 95'000'000);
  CHECK(busy <= 105'000'000);
  for (; t <= 150 * ms; t += ms) m.sample(t, acked, 50'000);  // nothing to send
  CHECK(m.best_rate() == busy);
}

TEST_CASE("delivery meter: windows span at least two round trips", "[transport][delivery_meter]") {
  // With a 40 ms round trip, a 20 ms window would not close: no rate yet after 60 ms.
  delivery_meter m;
  uint64_t acked = 0;
  for (uint64_t t = 0; t <= 60 * ms; t += ms) m.sample(t, acked += 10'000, 40 * ms);
  CHECK(m.best_rate() == 0);
  m.sample(90 * ms, acked += 10'000, 40 * ms);
  CHECK(m.best_rate() > 0);
}
