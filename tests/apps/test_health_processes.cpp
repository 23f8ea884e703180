// Health between real meshnode processes over a lossy link (a user-space UDP proxy: this kernel
// has no netem): 10% loss raises no false Dead, a stall shorter than dead_after (2.5 s) makes the
// peer Suspect, and it is Healthy again when heartbeats return.
#include <set>

#include "impairment_proxy.hpp"
#include "node_harness.hpp"

using namespace mesh;
using namespace mesh::test;
using namespace std::chrono_literals;

namespace {
/// B's health as A sees it ("" while A does not list B).
std::string health_of(client& c, const std::string& b_id) {
  auto s = c.status(1s);
  if (!s) return "";
  for (const auto& p : s->peers)
    if (p.node.to_string() == b_id) return to_string(p.health);
  return "";
}
}  // namespace

TEST_CASE("10% loss raises no false Dead, a stall is Suspect, then Healthy again", "[apps][node][health]") {
  temp_dir tmp;
  node_process a(tmp.path / "a");
  const std::string ea = a.endpoint();
  const std::string a_id = node_id_of(ea);
  const uint16_t a_port = static_cast<uint16_t>(std::stoi(ea.substr(ea.rfind(':') + 1)));
  impairment_proxy proxy(a_port, 0.10, 2ms);
  // B reaches A only through the proxy, so every datagram between them crosses it.
  node_process b(tmp.path / "b", {"--peer", a_id + "@127.0.0.1:" + std::to_string(proxy.port())});
  const std::string eb = b.endpoint();
  const std::string b_id = node_id_of(eb);
  auto c = client::connect(ea, member_options());
  REQUIRE(c);
  std::string state;
  for (int i = 0; i < 300 && state != "healthy"; ++i) {
    state = health_of(**c, b_id);
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(state == "healthy");

  std::set<std::string> seen;
  // Watches for how_long, or until `until_state` is seen.
  const auto watch = [&](std::chrono::milliseconds how_long, const std::string& until_state = "") {
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (std::chrono::steady_clock::now() < until) {
      seen.insert(health_of(**c, b_id));
      if (!until_state.empty() && seen.count(until_state)) return;
      std::this_thread::sleep_for(50ms);
    }
  };
  watch(8s);  // 10% loss both ways
  CHECK_FALSE(seen.count("dead"));
  CHECK_FALSE(seen.count(""));
  CHECK(proxy.dropped() > 0);
  // A stall: nothing gets through until A suspects B, for at most 2 s (Dead comes at 2.5 s of
  // silence; Suspect needs at least 750 ms). The stall ends as soon as Suspect is seen, so a slow
  // status reply on a loaded machine cannot turn it into a death.
  proxy.set_loss(1.0);
  watch(2000ms, "suspect");
  proxy.set_loss(0.10);
  watch(3s);
  INFO("states seen: " << seen.size());
  CHECK(seen.count("suspect"));
  CHECK_FALSE(seen.count("dead"));
  CHECK(health_of(**c, b_id) == "healthy");
  CHECK(a.running());
  CHECK(b.running());
}
