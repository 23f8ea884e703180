// A client finds a meshnode by mDNS (find_node, client::connect("")). The node and this test use
// a private avahi-daemon in a network namespace (discovery's lab), reached through
// DBUS_SYSTEM_BUS_ADDRESS, so other nodes on the machine's LAN cannot answer. Needs root; skips
// with the reason otherwise. Each TEST_CASE runs in its own process (libdbus reads the bus address
// once per process).
#include <sys/stat.h>

#include <random>

#include "discovery/lab/avahi_lab.hpp"
#include "graph/builder.hpp"
#include "node_harness.hpp"

using namespace mesh;
using namespace mesh::test;
using namespace std::chrono_literals;

namespace {

/// A random mesh secret in a file meshnode accepts (64 hex digits, mode 0600).
std::vector<uint8_t> write_secret(const std::filesystem::path& path) {
  std::random_device rd;
  std::vector<uint8_t> secret(32);
  std::string hex;
  for (auto& b : secret) {
    b = static_cast<uint8_t>(rd());
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  std::ofstream(path) << hex << "\n";
  ::chmod(path.c_str(), 0600);
  return secret;
}

}  // namespace

TEST_CASE("a client finds a meshnode by mDNS and runs a job on it", "[apps][mdns]") {
  if (auto why = discovery::lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  discovery::lab::host daemon("climdns");
  REQUIRE(daemon.start_daemon());
  ::setenv("DBUS_SYSTEM_BUS_ADDRESS", daemon.bus_address().c_str(), 1);  // inherited by the node

  temp_dir tmp;
  // A mesh of its own: only this test's node is a member.
  const auto secret = write_secret(tmp.path / "secret");
  node_process node(tmp.path / "n", {"--mdns", "on", "--secret-file", (tmp.path / "secret").string()});
  const std::string ep = node.endpoint();

  client_options options;
  options.mesh_secret = secret;
  auto found = find_node(options, 20s);
  INFO("node log:\n" << node.log());
  REQUIRE(found);
  CHECK(node_id_of(*found) == node_id_of(ep));
  CHECK(found->substr(found->rfind(':')) == ep.substr(ep.rfind(':')));

  options.connect_timeout = 20s;
  auto c = client::connect("", options);
  REQUIRE(c);
  CHECK((*c)->node().to_string() == node_id_of(ep));
  builder b;
  auto x = b.input("x", dtype::f32, {4});
  b.output("y", x + 1.0);
  auto r = (*c)->run(*b.finish(), {{"x", tensor::from_floats({4}, {1, 2, 3, 4})}}, {}, 60s);
  REQUIRE(r);
  CHECK(r->outputs.at("y").to_floats() == std::vector<float>{2, 3, 4, 5});

  // Another mesh's client sees the node as foreign and gives up with a clear error.
  client_options other;
  other.mesh_secret.assign(32, 7);
  auto none = find_node(other, 3s);
  REQUIRE_FALSE(none);
  CHECK(none.error().message.find("no meshnode of this mesh answered on mDNS within 3 s") != std::string::npos);
  CHECK(none.error().message.find("another mesh") != std::string::npos);
}

TEST_CASE("nodes that joined with one token find each other by mDNS and ignore another mesh", "[apps][mdns][membership]") {
  if (auto why = discovery::lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  discovery::lab::host daemon("joinmdns");
  REQUIRE(daemon.start_daemon());
  ::setenv("DBUS_SYSTEM_BUS_ADDRESS", daemon.bus_address().c_str(), 1);  // inherited by the nodes

  temp_dir tmp;
  // a and b join the test mesh (--join test_token()) and are told about nobody: mDNS alone must
  // bring them together. The stranger creates a mesh of its own and announces it on the same LAN.
  node_process a(tmp.path / "a", {"--mdns", "on"}), b(tmp.path / "b", {"--mdns", "on"});
  node_process stranger(tmp.path / "s", {"--mdns", "on"}, false);
  const std::string ea = a.endpoint(), eb = b.endpoint(), es = stranger.endpoint();

  // The token's mesh id is what the members announce: a client with the token finds one by it.
  auto options = member_options();
  auto found = find_node(options, 20s);
  INFO("a:\n" << a.log() << "\nb:\n" << b.log());
  REQUIRE(found);
  CHECK((node_id_of(*found) == node_id_of(ea) || node_id_of(*found) == node_id_of(eb)));
  auto c = client::connect(ea, options);
  REQUIRE(c);
  REQUIRE(wait_for_peers(**c, 1));
  auto st = (*c)->status();
  REQUIRE(st);
  REQUIRE(st->peers.size() == 1);
  CHECK(st->peers[0].node.to_string() == node_id_of(eb));
  // The stranger saw the members and left them alone, and they it: it has no peer.
  auto sopts = options_for_local_node(tmp.path / "s");
  REQUIRE(sopts);
  auto sc = client::connect(es, *sopts);
  REQUIRE(sc);
  auto sst = (*sc)->status();
  REQUIRE(sst);
  CHECK(sst->peers.empty());
}

TEST_CASE("find_node without avahi-daemon fails after the timeout and says what to do", "[apps][mdns]") {
  // A bus nobody listens on: the discovery backend reports the daemon unreachable.
  ::setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/meshnode-test-bus", 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto none = find_node({}, 1500ms);
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(none);
  CHECK(none.error().code == error_code::timeout);
  CHECK(none.error().message.find("is avahi-daemon running? pass NODEID@HOST:PORT instead") != std::string::npos);
  CHECK(waited >= 1400ms);
  CHECK(waited < 10s);
  auto c = client::connect("mdns", {.mesh_secret = {}, .connect_timeout = 1s});
  REQUIRE_FALSE(c);
  CHECK(c.error().message.find("no meshnode of this mesh answered on mDNS within 1 s") != std::string::npos);
}

namespace {
/// Drops every UDP datagram between two local ports, both ways, while it lives (iptables on
/// loopback): a partition between two nodes on this machine that leaves everything else alone.
class udp_partition {
 public:
  udp_partition(uint16_t a, uint16_t b) : rules_{rule(a, b), rule(b, a)} {
    for (const auto& r : rules_) ok_ = ok_ && discovery::lab::sh("iptables -I INPUT " + r) == 0;
  }
  ~udp_partition() { heal(); }
  void heal() {
    for (const auto& r : rules_) discovery::lab::sh("iptables -D INPUT " + r + " 2>/dev/null");
    rules_.clear();
  }
  bool ok() const { return ok_; }

 private:
  static std::string rule(uint16_t from, uint16_t to) {
    return "-i lo -p udp --sport " + std::to_string(from) + " --dport " + std::to_string(to) + " -j DROP";
  }
  std::vector<std::string> rules_;
  bool ok_ = true;
};

uint16_t port_of(const std::string& endpoint) { return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))); }
}  // namespace

