#include <catch2/catch.hpp>

#include "actors/restart_budget.hpp"

using namespace mesh;
using namespace std::chrono_literals;

TEST_CASE("the restart budget allows N restarts per window, then escalates", "[actors][supervisor]") {
  restart_budget b(3, 10s);
  CHECK(b.allow(0s));
  CHECK(b.allow(1s));
  CHECK(b.allow(2s));
  CHECK_FALSE(b.allow(3s));  // a 4th crash within 10 s: stop the node
  CHECK(b.used(3s) == 3);
  CHECK(b.allow(10s));  // the first restart left the window
  CHECK(b.used(10s) == 3);
}
