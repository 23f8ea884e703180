// Several mDNS hosts on one machine: network namespaces on a bridge, each with its own dbus +
// avahi-daemon (private /run), one discovery_node process per node. Needs root and iproute2;
// skips with a reason otherwise. Traffic stays inside the namespaces (10.77.0.0/24).
#include <signal.h>

#include <catch2/catch.hpp>

#include "discovery/lab/avahi_lab.hpp"
#include "discovery/lab/node_process.hpp"
#include "test_util.hpp"

using namespace mesh::discovery;
using namespace std::chrono_literals;

namespace {
constexpr auto within = 20s;  // ~1 s of mDNS probing, with room for a loaded machine

bool finds(test::node_process& n, const announcement& peer, const std::string& address) {
  event e;
  if (!n.log().wait_for(event::peer_found, peer.node_id, within, &e)) return false;
  return e.peer.port == peer.port &&
         std::find(e.peer.addresses.begin(), e.peer.addresses.end(), address) != e.peer.addresses.end();
}
}  // namespace

TEST_CASE("netns: three hosts find each other, other meshes stay foreign, a dead daemon harms no one",
          "[discovery][netns]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  lab::bridge br("br");
  lab::host h1("h1", br.netns(), "10.77.0.1"), h2("h2", br.netns(), "10.77.0.2"),
      h3("h3", br.netns(), "10.77.0.3");
  REQUIRE(h1.start_daemon());
  REQUIRE(h2.start_daemon());
  REQUIRE(h3.start_daemon());
  const announcement a1 = test::make_announcement('1', 5001), a2 = test::make_announcement('2', 5002),
                     a3 = test::make_announcement('3', 5003);
  const announcement other = test::make_announcement('f', 5009, "mesh-other");
  test::node_process n1("avahi", a1, h1.bus_address()), n2("avahi", a2, h2.bus_address()),
      n3("avahi", a3, h3.bus_address()), nf("avahi", other, h3.bus_address());

  CHECK(finds(n1, a2, "10.77.0.2"));
  CHECK(finds(n1, a3, "10.77.0.3"));
  CHECK(finds(n2, a1, "10.77.0.1"));
  CHECK(finds(n2, a3, "10.77.0.3"));
  CHECK(finds(n3, a1, "10.77.0.1"));
  CHECK(finds(n3, a2, "10.77.0.2"));
  CHECK(n1.log().wait_for(event::foreign_peer, other.node_id, within));
  CHECK(n2.log().wait_for(event::foreign_peer, other.node_id, within));
  CHECK(!n1.log().seen(event::peer_found, other.node_id));
  CHECK(!n2.log().seen(event::peer_found, other.node_id));
  CHECK(nf.log().wait_for(event::foreign_peer, a1.node_id, within));
  CHECK(!nf.log().seen(event::peer_found));

  // h3's daemon crashes: its nodes notice; the other hosts keep announcing and discovering.
  h3.stop_avahi(/*hard=*/true);
  CHECK(n3.log().wait_for(event::backend_down, "", 10s));
  const announcement a4 = test::make_announcement('4', 5004);
  test::node_process n4("avahi", a4, h2.bus_address());
  CHECK(finds(n1, a4, "10.77.0.2"));
  CHECK(finds(n4, a1, "10.77.0.1"));
  CHECK(!n1.log().seen(event::backend_down));
  CHECK(!n2.log().seen(event::backend_down));
}

TEST_CASE("netns: a daemon restarted under a running node re-announces and re-discovers",
          "[discovery][netns]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  lab::bridge br("rb");
  lab::host h1("r1", br.netns(), "10.77.0.1"), h2("r2", br.netns(), "10.77.0.2");
  REQUIRE(h1.start_daemon());
  REQUIRE(h2.start_daemon());
  const announcement a1 = test::make_announcement('1', 5001), a2 = test::make_announcement('2', 5002);
  test::node_process n1("avahi", a1, h1.bus_address()), n2("avahi", a2, h2.bus_address());
  REQUIRE(finds(n1, a2, "10.77.0.2"));
  REQUIRE(finds(n2, a1, "10.77.0.1"));
  n1.log().clear();
  n2.log().clear();

  h1.stop_avahi();  // clean stop: the daemon sends goodbyes for n1's records
  CHECK(n1.log().wait_for(event::backend_down, "", 10s));
  CHECK(n2.log().wait_for(event::peer_lost, a1.node_id, within));
  REQUIRE(h1.start_daemon());
  CHECK(n1.log().wait_for(event::backend_up, "", within));
  CHECK(finds(n1, a2, "10.77.0.2"));
  CHECK(finds(n2, a1, "10.77.0.1"));
}

