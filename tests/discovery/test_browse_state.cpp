#include <catch2/catch.hpp>

#include "discovery/browse_state.hpp"
#include "discovery/txt_record.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;

namespace {
std::vector<std::string> txt_of(const announcement& a) { return *encode_txt(a); }
}  // namespace

TEST_CASE("browse_state: instances of one node fold into one peer", "[discovery][browse]") {
  browse_state s(test::make_announcement('a'), "avahi");
  const announcement b = test::make_announcement('b', 5000);
  auto e1 = s.resolved("b|lo|v4", txt_of(b), {"127.0.0.1"}, 5000);
  REQUIRE(e1.size() == 1);
  CHECK(e1[0].k == event::peer_found);
  CHECK(e1[0].peer.node_id == b.node_id);
  CHECK(e1[0].peer.source == "avahi");
  CHECK(e1[0].peer.addresses == std::vector<std::string>{"127.0.0.1"});
  // Same record again (the resolver re-fires): nothing new.
  CHECK(s.resolved("b|lo|v4", txt_of(b), {"127.0.0.1"}, 5000).empty());
  // The IPv6 instance adds an address; link-local sorts last.
  auto e2 = s.resolved("b|eth0|v6", txt_of(b), {"fe80::1%eth0"}, 5000);
  REQUIRE(e2.size() == 1);
  CHECK(e2[0].k == event::peer_updated);
  auto e3 = s.resolved("b|eth0|v4", txt_of(b), {"10.0.0.2"}, 5000);
  REQUIRE(e3.size() == 1);
  REQUIRE(e3[0].peer.addresses.size() == 3);
  CHECK(e3[0].peer.addresses.back() == "fe80::1%eth0");
  CHECK(e3[0].peer.addresses[0].find('.') != std::string::npos);
  CHECK(e3[0].peer.addresses[1].find('.') != std::string::npos);
  CHECK(s.removed("b|lo|v4").size() == 1);  // updated
  CHECK(s.removed("b|eth0|v6").size() == 1);
  auto last = s.removed("b|eth0|v4");
  REQUIRE(last.size() == 1);
  CHECK(last[0].k == event::peer_lost);
  CHECK(s.members().empty());
  CHECK(s.removed("never-seen").empty());
}

TEST_CASE("browse_state: ourselves are ignored, other meshes and versions are foreign",
          "[discovery][browse]") {
  const announcement self = test::make_announcement('a');
  browse_state s(self, "avahi");
  CHECK(s.resolved("self", txt_of(self), {"127.0.0.1"}, self.port).empty());
  const announcement other = test::make_announcement('c', 4000, "mesh-b");
  auto e = s.resolved("c", txt_of(other), {"127.0.0.1"}, 4000);
  REQUIRE(e.size() == 1);
  CHECK(e[0].k == event::foreign_peer);
  CHECK(e[0].detail == "another mesh id");
  CHECK(s.resolved("c", txt_of(other), {"127.0.0.1"}, 4000).empty());  // reported once
  announcement newer = test::make_announcement('d');
  newer.protocol_version = 2;
  auto v = s.resolved("d", txt_of(newer), {"127.0.0.1"}, 4000);
  REQUIRE(v.size() == 1);
  CHECK(v[0].detail == "another protocol version");
  CHECK(s.members().empty());
  CHECK(s.removed("c").empty());  // a foreign peer leaving is no member lost
}

TEST_CASE("browse_state: a bad record is rejected and withdraws what the instance said",
          "[discovery][browse]") {
  browse_state s(test::make_announcement('a'), "avahi");
  const announcement b = test::make_announcement('b');
  REQUIRE(s.resolved("b", txt_of(b), {"127.0.0.1"}, 4000).size() == 1);
  auto e = s.resolved("b", {"id=garbage", "mesh=x", "v=1", "port=4000"}, {"127.0.0.1"}, 4000);
  REQUIRE(e.size() == 2);
  CHECK(e[0].k == event::peer_lost);
  CHECK(e[1].k == event::peer_rejected);
  CHECK(e[1].detail.find("node id") != std::string::npos);
  auto mismatch = s.resolved("b", txt_of(b), {"127.0.0.1"}, 4001);
  REQUIRE(mismatch.size() == 1);
  CHECK(mismatch[0].k == event::peer_rejected);
  CHECK(mismatch[0].detail.find("SRV port") != std::string::npos);
}

