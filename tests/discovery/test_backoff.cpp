#include <catch2/catch.hpp>

#include "discovery/backoff.hpp"

using mesh::discovery::backoff;
using ms = std::chrono::milliseconds;

TEST_CASE("backoff: doubles up to the maximum, reset starts over", "[discovery][backoff]") {
  backoff b(ms(250), ms(1500));
  CHECK(b.next() == ms(250));
  CHECK(b.next() == ms(500));
  CHECK(b.next() == ms(1000));
  CHECK(b.next() == ms(1500));
  CHECK(b.next() == ms(1500));
  b.reset();
  CHECK(b.next() == ms(250));
}
