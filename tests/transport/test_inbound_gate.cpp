// The pure half of admission before state: the inbound gate's decisions and the Retry token
// round trip, without sockets.
#include <catch2/catch.hpp>
#include <ngtcp2/ngtcp2_crypto.h>
#include <sodium.h>

#include <array>

#include "transport/inbound_gate.hpp"
#include "transport/retry.hpp"

using namespace mesh::transport;

namespace {
constexpr uint64_t ms = 1'000'000;
source_key src(const char* text) { return source_key::of(*parse_address(text)); }
}  // namespace

TEST_CASE("an unvalidated Initial gets a Retry, never state", "[transport][gate]") {
  inbound_gate g({});
  auto v = g.on_initial(src("10.0.0.1:1"), false, 0);
  CHECK(v.what == inbound_gate::decision::retry);
  CHECK(g.half_open() == 0);
  CHECK(g.on_initial(src("10.0.0.1:1"), true, 0).what == inbound_gate::decision::accept);
}

TEST_CASE("Retry only above a half-open threshold when configured so", "[transport][gate]") {
  inbound_limits l;
  l.retry_above_half_open = 2;
  inbound_gate g(l);
  CHECK(g.on_initial(src("10.0.0.1:1"), false, 0).what == inbound_gate::decision::accept);
  g.opened(src("10.0.0.1:1"), 1, 0);
  CHECK(g.on_initial(src("10.0.0.2:1"), false, 0).what == inbound_gate::decision::accept);
  g.opened(src("10.0.0.2:1"), 2, 0);
  CHECK(g.on_initial(src("10.0.0.3:1"), false, 0).what == inbound_gate::decision::retry);
}

TEST_CASE("one source holds at most max_half_open_per_source", "[transport][gate]") {
  inbound_limits l;
  l.max_half_open_per_source = 3;
  inbound_gate g(l);
  for (uint64_t h = 1; h <= 3; ++h) {
    REQUIRE(g.on_initial(src("10.0.0.1:5"), true, 0).what == inbound_gate::decision::accept);
    g.opened(src("10.0.0.1:6"), h, 0);  // other port, same source
  }
  CHECK(g.on_initial(src("10.0.0.1:7"), true, 0).what == inbound_gate::decision::refuse);
  CHECK(g.refusals().source_full == 1);
  CHECK(g.on_initial(src("10.0.0.2:7"), true, 0).what == inbound_gate::decision::accept);
  g.settled(2);
  g.settled(2);  // idempotent
  CHECK(g.half_open_from(src("10.0.0.1:1")) == 2);
  CHECK(g.on_initial(src("10.0.0.1:7"), true, 0).what == inbound_gate::decision::accept);
}

TEST_CASE("IPv6 sources are charged per /64, IPv4-mapped ones as IPv4", "[transport][gate]") {
  CHECK(src("[2001:db8:1:2::1]:1") == src("[2001:db8:1:2:ffff::9]:2"));
  CHECK(!(src("[2001:db8:1:2::1]:1") == src("[2001:db8:1:3::1]:1")));
  CHECK(src("[::ffff:10.0.0.1]:1") == src("10.0.0.1:2"));
  CHECK(!(src("10.0.0.1:1") == src("10.0.0.2:1")));
}

TEST_CASE("when the table is full the largest holder gives up its oldest attempt", "[transport][gate]") {
  inbound_limits l;
  l.max_half_open = 4;
  l.max_half_open_per_source = 3;
  inbound_gate g(l);
  // 10.0.0.1 holds three (opened at 1, 2, 3 ms), 10.0.0.2 one.
  for (uint64_t h = 1; h <= 3; ++h) {
    REQUIRE(g.on_initial(src("10.0.0.1:1"), true, h * ms).what == inbound_gate::decision::accept);
    g.opened(src("10.0.0.1:1"), h, h * ms);
  }
  REQUIRE(g.on_initial(src("10.0.0.2:1"), true, 4 * ms).what == inbound_gate::decision::accept);
  g.opened(src("10.0.0.2:1"), 4, 4 * ms);
  // A newcomer evicts 10.0.0.1's oldest.
  auto v = g.on_initial(src("10.0.0.3:1"), true, 5 * ms);
  REQUIRE(v.what == inbound_gate::decision::accept);
  REQUIRE(v.evict);
  CHECK(*v.evict == 1);
  CHECK(g.evicted() == 1);
  g.opened(src("10.0.0.3:1"), 5, 5 * ms);
  CHECK(g.half_open() == 4);
  // 10.0.0.1 (now two) and 10.0.0.2 (one) each ask again: the largest holder is refused.
  CHECK(g.on_initial(src("10.0.0.1:1"), true, 6 * ms).what == inbound_gate::decision::refuse);
  CHECK(g.refusals().global_full == 1);
  auto w = g.on_initial(src("10.0.0.2:1"), true, 6 * ms);
  CHECK(w.what == inbound_gate::decision::accept);
  CHECK(w.evict == std::optional<uint64_t>{2});
}

