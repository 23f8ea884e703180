#include <catch2/catch.hpp>

#include "discovery/peer_exchange.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;

namespace {
peer_info member(char id, std::vector<std::string> addrs, uint16_t port = 4000) {
  return {test::node_id(id), "mesh-a", 1, std::move(addrs), port, "cpu", "avahi"};
}
}  // namespace

TEST_CASE("pex: round trip keeps usable addresses and drops unusable ones", "[discovery][pex]") {
  std::vector<peer_info> in{member('b', {"10.0.0.2", "fe80::1%eth0", "2001:db8::5", "224.0.0.251"}, 7001),
                            member('c', {"fe80::2%eth0"}),  // nothing usable elsewhere: left out
                            member('d', {"192.0.2.1"})};
  in.push_back(member('e', {"10.0.0.9"}));
  in.back().node_id = "not-an-id";
  auto bytes = encode_pex(in);
  auto out = decode_pex(bytes);
  REQUIRE(out);
  REQUIRE(out->size() == 2);
  CHECK((*out)[0].node_id == test::node_id('b'));
  CHECK((*out)[0].addresses == std::vector<std::string>{"10.0.0.2", "2001:db8::5"});
  CHECK((*out)[0].port == 7001);
  CHECK((*out)[0].device_summary == "cpu");
  CHECK((*out)[0].source == "exchange");
  CHECK((*out)[1].node_id == test::node_id('d'));
}

TEST_CASE("pex: malformed messages are rejected with a reason", "[discovery][pex]") {
  auto good = encode_pex({member('b', {"10.0.0.2"})});
  REQUIRE(decode_pex(good));
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    CHECK(!decode_pex(std::span<const uint8_t>(good.data(), cut)));
  }
  auto trailing = good;
  trailing.push_back(0);
  CHECK(decode_pex(trailing).error().message.find("trailing") != std::string::npos);
  auto magic = good;
  magic[0] = 'X';
  CHECK(decode_pex(magic).error().message.find("magic") != std::string::npos);
  auto format = good;
  format[3] = 9;
  CHECK(decode_pex(format).error().code == mesh::error_code::version_mismatch);
  auto family = good;
  family[6 + 32 + 2 + 1] = 5;  // header, id, port, count, then the family byte
  CHECK(decode_pex(family).error().message.find("family") != std::string::npos);
  auto multicast = good;
  multicast[6 + 32 + 2 + 2] = 239;
  CHECK(decode_pex(multicast).error().message.find("unusable") != std::string::npos);
  auto port0 = good;
  port0[6 + 32] = 0;
  port0[6 + 32 + 1] = 0;
  CHECK(!decode_pex(port0));
  auto dup = encode_pex({member('b', {"10.0.0.2"}), member('b', {"10.0.0.3"})});
  CHECK(decode_pex(dup).error().message.find("duplicate") != std::string::npos);
  std::vector<uint8_t> too_many{'M', 'P', 'X', 1, 0x01, 0x01};
  CHECK(decode_pex(too_many).error().code == mesh::error_code::limit_exceeded);
}

TEST_CASE("pex: merge adds the sender's peers as members, never ourselves or the sender",
          "[discovery][pex]") {
  peer_table t(test::make_announcement('a'));
  auto msg = decode_pex(encode_pex({member('a', {"10.0.0.1"}), member('b', {"10.0.0.2"}),
                                    member('c', {"10.0.0.3"})}));
  REQUIRE(msg);
  auto events = merge_pex(t, test::node_id('b'), *msg);
  REQUIRE(events.size() == 1);
  CHECK(events[0].k == event::peer_found);
  CHECK(events[0].peer.node_id == test::node_id('c'));
  CHECK(events[0].peer.mesh_id == "mesh-a");
  CHECK(events[0].peer.source == "exchange");
  CHECK(t.members().size() == 1);
  // The same news again changes nothing.
  CHECK(merge_pex(t, test::node_id('b'), *msg).empty());
}

TEST_CASE("pex: at most 256 entries are encoded", "[discovery][pex]") {
  std::vector<peer_info> many;
  for (int i = 0; i < 300; ++i) {
    char hex[65];
    std::snprintf(hex, sizeof hex, "%064x", i + 1);
    many.push_back({hex, "m", 1, {"10.0.0.1"}, 4000, "", "avahi"});
  }
  auto out = decode_pex(encode_pex(many));
  REQUIRE(out);
  CHECK(out->size() == max_pex_entries);
}

TEST_CASE("pex: a mesh across networks without multicast converges from one static peer",
          "[discovery][pex]") {
  // Network 1: A alone, configured with B as a static peer. Network 2: B, C and D see each other
  // by mDNS. Once A and B are connected, each sends the other what it knows.
  peer_table a(test::make_announcement('a')), b(test::make_announcement('b'));
  auto mdns = [](char id, const char* addr) {
    return event{event::peer_found, member(id, {addr}), ""};
  };
  b.apply(mdns('c', "10.2.0.3"));
  b.apply(mdns('d', "10.2.0.4"));
  peer_info b_static = member('b', {"192.0.2.2"});
  b_static.source = "static";
  a.apply({event::peer_found, b_static, ""});
  // B -> A, A -> B, over the (simulated) connection: bytes only.
  const auto to_a = encode_pex(b.members());
  const auto to_b = encode_pex(a.members());
  auto got_a = decode_pex(to_a);
  auto got_b = decode_pex(to_b);
  REQUIRE(got_a);
  REQUIRE(got_b);
  merge_pex(a, test::node_id('b'), *got_a);
  merge_pex(b, test::node_id('a'), *got_b);
  CHECK(a.members().size() == 3);  // B (static), C and D (exchange)
  REQUIRE(a.find(test::node_id('c')));
  CHECK(a.find(test::node_id('c'))->addresses == std::vector<std::string>{"10.2.0.3"});
  CHECK(a.find(test::node_id('c'))->source == "exchange");
  CHECK(b.members().size() == 2);  // A told B only about B itself: skipped
}