TEST_CASE("browse_state: clear reports every member lost", "[discovery][browse]") {
  browse_state s(test::make_announcement('a'), "avahi");
  s.resolved("b", txt_of(test::make_announcement('b')), {"127.0.0.1"}, 4000);
  s.resolved("c", txt_of(test::make_announcement('c')), {"127.0.0.1"}, 4000);
  auto e = s.clear("daemon gone");
  REQUIRE(e.size() == 2);
  CHECK(e[0].k == event::peer_lost);
  CHECK(e[1].detail == "daemon gone");
  CHECK(s.members().empty());
  // After a restart the same records are news again.
  CHECK(s.resolved("b", txt_of(test::make_announcement('b')), {"127.0.0.1"}, 4000).size() == 1);
}

TEST_CASE("browse_state: a member that re-announces another mesh is lost, then foreign",
          "[discovery][browse]") {
  const announcement self = test::make_announcement('a');
  browse_state s(self, "avahi");
  const announcement b = test::make_announcement('b');
  REQUIRE(s.resolved("b|lo|v4", txt_of(b), {"127.0.0.1"}, 4000).size() == 1);
  REQUIRE(s.members().size() == 1);
  // Same instance, same node id, now another mesh (or protocol version): no longer a member.
  const announcement moved = test::make_announcement('b', 4000, "mesh-b");
  auto e = s.resolved("b|lo|v4", txt_of(moved), {"127.0.0.1"}, 4000);
  REQUIRE(e.size() == 2);
  CHECK(e[0].k == event::peer_lost);
  CHECK(e[0].peer.node_id == b.node_id);
  CHECK(e[0].peer.mesh_id == "mesh-a");  // the member as it was reported
  CHECK(e[1].k == event::foreign_peer);
  CHECK(e[1].detail == "another mesh id");
  CHECK(s.members().empty());
  // Back in our mesh: found again; and leaving it a second time is reported again.
  auto back = s.resolved("b|lo|v4", txt_of(b), {"127.0.0.1"}, 4000);
  REQUIRE(back.size() == 1);
  CHECK(back[0].k == event::peer_found);
  auto again = s.resolved("b|lo|v4", txt_of(moved), {"127.0.0.1"}, 4000);
  REQUIRE(again.size() == 2);
  CHECK(again[0].k == event::peer_lost);
  CHECK(again[1].k == event::foreign_peer);
  // The instance going away now loses no member: there is none.
  CHECK(s.removed("b|lo|v4").empty());
}

TEST_CASE("browse_state: one instance of a node moving to another mesh leaves it a member through the others",
          "[discovery][browse]") {
  browse_state s(test::make_announcement('a'), "avahi");
  const announcement b = test::make_announcement('b');
  REQUIRE(s.resolved("b|lo|v4", txt_of(b), {"127.0.0.1"}, 4000).size() == 1);
  REQUIRE(s.resolved("b|eth0|v4", txt_of(b), {"10.0.0.2"}, 4000).size() == 1);  // updated
  auto e = s.resolved("b|eth0|v4", txt_of(test::make_announcement('b', 4000, "mesh-b")), {"10.0.0.2"}, 4000);
  REQUIRE(e.size() == 2);
  CHECK(e[0].k == event::peer_updated);  // its addresses shrink to what still says our mesh
  CHECK(e[0].peer.addresses == std::vector<std::string>{"127.0.0.1"});
  CHECK(e[1].k == event::foreign_peer);
  REQUIRE(s.members().size() == 1);
}
