// The inbox that restores a peer's send order of control and bulk messages (pure: no sockets).
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "transport/ordered_inbox.hpp"

using namespace mesh;
using namespace mesh::transport;

namespace {
std::vector<uint8_t> tagged(uint8_t tag, size_t size = 1) { return std::vector<uint8_t>(size, tag); }
std::vector<int> tags(const std::vector<ordered_inbox::message>& ms) {
  std::vector<int> out;
  for (const auto& m : ms) out.push_back(m.bytes.empty() ? -1 : m.bytes[0]);
  return out;
}
}  // namespace

TEST_CASE("control messages pass straight through while nothing earlier is missing", "[transport][inbox]") {
  ordered_inbox in(1 << 20);
  std::vector<ordered_inbox::message> out;
  REQUIRE(in.on_control(tagged(1), out));
  REQUIRE(in.on_control(tagged(2), out));
  CHECK(tags(out) == std::vector<int>{1, 2});
  CHECK(in.held() == 0);
}

TEST_CASE("a bulk message late or early takes its marker's place", "[transport][inbox]") {
  ordered_inbox in(1 << 20);
  std::vector<ordered_inbox::message> out;
  // Sent: c1, B0, c2, B1, c3. B1 finishes first, then the control stream, then B0.
  REQUIRE(in.on_bulk(1, tagged(11), out));
  REQUIRE(in.on_control(tagged(1), out));
  REQUIRE(in.on_bulk_marker(out));
  REQUIRE(in.on_control(tagged(2), out));
  REQUIRE(in.on_bulk_marker(out));
  REQUIRE(in.on_control(tagged(3), out));
  CHECK(tags(out) == std::vector<int>{1});
  CHECK(in.held() == 5);  // the slots of B0, c2, B1, c3 in order, and B1 itself: all wait for B0
  REQUIRE(in.on_bulk(0, tagged(10), out));
  CHECK(tags(out) == std::vector<int>{1, 10, 2, 11, 3});
  CHECK(in.held() == 0);
  CHECK(in.held_bytes() == 0);
}

TEST_CASE("any interleaving of the two streams gives the send order", "[transport][inbox]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    // A random send order of control and bulk messages, tagged by position.
    std::vector<bool> is_bulk(40);
    for (auto&& b : is_bulk) b = rng() % 3 == 0;
    // Control-stream events (controls and markers, in order) and bulk completions (any order)
    // merged at random, control stream order kept.
    std::vector<std::pair<bool, int>> control_stream;  // (marker, tag)
    std::vector<std::pair<uint64_t, int>> bulks;       // (ordinal, tag)
    for (int i = 0; i < 40; ++i) {
      control_stream.push_back({is_bulk[i], i});
      if (is_bulk[i]) bulks.push_back({bulks.size(), i});
    }
    std::shuffle(bulks.begin(), bulks.end(), rng);
    ordered_inbox in(1 << 20);
    std::vector<ordered_inbox::message> out;
    size_t c = 0, b = 0;
    while (c < control_stream.size() || b < bulks.size()) {
      if (b == bulks.size() || (c < control_stream.size() && rng() % 2)) {
        auto [marker, tag] = control_stream[c++];
        const bool ok = marker ? in.on_bulk_marker(out).has_value() : in.on_control(tagged(static_cast<uint8_t>(tag)), out).has_value();
        REQUIRE(ok);
      } else {
        auto [ordinal, tag] = bulks[b++];
        const bool ok = in.on_bulk(ordinal, tagged(static_cast<uint8_t>(tag)), out).has_value();
        REQUIRE(ok);
      }
    }
    std::vector<int> expected(40);
    for (int i = 0; i < 40; ++i) expected[static_cast<size_t>(i)] = i;
    REQUIRE(tags(out) == expected);
    CHECK(in.held() == 0);
  }
}

TEST_CASE("what waits is bounded: past the budget the peer is in breach, with the reason", "[transport][inbox]") {
  ordered_inbox in(1000);
  std::vector<ordered_inbox::message> out;
  REQUIRE(in.on_bulk_marker(out));  // bulk 0 never finishes
  REQUIRE(in.on_control(tagged(1, 600), out));
  auto r = in.on_control(tagged(2, 600), out);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == error_code::limit_exceeded);
  CHECK(r.error().message.find("receive budget") != std::string::npos);
  // Bulk messages far ahead of their markers count too.
  ordered_inbox ahead(1000);
  REQUIRE(ahead.on_bulk(5, tagged(5, 700), out));
  CHECK_FALSE(ahead.on_bulk(6, tagged(6, 700), out));
  // And a bulk message that arrives twice is a protocol error.
  ordered_inbox twice(1000);
  REQUIRE(twice.on_bulk_marker(out));
  REQUIRE(twice.on_bulk(0, tagged(0), out));
  auto again = twice.on_bulk(0, tagged(0), out);
  REQUIRE_FALSE(again);
  CHECK(again.error().message.find("arrived twice") != std::string::npos);
}

TEST_CASE("a bulk message whose turn it is never counts against the budget", "[transport][inbox]") {
  // Its marker first in line and a control message behind it: the bulk message is handed over
  // at once, however large (a budget check here would cut off an honest peer).
  ordered_inbox in(1000);
  std::vector<ordered_inbox::message> out;
  REQUIRE(in.on_bulk_marker(out));
  REQUIRE(in.on_control(tagged(1, 10), out));
  REQUIRE(in.on_bulk(0, tagged(0, 995), out));
  CHECK(tags(out) == std::vector<int>{0, 1});
  CHECK(in.held_bytes() == 0);
  CHECK_FALSE(in.expects(0));
  CHECK(in.expects(1));
}
