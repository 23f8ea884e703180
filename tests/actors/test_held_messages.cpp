#include <catch2/catch.hpp>

#include "actors/held_messages.hpp"
#include "test_ids.hpp"

using namespace mesh;
using namespace std::chrono_literals;

namespace {

msg::message heartbeat_of(uint64_t load) {
  msg::heartbeat h;
  h.running_stages = static_cast<uint32_t>(load);
  return h;
}

uint64_t load_of(const msg::message& m) { return std::get<msg::heartbeat>(m).running_stages; }

}  // namespace

TEST_CASE("held messages come back per peer in order and leave nothing counted", "[actors][held]") {
  held_messages h(10, 1000, 30s);
  const auto t0 = held_messages::clock::now();
  for (uint64_t i = 0; i < 3; ++i) REQUIRE(h.hold(test::named("a"), heartbeat_of(i), 10, t0));
  REQUIRE(h.hold(test::named("b"), heartbeat_of(7), 10, t0));
  CHECK(h.count() == 4);
  CHECK(h.bytes() == 40);
  auto a = h.take(test::named("a"));
  REQUIRE(a.size() == 3);
  for (uint64_t i = 0; i < 3; ++i) CHECK(load_of(a[i]) == i);
  CHECK_FALSE(h.holds(test::named("a")));
  CHECK(h.holds(test::named("b")));
  CHECK(h.take(test::named("nobody")).empty());
  CHECK(h.count() == 1);
  CHECK(h.bytes() == 10);
}

TEST_CASE("held messages are bounded in count and bytes", "[actors][held]") {
  held_messages h(2, 100, 30s);
  const auto t0 = held_messages::clock::now();
  CHECK(h.hold(test::named("a"), heartbeat_of(1), 60, t0));
  CHECK_FALSE(h.hold(test::named("a"), heartbeat_of(2), 50, t0));  // over the bytes
  CHECK(h.hold(test::named("b"), heartbeat_of(3), 40, t0));
  CHECK_FALSE(h.hold(test::named("c"), heartbeat_of(4), 0, t0));  // over the count
  CHECK(h.count() == 2);
}

TEST_CASE("held messages nobody comes for expire, so they cannot fill the store for good", "[actors][held]") {
  // A result for a client that left, a stage_done for a dead coordinator: produced after that
  // peer's down was handled, so no up or down will ever flush them.
  held_messages h(2, 1000, 30s);
  const auto t0 = held_messages::clock::now();
  REQUIRE(h.hold(test::named("gone"), heartbeat_of(1), 10, t0));
  REQUIRE(h.hold(test::named("late"), heartbeat_of(2), 10, t0 + 20s));
  CHECK_FALSE(h.hold(test::named("newcomer"), heartbeat_of(3), 10, t0 + 25s));  // full
  CHECK(h.expire(t0 + 29s) == 0);
  CHECK(h.expire(t0 + 31s) == 1);
  CHECK_FALSE(h.holds(test::named("gone")));
  CHECK(h.holds(test::named("late")));
  CHECK(h.hold(test::named("newcomer"), heartbeat_of(3), 10, t0 + 31s));  // room again
  CHECK(h.expire(t0 + 62s) == 2);
  CHECK(h.count() == 0);
  CHECK(h.bytes() == 0);
}

TEST_CASE("held messages flush in order while the sender accepts, and keep the rest", "[actors][held]") {
  held_messages h(10, 1000, 30s);
  const auto t0 = held_messages::clock::now();
  for (uint64_t i = 0; i < 4; ++i) REQUIRE(h.hold(test::named("a"), heartbeat_of(i), 10, t0));
  std::vector<uint64_t> sent;
  CHECK_FALSE(h.flush(test::named("a"), [&](const msg::message& m) {
    if (sent.size() == 2) return false;  // the send queue is full after two
    sent.push_back(load_of(m));
    return true;
  }));
  CHECK(sent == std::vector<uint64_t>{0, 1});
  CHECK(h.count() == 2);
  CHECK(h.bytes() == 20);
  CHECK(h.flush(test::named("a"), [&](const msg::message& m) {
    sent.push_back(load_of(m));
    return true;
  }));
  CHECK(sent == std::vector<uint64_t>{0, 1, 2, 3});
  CHECK_FALSE(h.holds(test::named("a")));
  CHECK(h.count() == 0);
  CHECK(h.flush(test::named("nobody"), [](const msg::message&) { return false; }));
}
