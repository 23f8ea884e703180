// bulk_receiver without I/O: which stream gets credit when, under the receive budget.
#include <catch2/catch.hpp>

#include "transport/bulk_receiver.hpp"

using namespace mesh::transport;

namespace {

/// A bulk stream's bytes: the frame header, then `size` payload bytes.
std::vector<uint8_t> message_stream(uint64_t size, uint8_t fill, const frame_limits& limits) {
  auto h = encode_frame_header(frame_kind::bulk, size, limits);
  REQUIRE(h);
  std::vector<uint8_t> s(h->bytes.begin(), h->bytes.begin() + h->size);
  s.insert(s.end(), static_cast<size_t>(size), fill);
  return s;
}

bulk_receiver::config small_config() {
  bulk_receiver::config c;
  c.limits.bulk = 1000;
  c.budget = 1000;
  c.stream_window = 100;
  return c;
}

std::span<const uint8_t> part(const std::vector<uint8_t>& s, size_t from, size_t n) { return {s.data() + from, n}; }

}  // namespace

TEST_CASE("bulk_receiver: a message that fits the budget is credited as it arrives and handed back at FIN",
          "[transport][bulk_receiver]") {
  bulk_receiver rx(small_config());
  rx.admit();
  const auto s = message_stream(600, 7, small_config().limits);
  auto a = rx.on_data(3, part(s, 0, 50), false);
  REQUIRE(a);
  CHECK(a->credit == 50);
  CHECK(rx.budget_left() == 400);
  auto b = rx.on_data(3, part(s, 50, s.size() - 50), true);
  REQUIRE(b);
  CHECK(b->credit == s.size() - 50);
  REQUIRE(b->message);
  CHECK(*b->message == std::vector<uint8_t>(600, 7));
  CHECK(rx.budget_left() == 400);  // delivered: held until the application releases it
  rx.set_delivered(0);
  CHECK(rx.budget_left() == 1000);
  CHECK(rx.receiving() == 0);
  CHECK(rx.peak() == 600);
  CHECK(rx.open_streams() == 0);
}

TEST_CASE("bulk_receiver: a message that does not fit waits without credit, then gets what it is owed",
          "[transport][bulk_receiver]") {
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  rx.admit();
  const auto first = message_stream(700, 1, cfg.limits), second = message_stream(500, 2, cfg.limits);
  REQUIRE(rx.on_data(3, part(first, 0, 80), false)->credit == 80);
  auto w = rx.on_data(7, part(second, 0, 90), false);  // 500 > 300 left: waits
  REQUIRE(w);
  CHECK(w->credit == 0);
  CHECK(rx.waiting() == 1);
  CHECK(rx.take_grants().empty());
  auto done = rx.on_data(3, part(first, 80, first.size() - 80), true);
  REQUIRE(done);
  CHECK(done->message);
  CHECK(rx.take_grants().empty());  // delivered, and still held by the application
  rx.set_delivered(0);
  // The first message's release made room: the second gets the 90 bytes it was not credited.
  const auto grants = rx.take_grants();
  REQUIRE(grants.size() == 1);
  CHECK(grants[0] == std::pair<int64_t, uint64_t>{7, 90});
  CHECK(rx.waiting() == 0);
  auto rest = rx.on_data(7, part(second, 90, second.size() - 90), true);
  REQUIRE(rest);
  CHECK(rest->credit == second.size() - 90);
  CHECK(*rest->message == std::vector<uint8_t>(500, 2));
}

TEST_CASE("bulk_receiver: waiting messages are granted oldest first, and small ones do not overtake",
          "[transport][bulk_receiver]") {
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  rx.admit();
  const auto big = message_stream(900, 1, cfg.limits), large = message_stream(800, 2, cfg.limits),
             tiny = message_stream(10, 3, cfg.limits);
  REQUIRE(rx.on_data(1, part(big, 0, 20), false)->credit == 20);
  REQUIRE(rx.on_data(2, part(large, 0, 20), false)->credit == 0);  // waits: 800 > 100
  REQUIRE(rx.on_data(3, part(tiny, 0, 5), false)->credit == 0);    // fits, but an older one waits
  CHECK(rx.waiting() == 2);
  rx.forget(1);  // reset: its budget comes back
  const auto grants = rx.take_grants();
  REQUIRE(grants.size() == 2);
  CHECK(grants[0].first == 2);
  CHECK(grants[1].first == 3);
  CHECK(rx.budget_left() == 1000 - 800 - 10);
}