TEST_CASE("netns: two hosts announcing one service name both get found", "[discovery][netns]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  lab::bridge br("cb");
  lab::host h1("c1", br.netns(), "10.77.0.1"), h2("c2", br.netns(), "10.77.0.2");
  REQUIRE(h1.start_daemon());
  REQUIRE(h2.start_daemon());
  const announcement a1 = test::make_announcement('1', 5001), a2 = test::make_announcement('2', 5002);
  test::node_process n1("avahi", a1, h1.bus_address(), "meshnode-same");
  REQUIRE(n1.log().wait_for(event::backend_up, "", within));
  test::node_process n2("avahi", a2, h2.bus_address(), "meshnode-same");
  CHECK(finds(n1, a2, "10.77.0.2"));
  CHECK(finds(n2, a1, "10.77.0.1"));
}

TEST_CASE("netns: IPv4 and IPv6 addresses are resolved, link-local ones with their interface",
          "[discovery][netns]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  lab::bridge br("6b");
  lab::host h1("v1", br.netns(), "10.77.0.1", "fd77::1"), h2("v2", br.netns(), "10.77.0.2", "fd77::2");
  REQUIRE(h1.start_daemon());
  REQUIRE(h2.start_daemon());
  const announcement a1 = test::make_announcement('1', 5001), a2 = test::make_announcement('2', 5002);
  // Nodes run inside their host's namespace, so that interface names are theirs.
  test::node_process n1("avahi", a1, h1.bus_address(), "", h1.netns());
  test::node_process n2("avahi", a2, h2.bus_address(), "", h2.netns());
  event e;
  const bool both = n1.log().wait_for(
      [&](const event& x) {
        if ((x.k != event::peer_found && x.k != event::peer_updated) || x.peer.node_id != a2.node_id) return false;
        const auto& addrs = x.peer.addresses;
        const bool v4 = std::find(addrs.begin(), addrs.end(), "10.77.0.2") != addrs.end();
        const bool v6 = std::any_of(addrs.begin(), addrs.end(), [](const std::string& a) { return a.find(':') != std::string::npos; });
        return v4 && v6;
      },
      within, &e);
  INFO("last addresses seen: " << [&] {
    std::string s;
    for (const auto& x : n1.log().snapshot()) {
      for (const auto& a : x.peer.addresses) s += a + " ";
    }
    return s;
  }());
  REQUIRE(both);
  CHECK(e.peer.addresses.front() == "10.77.0.2");  // IPv4 first: the order to dial in
  for (const auto& a : e.peer.addresses) {
    // Avahi publishes the host's global address when it has one; a link-local one, if any,
    // must carry its interface to be usable.
    if (a.rfind("fe80:", 0) == 0) CHECK(a.find("%eth0") != std::string::npos);
    if (a.find(':') != std::string::npos && a.rfind("fe80:", 0) != 0) CHECK(a == "fd77::2");
  }
  CHECK(n2.log().wait_for(event::peer_found, a1.node_id, within));
}

TEST_CASE("netns: the dns_sd backend finds peers on other hosts and Avahi nodes alike",
          "[discovery][netns][dnssd]") {
  if (auto why = lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  lab::bridge br("db");
  lab::host h1("d1", br.netns(), "10.77.0.1"), h2("d2", br.netns(), "10.77.0.2");
  REQUIRE(h1.start_daemon());
  REQUIRE(h2.start_daemon());
  const announcement a1 = test::make_announcement('1', 5001), a2 = test::make_announcement('2', 5002);
  test::node_process n1("dnssd", a1, h1.bus_address()), n2("avahi", a2, h2.bus_address());
  CHECK(finds(n1, a2, "10.77.0.2"));
  CHECK(finds(n2, a1, "10.77.0.1"));
  n2.stop();
  CHECK(n1.log().wait_for(event::peer_lost, a2.node_id, within));
}
