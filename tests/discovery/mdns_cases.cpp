#include "mdns_cases.hpp"

#include <signal.h>

#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "discovery/lab/avahi_lab.hpp"
#include "discovery/lab/event_log.hpp"
#include "discovery/lab/node_process.hpp"
#include "test_util.hpp"

namespace mesh::discovery::test {
namespace {

using namespace std::chrono_literals;

// mDNS probing takes ~1 s per announcement; these bounds leave room for a loaded CI machine.
constexpr auto found_within = 15s;
constexpr auto lost_within = 15s;

#define SKIP_WITHOUT_LAB()                    \
  if (auto why = lab::reason_unavailable()) { \
    WARN("skipped: " << *why);                \
    return;                                   \
  }

}  // namespace

void two_announcers_find_each_other(const std::string& kind) {
  SKIP_WITHOUT_LAB();
  lab::host h(kind + "1");
  REQUIRE(h.start_daemon());
  const announcement a = make_announcement('a', 4001), b = make_announcement('b', 4002);
  node_process na(kind, a, h.bus_address()), nb(kind, b, h.bus_address());
  REQUIRE(na.running());
  REQUIRE(nb.running());
  event found;
  REQUIRE(na.log().wait_for(event::peer_found, b.node_id, found_within, &found));
  CHECK(found.peer.port == 4002);
  CHECK(found.peer.mesh_id == "mesh-a");
  CHECK(found.peer.addresses == std::vector<std::string>{"127.0.0.1"});
  REQUIRE(nb.log().wait_for(event::peer_found, a.node_id, found_within, &found));
  CHECK(found.peer.port == 4001);
  CHECK(na.log().seen(event::backend_up));
  // While b stays announced, a hears of it again every second (the lab's remind_every), so a
  // node that lost its connection to b dials it again.
  REQUIRE(na.log().wait_for(event::peer_still_announced, b.node_id, 5s, &found));
  CHECK(found.peer.port == 4002);
  nb.stop();
  CHECK(na.log().wait_for(event::peer_lost, b.node_id, lost_within));
}

void other_mesh_is_foreign(const std::string& kind) {
  SKIP_WITHOUT_LAB();
  lab::host h(kind + "2");
  REQUIRE(h.start_daemon());
  const announcement a = make_announcement('a', 4001);
  const announcement c = make_announcement('c', 4003, "mesh-other");
  const announcement d = make_announcement('d', 4004);  // a member: shows browsing went on
  node_process na(kind, a, h.bus_address()), nc(kind, c, h.bus_address()), nd(kind, d, h.bus_address());
  event foreign;
  REQUIRE(na.log().wait_for(event::foreign_peer, c.node_id, found_within, &foreign));
  CHECK(foreign.peer.mesh_id == "mesh-other");
  CHECK(foreign.detail == "another mesh id");
  REQUIRE(na.log().wait_for(event::peer_found, d.node_id, found_within));
  CHECK(!na.log().seen(event::peer_found, c.node_id));
  CHECK(nc.log().wait_for(event::foreign_peer, a.node_id, found_within));
  CHECK(!nc.log().seen(event::peer_found));
}

void name_conflict_is_resolved(const std::string& kind) {
  SKIP_WITHOUT_LAB();
  lab::host h(kind + "3");
  REQUIRE(h.start_daemon());
  const announcement a = make_announcement('a', 4001), b = make_announcement('b', 4002);
  node_process na(kind, a, h.bus_address(), "meshnode-same");
  REQUIRE(na.log().wait_for(event::backend_up, "", found_within));
  node_process nb(kind, b, h.bus_address(), "meshnode-same");
  CHECK(na.log().wait_for(event::peer_found, b.node_id, found_within));
  CHECK(nb.log().wait_for(event::peer_found, a.node_id, found_within));
}

void daemon_absent_then_started(const std::string& kind) {
  SKIP_WITHOUT_LAB();
  lab::host h(kind + "4");
  const announcement a = make_announcement('a', 4001), b = make_announcement('b', 4002);
  node_process na(kind, a, h.bus_address());  // not an error: the daemon may come later
  REQUIRE(na.log().wait_for(event::backend_down, "", 10s));
  REQUIRE(h.start_daemon());
  REQUIRE(na.log().wait_for(event::backend_up, "", found_within));
  node_process nb(kind, b, h.bus_address());
  CHECK(na.log().wait_for(event::peer_found, b.node_id, found_within));
  CHECK(nb.log().wait_for(event::peer_found, a.node_id, found_within));
}

void daemon_restart_reannounces(const std::string& kind) {
  SKIP_WITHOUT_LAB();
  lab::host h(kind + "5");
  REQUIRE(h.start_daemon());
  const announcement a = make_announcement('a', 4001), b = make_announcement('b', 4002);
  node_process na(kind, a, h.bus_address()), nb(kind, b, h.bus_address());
  REQUIRE(na.log().wait_for(event::peer_found, b.node_id, found_within));
  REQUIRE(nb.log().wait_for(event::peer_found, a.node_id, found_within));
  na.log().clear();
  nb.log().clear();
  h.stop_avahi();
  CHECK(na.log().wait_for(event::backend_down, "", 10s));
  CHECK(na.log().wait_for(event::peer_lost, b.node_id, 10s));
  REQUIRE(h.start_daemon());
  CHECK(na.log().wait_for(event::backend_up, "", found_within));
  // Both backends reconnect with back-off (up to 8 s) and then probe again: allow twice the usual.
  CHECK(na.log().wait_for(event::peer_found, b.node_id, 2 * found_within));
  CHECK(nb.log().wait_for(event::peer_found, a.node_id, 2 * found_within));
}

void hostile_txt_is_rejected(const std::string& kind) {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  if (lab::sh("command -v avahi-publish >/dev/null 2>&1") != 0) {
    WARN("skipped: avahi-publish (avahi-utils) is not installed");
    return;
  }
  lab::host h(kind + "6");
  REQUIRE(h.start_daemon());
  node_process node(kind, make_announcement('a'), h.bus_address());
  // A bad id, a missing mesh and an oversized value, published by avahi's own tool (it runs
  // until stopped; `timeout` bounds it anyway).
  const std::string env = "DBUS_SYSTEM_BUS_ADDRESS=" + h.bus_address() + " timeout 30 avahi-publish -s ";
  const int publishers[] = {
      lab::spawn(env + "bad-id _meshnode._udp 4100 id=XYZ mesh=mesh-a v=1 port=4100"),
      lab::spawn(env + "no-mesh _meshnode._udp 4101 id=" + node_id('e') + " v=1 port=4101"),
      lab::spawn(env + "huge _meshnode._udp 4102 id=" + node_id('f') + " mesh=" +
                 std::string(200, 'm') + " v=1 port=4102"),
  };
  // A good node after them shows the first one still works.
  node_process good(kind, make_announcement('b'), h.bus_address());
  auto rejected_with = [&](const char* text) {
    return node.log().wait_for(
        [&](const event& e) { return e.k == event::peer_rejected && e.detail.find(text) != std::string::npos; },
        15s);
  };
  CHECK(rejected_with("node id"));
  CHECK(rejected_with("lacks key 'mesh'"));
  CHECK(rejected_with("mesh id"));
  CHECK(node.log().wait_for(event::peer_found, node_id('b'), 15s));
  CHECK(!node.log().seen(event::peer_found, node_id('e')));
  CHECK(!node.log().seen(event::peer_found, node_id('f')));
  for (int pid : publishers) {
    if (pid > 0) ::kill(pid, SIGTERM);
  }
}

void unresolved_is_retried(const std::string& kind) {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  if (lab::sh("command -v avahi-publish >/dev/null 2>&1") != 0) {
    WARN("skipped: avahi-publish (avahi-utils) is not installed");
    return;
  }
  lab::host h(kind + "7");
  REQUIRE(h.start_daemon());
  node_process node(kind, make_announcement('a'), h.bus_address());
  REQUIRE(node.log().wait_for(event::backend_up, "", 15s));
  // A service on a host name that has no address yet: Avahi's resolver gives up after 5 s.
  const std::string env = "DBUS_SYSTEM_BUS_ADDRESS=" + h.bus_address() + " timeout 40 avahi-publish ";
  const std::string late = node_id('7');
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

void daemon_stops_during_lookup(const std::string& kind) {
  SKIP_WITHOUT_LAB();
  if (lab::sh("command -v avahi-publish >/dev/null 2>&1 && command -v avahi-browse >/dev/null 2>&1") != 0) {
    WARN("skipped: avahi-publish/avahi-browse (avahi-utils) are not installed");
    return;
  }
  lab::host h(kind + "8");
  REQUIRE(h.start_daemon());
  node_process node(kind, make_announcement('a'), h.bus_address());
  REQUIRE(node.log().wait_for(event::backend_up, "", found_within));
  // Services on host names without address: the node's resolutions of them stay open (Avahi's
  // resolver waits 5 s for an address). Several, because which of the node's daemon
  // connections learns first that the daemon is gone varies from run to run.
  const std::string bus = "DBUS_SYSTEM_BUS_ADDRESS=" + h.bus_address();
  std::vector<int> services;
  for (char c : {'4', '5', '6'}) {
    services.push_back(lab::spawn(bus + " timeout 40 avahi-publish -s -H nowhere" + c + ".local meshnode-nowhere" +
                                  c + " _meshnode._udp 4300 id=" + node_id(c) + " mesh=mesh-a v=1 port=4300"));
  }
  // Once avahi-browse lists them (after ~1 s of probing), the node has seen them too.
  bool listed = false;
  for (int i = 0; i < 75 && !listed; ++i) {
    listed = lab::sh(bus + " avahi-browse -pt _meshnode._udp 2>/dev/null | grep -c meshnode-nowhere | grep -qx 3") == 0;
    if (!listed) std::this_thread::sleep_for(200ms);
  }
  REQUIRE(listed);
  std::this_thread::sleep_for(300ms);  // resolutions under way, far from their 5 s timeout
  // SIGKILL: no withdrawals first (they would end the resolutions); every connection of the
  // node just learns that the daemon is gone.
  h.stop_avahi(true);
  CHECK(node.log().wait_for(event::backend_down, "", 10s));
  // A node that crashed when its open lookups failed (avahi-compat 0.8, see docs/discovery.md)
  // would never come back.
  REQUIRE(h.start_daemon());
  CHECK(node.log().wait_for(event::backend_up, "", found_within));
  for (int pid : services) {
    if (pid > 0) ::kill(pid, SIGTERM);
  }
}

}  // namespace mesh::discovery::test