TEST_CASE("bulk_receiver: before admission nothing gets budget", "[transport][bulk_receiver]") {
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  const auto s = message_stream(300, 4, cfg.limits);
  auto a = rx.on_data(5, part(s, 0, 60), false);
  REQUIRE(a);
  CHECK(a->credit == 0);
  CHECK(rx.waiting() == 1);
  rx.admit();
  const auto grants = rx.take_grants();
  REQUIRE(grants.size() == 1);
  CHECK(grants[0] == std::pair<int64_t, uint64_t>{5, 60});
  // A message complete within the peer's initial window is handed back even while waiting.
  bulk_receiver early(cfg);
  const auto small = message_stream(20, 9, cfg.limits);
  auto m = early.on_data(9, small, true);
  REQUIRE(m);
  CHECK(m->credit == 0);
  REQUIRE(m->message);
  CHECK(m->message->size() == 20);
  CHECK(early.waiting() == 0);
}

TEST_CASE("bulk_receiver: anything after the one frame, or a FIN inside it, is an error", "[transport][bulk_receiver]") {
  const auto cfg = small_config();
  auto two = message_stream(0, 0, cfg.limits);
  const auto second = message_stream(500, 1, cfg.limits);
  two.insert(two.end(), second.begin(), second.begin() + 2);  // a second header, incomplete
  bulk_receiver rx(cfg);
  rx.admit();
  CHECK_FALSE(rx.on_data(1, two, false));
  bulk_receiver rx2(cfg);
  rx2.admit();
  const auto s = message_stream(50, 1, cfg.limits);
  CHECK_FALSE(rx2.on_data(1, part(s, 0, 20), true));
  CHECK(rx2.open_streams() == 0);
  CHECK(rx2.budget_left() == 1000);  // the failed stream's budget came back
  bulk_receiver rx3(cfg);
  const auto too_big = message_stream(1001, 1, frame_limits{});  // the limit is 1000 here
  CHECK_FALSE(rx3.on_data(1, part(too_big, 0, 10), false));
}

TEST_CASE("bulk_receiver: delivered messages the application holds take their share of the budget",
          "[transport][bulk_receiver][security]") {
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  rx.admit();
  rx.set_delivered(700);  // the application still holds 700 bytes of earlier messages
  CHECK(rx.budget_left() == 300);
  const auto m = message_stream(500, 4, cfg.limits);
  auto w = rx.on_data(5, part(m, 0, 60), false);
  REQUIRE(w);
  CHECK(w->credit == 0);  // 500 > 300: waits with its sender held
  CHECK(rx.waiting() == 1);
  rx.set_delivered(150);  // released: now it fits
  const auto grants = rx.take_grants();
  REQUIRE(grants.size() == 1);
  CHECK(grants[0] == std::pair<int64_t, uint64_t>{5, 60});
  auto done = rx.on_data(5, part(m, 60, m.size() - 60), true);
  REQUIRE(done);
  REQUIRE(done->message);
  // Handed over: it counts as delivered until the application says otherwise.
  CHECK(rx.budget_left() == 1000 - 150 - 500);
  rx.set_delivered(0);
  CHECK(rx.budget_left() == 1000);
}

