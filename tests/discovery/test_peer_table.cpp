#include <catch2/catch.hpp>

#include "discovery/peer_table.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;

namespace {
event found(char id, std::string source, std::vector<std::string> addrs, std::string mesh = "mesh-a") {
  peer_info p{test::node_id(id), std::move(mesh), 1, std::move(addrs), 4000, "gpu", std::move(source)};
  return {event::peer_found, p, ""};
}
event lost(char id, std::string source) {
  event e{event::peer_lost, {}, "gone"};
  e.peer.node_id = test::node_id(id);
  e.peer.source = std::move(source);
  return e;
}
}  // namespace

TEST_CASE("peer_table: a member lives while any source knows it", "[discovery][table]") {
  peer_table t(test::make_announcement('a'));
  auto e1 = t.apply(found('b', "exchange", {"192.0.2.7"}));
  REQUIRE(e1.size() == 1);
  CHECK(e1[0].k == event::peer_found);
  auto e2 = t.apply(found('b', "avahi", {"10.1.0.2"}));
  REQUIRE(e2.size() == 1);
  CHECK(e2[0].k == event::peer_updated);
  // mDNS addresses first: they are first-hand.
  CHECK(e2[0].peer.addresses == std::vector<std::string>{"10.1.0.2", "192.0.2.7"});
  CHECK(e2[0].peer.source == "avahi,exchange");
  REQUIRE(t.find(test::node_id('b')));
  CHECK(t.apply(lost('b', "avahi")).size() == 1);  // updated: only the exchanged address left
  CHECK(t.members().size() == 1);
  auto e3 = t.apply(lost('b', "exchange"));
  REQUIRE(e3.size() == 1);
  CHECK(e3[0].k == event::peer_lost);
  CHECK(t.members().empty());
  CHECK(t.apply(lost('b', "exchange")).empty());
}

TEST_CASE("peer_table: foreign, self and pass-through events", "[discovery][table]") {
  peer_table t(test::make_announcement('a'));
  CHECK(t.apply(found('a', "avahi", {"127.0.0.1"})).empty());
  auto f = t.apply(found('c', "static", {"127.0.0.1"}, "mesh-other"));
  REQUIRE(f.size() == 1);
  CHECK(f[0].k == event::foreign_peer);
  CHECK(t.members().empty());
  event bad = found('b', "static", {"127.0.0.1"});
  bad.peer.node_id = "short";
  auto r = t.apply(bad);
  REQUIRE(r.size() == 1);
  CHECK(r[0].k == event::peer_rejected);
  event down{event::backend_down, {}, "daemon gone"};
  auto d = t.apply(down);
  REQUIRE(d.size() == 1);
  CHECK(d[0].k == event::backend_down);
}

TEST_CASE("peer_table: forget drops every source", "[discovery][table]") {
  peer_table t(test::make_announcement('a'));
  t.apply(found('b', "avahi", {"10.0.0.2"}));
  t.apply(found('b', "static", {"10.0.0.2"}));
  auto e = t.forget(test::node_id('b'), "dead");
  REQUIRE(e.size() == 1);
  CHECK(e[0].k == event::peer_lost);
  CHECK(e[0].detail == "dead");
  CHECK(t.forget(test::node_id('b'), "dead").empty());
}