TEST_CASE("nodes found by mDNS find each other again after a partition heals", "[apps][mdns][security]") {
  if (auto why = discovery::lab::reason_unavailable()) {
    WARN("skipped: " << *why);
    return;
  }
  discovery::lab::host daemon("healmdns");
  REQUIRE(daemon.start_daemon());
  ::setenv("DBUS_SYSTEM_BUS_ADDRESS", daemon.bus_address().c_str(), 1);  // inherited by the nodes
  temp_dir tmp;
  node_process a(tmp.path / "a", {"--mdns", "on"}), b(tmp.path / "b", {"--mdns", "on"});
  const std::string ea = a.endpoint(), eb = b.endpoint();
  auto c = client::connect(ea, member_options());
  REQUIRE(c);
  INFO("a:\n" << a.log() << "\nb:\n" << b.log());
  REQUIRE(wait_for_peers(**c, 1));

  // Cut for 8 s: health declares the peer Dead after 2.5 s and disconnects it; the mDNS records
  // stay (both nodes still announce), so only the backends' reminders can bring them together.
  const auto cut = std::chrono::steady_clock::now();
  udp_partition partition(port_of(ea), port_of(eb));
  REQUIRE(partition.ok());
  bool lost = false;
  for (int i = 0; i < 100 && !lost; ++i) {
    auto st = (*c)->status(2s);
    lost = st && st->peers.empty();
    if (!lost) std::this_thread::sleep_for(100ms);
  }
  REQUIRE(lost);
  const double lost_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  std::this_thread::sleep_for(8s - (std::chrono::steady_clock::now() - cut));
  partition.heal();
  const auto healed = std::chrono::steady_clock::now();
  REQUIRE(wait_for_peers(**c, 1, 30s));
  const double back_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - healed).count();
  std::printf("partition: b lost %.2f s after the cut, back %.2f s after the heal\n", lost_after, back_after);
  CHECK(lost_after < 5.0);
  CHECK(back_after < 12.0);  // the 5 s reminder, a dial and a hello
  // And work crosses the healed link again.
  auto st = (*c)->status();
  REQUIRE(st);
  REQUIRE(st->peers.size() == 1);
  CHECK(st->peers[0].node.to_string() == node_id_of(eb));
}