TEST_CASE("bulk_receiver: waiting messages are granted in stream order, not the order their headers came",
          "[transport][bulk_receiver]") {
  // The peer sent streams 3, 7, 11, 15 in that order; stream 3's first packet was lost, so its
  // header comes last. Granted in header order, 15 would get the budget before 3: it and 7 would
  // both finish before 3 and wait in the inbox, and two of them do not fit its budget.
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  rx.admit();
  rx.set_inbox(3, 0, true);
  const auto m3 = message_stream(400, 3, cfg.limits), m7 = message_stream(400, 7, cfg.limits),
             m11 = message_stream(300, 11, cfg.limits), m15 = message_stream(400, 15, cfg.limits);
  REQUIRE(rx.on_data(7, part(m7, 0, 50), false)->credit == 50);
  REQUIRE(rx.on_data(11, part(m11, 0, 50), false)->credit == 50);
  REQUIRE(rx.on_data(15, part(m15, 0, 50), false)->credit == 0);  // waits: 400 > 300 left
  REQUIRE(rx.on_data(3, part(m3, 0, 50), false)->credit == 0);    // waits too, ahead of 15
  CHECK(rx.waiting() == 2);
  auto early = rx.on_data(7, part(m7, 50, m7.size() - 50), true);  // finishes before 3
  REQUIRE(early);
  REQUIRE(early->message);
  rx.set_inbox(3, 400, true);  // it waits in the inbox for 3
  rx.set_delivered(0);  // 700 left: 3 goes first, and 15 waits behind it
  auto grants = rx.take_grants();
  REQUIRE(grants.size() == 1);
  CHECK(grants[0] == std::pair<int64_t, uint64_t>{3, 50});
  CHECK(rx.waiting() == 1);
}

TEST_CASE("bulk_receiver: a message ahead of the inbox's next one is granted only while the inbox has room for it",
          "[transport][bulk_receiver][security]") {
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  rx.admit();
  rx.set_inbox(3, 500, true);  // control messages wait in the inbox behind stream 3's message
  const auto m3 = message_stream(400, 3, cfg.limits), m7 = message_stream(400, 7, cfg.limits),
             m11 = message_stream(400, 11, cfg.limits);
  REQUIRE(rx.on_data(7, part(m7, 0, 50), false)->credit == 50);  // could wait there: 500 + 400 fit
  // The budget has room, the inbox not: beside 7's message and the control messages it may
  // have to wait for 3 too (500 + 400 + 400 > 1000).
  REQUIRE(rx.on_data(11, part(m11, 0, 50), false)->credit == 0);
  CHECK(rx.waiting() == 1);
  CHECK(rx.budget_left() == 600);
  // The message the inbox waits for needs only the budget: it never waits there.
  REQUIRE(rx.on_data(3, part(m3, 0, 50), false)->credit == 50);
  auto first = rx.on_data(3, part(m3, 50, m3.size() - 50), true);
  REQUIRE(first);
  REQUIRE(first->message);
  CHECK(rx.take_grants().empty());
  rx.set_inbox(7, 0, true);  // 3 and the control messages behind it handed over
  rx.set_delivered(0);
  auto grants = rx.take_grants();
  REQUIRE(grants.size() == 1);
  CHECK(grants[0] == std::pair<int64_t, uint64_t>{11, 50});
}

TEST_CASE("bulk_receiver: the awaited message whose marker has not come is granted only while the inbox has room, then on budget alone",
          "[transport][bulk_receiver][security]") {
  // Without its marker, stream 3's message would wait in the inbox when it completes (the inbox
  // hands it over only in its place): beside 500 bytes of control messages and stream 7's 400
  // it would pass the inbox's budget of 1000, though the receive budget has room for it.
  const auto cfg = small_config();
  bulk_receiver rx(cfg);
  rx.admit();
  rx.set_inbox(3, 500, false);
  const auto m3 = message_stream(400, 3, cfg.limits), m7 = message_stream(400, 7, cfg.limits);
  REQUIRE(rx.on_data(7, part(m7, 0, 50), false)->credit == 50);  // 500 + 400 fit
  REQUIRE(rx.on_data(3, part(m3, 0, 50), false)->credit == 0);   // 500 + 400 + 400 do not
  CHECK(rx.waiting() == 1);
  CHECK(rx.budget_left() == 600);
  rx.set_inbox(3, 500, true);  // the marker came: stream 3's message is handed over as it completes
  auto grants = rx.take_grants();
  REQUIRE(grants.size() == 1);
  CHECK(grants[0] == std::pair<int64_t, uint64_t>{3, 50});
  CHECK(rx.waiting() == 0);
}
