#include <catch2/catch.hpp>

#include "discovery/static_peer.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;

TEST_CASE("static peers: the accepted forms", "[discovery][static]") {
  auto a = parse_static_peer("node7.lan:4433");
  REQUIRE(a);
  CHECK(a->host == "node7.lan");
  CHECK(a->port == 4433);
  CHECK(a->node_id.empty());
  auto b = parse_static_peer("[2001:db8::1]:9");
  REQUIRE(b);
  CHECK(b->host == "2001:db8::1");
  auto c = parse_static_peer(test::node_id('e') + "@10.0.0.2:5000");
  REQUIRE(c);
  CHECK(c->node_id == test::node_id('e'));
  CHECK(c->host == "10.0.0.2");
}

TEST_CASE("static peers: bad values are refused with a reason", "[discovery][static]") {
  for (const char* bad : {"", "host", "host:", "host:0", "host:65536", "host:12ab", "2001:db8::1:80",
                          "[2001:db8::1]80", "ho st:80", ":80", "abc@host:80"}) {
    INFO(bad);
    auto r = parse_static_peer(bad);
    REQUIRE(!r);
    CHECK(r.error().message.find("peer '") == 0);
  }
}
