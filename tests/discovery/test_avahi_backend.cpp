// The Avahi backend against private avahi-daemons on loopback (see mdns_cases.hpp). Needs root;
// skips with a reason otherwise.
#include <signal.h>

#include <catch2/catch.hpp>

#include "discovery/lab/avahi_lab.hpp"
#include "mdns_cases.hpp"
#include "discovery/lab/node_process.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;
using namespace std::chrono_literals;

TEST_CASE("avahi: two announcers find each other, a clean exit is seen as lost", "[discovery][avahi]") {
  test::two_announcers_find_each_other("avahi");
}
TEST_CASE("avahi: another mesh id is foreign, not a member", "[discovery][avahi]") {
  test::other_mesh_is_foreign("avahi");
}
TEST_CASE("avahi: a service name conflict is resolved", "[discovery][avahi]") {
  test::name_conflict_is_resolved("avahi");
}
TEST_CASE("avahi: daemon absent at start, started later", "[discovery][avahi]") {
  test::daemon_absent_then_started("avahi");
}
TEST_CASE("avahi: daemon restarted under running nodes", "[discovery][avahi]") {
  test::daemon_restart_reannounces("avahi");
}

TEST_CASE("avahi: hostile TXT records are rejected, not fatal", "[discovery][avahi]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  if (lab::sh("command -v avahi-publish >/dev/null 2>&1") != 0) {
    WARN("skipped: avahi-publish (avahi-utils) is not installed");
    return;
  }
  lab::host h("avahi6");
  REQUIRE(h.start_daemon());
  test::node_process node("avahi", test::make_announcement('a'), h.bus_address());
  // A bad id, a missing mesh and an oversized value, published by avahi's own tool (it runs
  // until stopped; `timeout` bounds it anyway).
  const std::string env = "DBUS_SYSTEM_BUS_ADDRESS=" + h.bus_address() + " timeout 30 avahi-publish -s ";
  const int publishers[] = {
      lab::spawn(env + "bad-id _meshnode._udp 4100 id=XYZ mesh=mesh-a v=1 port=4100"),
      lab::spawn(env + "no-mesh _meshnode._udp 4101 id=" + test::node_id('e') + " v=1 port=4101"),
      lab::spawn(env + "huge _meshnode._udp 4102 id=" + test::node_id('f') + " mesh=" +
                 std::string(200, 'm') + " v=1 port=4102"),
  };
  // A good node after them shows the first one still works.
  test::node_process good("avahi", test::make_announcement('b'), h.bus_address());
  auto rejected_with = [&](const char* text) {
    return node.log().wait_for(
        [&](const event& e) { return e.k == event::peer_rejected && e.detail.find(text) != std::string::npos; },
        15s);
  };
  CHECK(rejected_with("node id"));
  CHECK(rejected_with("lacks key 'mesh'"));
  CHECK(rejected_with("mesh id"));
  CHECK(node.log().wait_for(event::peer_found, test::node_id('b'), 15s));
  CHECK(!node.log().seen(event::peer_found, test::node_id('e')));
  CHECK(!node.log().seen(event::peer_found, test::node_id('f')));
  for (int pid : publishers) {
    if (pid > 0) ::kill(pid, SIGTERM);
  }
}

TEST_CASE("avahi: an instance that fails to resolve is retried until it resolves", "[discovery][avahi]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  if (lab::sh("command -v avahi-publish >/dev/null 2>&1") != 0) {
    WARN("skipped: avahi-publish (avahi-utils) is not installed");
    return;
  }
  lab::host h("avahi7");
  REQUIRE(h.start_daemon());
  test::node_process node("avahi", test::make_announcement('a'), h.bus_address());
  REQUIRE(node.log().wait_for(event::backend_up, "", 15s));
  // A service on a host name that has no address yet: Avahi's resolver gives up after 5 s.
  const std::string env = "DBUS_SYSTEM_BUS_ADDRESS=" + h.bus_address() + " timeout 40 avahi-publish ";
  const std::string late = test::node_id('7');
  const int service = lab::spawn(env + "-s -H late.local meshnode-late _meshnode._udp 4300 id=" + late +
                                 " mesh=mesh-a v=1 port=4300");
  CHECK(!node.log().wait_for(event::peer_found, late, 6s));
  // Now the address appears: the retried resolution finds the node.
  const int address = lab::spawn(env + "-a -R late.local 127.0.0.9");
  event e;
  CHECK(node.log().wait_for(event::peer_found, late, 15s, &e));
  CHECK(e.peer.addresses == std::vector<std::string>{"127.0.0.9"});
  for (int pid : {service, address}) {
    if (pid > 0) ::kill(pid, SIGTERM);
  }
}