TEST_CASE("new connections per source are rate limited by a token bucket", "[transport][gate]") {
  inbound_limits l;
  l.source_rate_per_s = 10;
  l.source_burst = 5;
  inbound_gate g(l);
  int accepted = 0;
  for (int i = 0; i < 20; ++i)
    if (g.on_initial(src("10.0.0.1:1"), true, 0).what == inbound_gate::decision::accept) ++accepted;
  CHECK(accepted == 5);
  CHECK(g.refusals().source_rate == 15);
  // 300 ms refill three.
  accepted = 0;
  for (int i = 0; i < 20; ++i)
    if (g.on_initial(src("10.0.0.1:1"), true, 300 * ms).what == inbound_gate::decision::accept) ++accepted;
  CHECK(accepted == 3);
  // Another source has its own bucket.
  CHECK(g.on_initial(src("10.0.0.2:1"), true, 300 * ms).what == inbound_gate::decision::accept);
}

TEST_CASE("rate buckets stay bounded whatever the number of sources", "[transport][gate]") {
  inbound_gate g({});
  for (uint32_t i = 0; i < 3 * inbound_gate::max_tracked_sources; ++i) {
    const std::string a = "10." + std::to_string((i >> 16) & 255) + "." + std::to_string((i >> 8) & 255) + "." +
                          std::to_string(i & 255) + ":1";
    g.on_initial(src(a.c_str()), true, i);  // all within one refill time
  }
  CHECK(g.tracked_sources() <= inbound_gate::max_tracked_sources);
}

TEST_CASE("the log limiter lets a line a second through and counts the rest", "[transport][gate]") {
  log_limiter lim(1000 * ms);
  uint64_t suppressed = 99;
  CHECK(lim.allow(0, suppressed));
  CHECK(suppressed == 0);
  for (int i = 0; i < 10; ++i) CHECK(!lim.allow(10 * ms, suppressed));
  CHECK(lim.allow(1000 * ms, suppressed));
  CHECK(suppressed == 10);
}

TEST_CASE("a Retry token verifies for its address only, and not after its lifetime", "[transport][gate][retry]") {
  retry_secret secret{};
  randombytes_buf(secret.data(), secret.size());
  auto from = *parse_address("10.0.0.1:4433");
  auto other = *parse_address("10.0.0.2:4433");
  ngtcp2_pkt_hd hd{};
  hd.version = NGTCP2_PROTO_VER_V1;
  hd.dcid.datalen = 8;
  randombytes_buf(hd.dcid.data, 8);
  hd.scid.datalen = 8;
  randombytes_buf(hd.scid.data, 8);
  std::array<uint8_t, 256> buf{};
  const size_t n = write_retry(buf, hd, from, secret, 1000 * ms);
  REQUIRE(n > 0);
  ngtcp2_pkt_hd retry{};
  REQUIRE(ngtcp2_pkt_decode_hd_long(&retry, buf.data(), n) > 0);
  REQUIRE(retry.type == NGTCP2_PKT_RETRY);
  // The token follows the header: Retry = header | token | 16-byte integrity tag.
  const size_t hdlen = 1 + 4 + 1 + retry.dcid.datalen + 1 + retry.scid.datalen;
  std::span<const uint8_t> token(buf.data() + hdlen, n - hdlen - 16);
  ngtcp2_cid odcid{};
  CHECK(ngtcp2_crypto_verify_retry_token(&odcid, token.data(), token.size(), secret.data(), secret.size(),
                                         NGTCP2_PROTO_VER_V1, from.get(), from.len, &retry.scid, 3000 * ms,
                                         2000 * ms) == 0);
  CHECK(ngtcp2_cid_eq(&odcid, &hd.dcid));
  CHECK(ngtcp2_crypto_verify_retry_token(&odcid, token.data(), token.size(), secret.data(), secret.size(),
                                         NGTCP2_PROTO_VER_V1, other.get(), other.len, &retry.scid, 3000 * ms,
                                         2000 * ms) != 0);
  CHECK(ngtcp2_crypto_verify_retry_token(&odcid, token.data(), token.size(), secret.data(), secret.size(),
                                         NGTCP2_PROTO_VER_V1, from.get(), from.len, &retry.scid, 3000 * ms,
                                         5000 * ms) != 0);
  // Not Initials: stateless drop.
  CHECK(check_initial(std::span<const uint8_t>(buf.data(), n), from, secret, 3000 * ms, 0).what ==
        initial_check::kind::not_initial);
  const uint8_t junk[] = {1, 2, 3};
  CHECK(check_initial(junk, from, secret, 3000 * ms, 0).what == initial_check::kind::not_initial);
}
