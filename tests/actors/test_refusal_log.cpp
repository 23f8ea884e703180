// The per-peer log of refused messages that status replies report (meshctl peers).
#include <catch2/catch.hpp>

#include "actors/refusal_log.hpp"

using namespace mesh;

TEST_CASE("refusals are counted per peer with the last reason, and the log is bounded", "[actors][refusals]") {
  refusal_log log;
  log.record("p1", "version_mismatch: a message of protocol version 9");
  log.record("p1", "limit_exceeded: decoding would allocate more than the budget");
  CHECK(log.of("p1").count == 2);
  CHECK(log.of("p1").last.find("limit_exceeded") == 0);
  CHECK(log.of("p2").count == 0);
  // Past the bound the peer that refused nothing for longest goes, whatever its id sorts as.
  log.record("a-early", "x");
  for (size_t i = 0; i < refusal_log::max_peers; ++i) log.record("z" + std::to_string(i), "x");
  CHECK(log.of("p1").count == 0);       // the oldest entry
  CHECK(log.of("a-early").count == 0);  // next oldest, though its id sorts first
  CHECK(log.of("z0").count == 1);
  log.record("p1", "again");
  CHECK(log.of("p1").count == 1);
}
