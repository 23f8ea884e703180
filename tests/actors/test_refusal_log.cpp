// The per-peer log of refused messages that status replies report (meshctl peers).
#include <catch2/catch.hpp>

#include "actors/refusal_log.hpp"
#include "test_ids.hpp"

using namespace mesh;

TEST_CASE("refusals are counted per peer with the last reason, and the log is bounded", "[actors][refusals]") {
  refusal_log log;
  log.record(test::named("p1"), "version_mismatch: a message of protocol version 9");
  log.record(test::named("p1"), "limit_exceeded: decoding would allocate more than the budget");
  CHECK(log.of(test::named("p1")).count == 2);
  CHECK(log.of(test::named("p1")).last.find("limit_exceeded") == 0);
  CHECK(log.of(test::named("p2")).count == 0);
  // Past the bound the peer that refused nothing for longest goes, whatever its id sorts as.
  log.record(test::named("a-early"), "x");
  for (size_t i = 0; i < refusal_log::max_peers; ++i) log.record(test::named("z" + std::to_string(i)), "x");
  CHECK(log.of(test::named("p1")).count == 0);       // the oldest entry
  CHECK(log.of(test::named("a-early")).count == 0);  // next oldest, though its id sorts first
  CHECK(log.of(test::named("z0")).count == 1);
  log.record(test::named("p1"), "again");
  CHECK(log.of(test::named("p1")).count == 1);
}
