// relay_sessions without I/O: relayed peers prove the mesh secret end to end, and no box is
// accepted twice or outside its session.
#include <catch2/catch.hpp>

#include "transport/identity.hpp"
#include "transport/relay_sessions.hpp"

using namespace mesh;
using namespace mesh::transport;

namespace {
const std::vector<uint8_t> secret(32, 9);

/// A opens a session with B; returns the pair.
std::pair<relay_sessions, relay_sessions> opened(const node_id& a, const node_id& b) {
  relay_sessions sa(a, secret), sb(b, secret);
  auto ack = sb.on_hello(a, sa.hello(b));
  REQUIRE(ack);
  REQUIRE(sa.on_ack(b, *ack));
  REQUIRE(sa.open(b));
  REQUIRE(sb.open(a));
  return {std::move(sa), std::move(sb)};
}
}  // namespace

TEST_CASE("relay sessions: messages flow both ways, in order, each accepted once", "[transport][relay][security]") {
  const auto a = identity::generate().id(), b = identity::generate().id();
  auto [sa, sb] = opened(a, b);
  for (int i = 0; i < 3; ++i) {
    auto m = sa.seal(b, 0, {static_cast<uint8_t>(i)});
    REQUIRE(m);
    CHECK(m->seq == static_cast<uint64_t>(i + 1));
    CHECK(sb.accept(a, *m));
    CHECK_FALSE(sb.accept(a, *m));  // the same box again: a replay
  }
  auto back = sb.seal(a, 1, {7});
  REQUIRE(back);
  CHECK(sa.accept(b, *back));
  // An older box (a lower sequence number) recorded earlier is refused too.
  auto first = sa.seal(b, 0, {1}), second = sa.seal(b, 0, {2});
  CHECK(sb.accept(a, *second));
  auto refused = sb.accept(a, *first);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("replayed") != std::string::npos);
}

TEST_CASE("relay sessions: a box of an earlier session is refused in the next one", "[transport][relay][security]") {
  const auto a = identity::generate().id(), b = identity::generate().id();
  auto [sa, sb] = opened(a, b);
  auto old_box = sa.seal(b, 0, {1});
  REQUIRE(old_box);
  const auto old_hello = sa.hello(b);  // a second session (A reconnected through the relay)
  auto ack = sb.on_hello(a, old_hello);
  REQUIRE(ack);
  REQUIRE(sa.on_ack(b, *ack));
  CHECK_FALSE(sb.accept(a, *old_box));  // recorded in the first session, sequence 1 or not
  auto fresh = sa.seal(b, 0, {2});
  CHECK(sb.accept(a, *fresh));
  // The open session's hello replayed gets the same answer and resets nothing.
  auto again = sb.on_hello(a, old_hello);
  REQUIRE(again);
  CHECK(again->payload == ack->payload);
  CHECK_FALSE(sb.accept(a, *fresh));
  CHECK(sb.accept(a, *sa.seal(b, 0, {3})));
  CHECK_FALSE(sa.on_ack(b, *ack));  // an answer to no hello of ours
}

TEST_CASE("relay sessions: a peer without the mesh secret opens none", "[transport][relay][security]") {
  const auto a = identity::generate().id(), b = identity::generate().id();
  relay_sessions stranger(a, std::vector<uint8_t>(32, 1)), sb(b, secret), sa(a, secret);
  auto refused = sb.on_hello(a, stranger.hello(b));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("does not prove the mesh secret") != std::string::npos);
  CHECK_FALSE(sb.open(a));
  CHECK_FALSE(sb.seal(a, 0, {1}));
  // A node of another mesh refuses a member's hello the same way.
  relay_sessions other(b, std::vector<uint8_t>(32, 2));
  CHECK_FALSE(other.on_hello(a, sa.hello(b)));
  relay_sessions open_b(b, {}), open_a(a, {});
  auto open_ack = open_b.on_hello(a, open_a.hello(b));  // the open mesh: no secret on either side
  REQUIRE(open_ack);
  CHECK(open_a.on_ack(b, *open_ack));
  // A tag altered on the way.
  auto hello = sa.hello(b);
  hello.payload[3] ^= 1;
  CHECK_FALSE(sb.on_hello(a, hello));
  // An answer altered on the way (its tag no longer matches).
  auto genuine = sb.on_hello(a, sa.hello(b));
  REQUIRE(genuine);
  genuine->payload[20] ^= 1;
  CHECK_FALSE(sa.on_ack(b, *genuine));
}
