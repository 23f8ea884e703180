// The health monitor in simulated time: detection within 3 s, no false Dead under 10% loss or a
// 1 s stall, Suspect -> Healthy when heartbeats return, rejoin after a restart.
#include <catch2/catch.hpp>

#include <random>

#include "actors/health.hpp"
#include "test_ids.hpp"

using namespace mesh;
using namespace std::chrono_literals;

namespace {

/// Simulates one peer sending heartbeats every 250 ms (with jitter) from t=0 until `crash_at`,
/// losing each with probability `loss` and none during [stall_from, stall_from + stall). The
/// observer ticks every 50 ms. Returns the time the peer was declared Dead (or -1) and whether it
/// was ever Suspect.
struct outcome {
  double dead_at_s = -1;
  bool suspected = false;
  peer_health final_state = peer_health::healthy;
};

outcome simulate(double seconds, double loss, uint64_t seed, double crash_at_s = 1e9, double stall_from_s = -1,
                 double stall_s = 0) {
  health_monitor m;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> jitter(0, 10);  // ms
  m.add_peer(mesh::test::named("p"), 1, 0ms);
  outcome o;
  double next_beat_ms = 250;
  for (double t_ms = 0; t_ms <= seconds * 1000; t_ms += 50) {
    while (next_beat_ms <= t_ms) {
      const double sent = next_beat_ms;
      next_beat_ms += 250;
      const bool stalled = stall_from_s >= 0 && sent >= stall_from_s * 1000 && sent < (stall_from_s + stall_s) * 1000;
      if (sent >= crash_at_s * 1000 || stalled || u(rng) < loss) continue;
      const double arrive = sent + std::max(0.0, 1 + jitter(rng));
      m.on_heartbeat(mesh::test::named("p"), 1, std::chrono::duration_cast<mono_time>(std::chrono::duration<double, std::milli>(arrive)));
    }
    for (const auto& tr : m.tick(std::chrono::duration_cast<mono_time>(std::chrono::duration<double, std::milli>(t_ms)))) {
      if (tr.to == peer_health::suspect) o.suspected = true;
      if (tr.to == peer_health::dead && o.dead_at_s < 0) o.dead_at_s = t_ms / 1000;
    }
  }
  o.final_state = m.state(mesh::test::named("p"));
  return o;
}

}  // namespace

TEST_CASE("steady heartbeats keep a peer healthy", "[actors][health]") {
  auto o = simulate(60, 0, 1);
  CHECK_FALSE(o.suspected);
  CHECK(o.final_state == peer_health::healthy);
}

TEST_CASE("a crashed peer is declared dead within 3 s", "[actors][health]") {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const double crash = 10 + static_cast<double>(seed) * 0.37;
    auto o = simulate(20, 0, seed, crash);
    REQUIRE(o.dead_at_s > 0);
    INFO("crash at " << crash << " s, dead at " << o.dead_at_s << " s");
    CHECK(o.dead_at_s - crash <= 3.0);
    CHECK(o.dead_at_s - crash >= 2.0);  // not before dead_after (minus one heartbeat interval)
    CHECK(o.suspected);                 // Suspect comes first
  }
}

TEST_CASE("10% heartbeat loss raises no false Dead", "[actors][health]") {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    auto o = simulate(600, 0.10, 100 + seed);
    INFO("seed " << seed);
    CHECK(o.dead_at_s < 0);
    CHECK(o.final_state != peer_health::dead);
  }
}

TEST_CASE("a 1 s stall makes a peer Suspect, then Healthy again, never Dead", "[actors][health]") {
  auto o = simulate(30, 0, 7, 1e9, 10, 1.0);
  CHECK(o.dead_at_s < 0);
  CHECK(o.final_state == peer_health::healthy);
}

TEST_CASE("Suspect returns to Healthy on a heartbeat, Dead needs a new incarnation", "[actors][health]") {
  health_monitor m;
  m.add_peer(mesh::test::named("p"), 3, 0ms);
  for (int i = 1; i <= 20; ++i) m.on_heartbeat(mesh::test::named("p"), 3, i * 250ms);
  auto t = m.tick(5000ms + 1200ms);  // 1.2 s silence on a regular 250 ms history
  REQUIRE(t.size() == 1);
  CHECK(t[0].to == peer_health::suspect);
  auto back = m.on_heartbeat(mesh::test::named("p"), 3, 6300ms);
  REQUIRE(back.size() == 1);
  CHECK(back[0].to == peer_health::healthy);
  auto d = m.tick(6300ms + 2600ms);
  REQUIRE_FALSE(d.empty());
  CHECK(d.back().to == peer_health::dead);
  CHECK(m.on_heartbeat(mesh::test::named("p"), 3, 9000ms).empty());  // a late heartbeat of the dead process
  CHECK(m.state(mesh::test::named("p")) == peer_health::dead);
  CHECK(m.on_heartbeat(mesh::test::named("p"), 2, 9100ms).empty());  // an older incarnation
  auto rejoin = m.on_heartbeat(mesh::test::named("p"), 4, 9200ms);  // the restarted process
  REQUIRE(rejoin.size() == 1);
  CHECK(rejoin[0].from == peer_health::dead);
  CHECK(rejoin[0].to == peer_health::healthy);
  CHECK(m.state(mesh::test::named("p")) == peer_health::healthy);
}

TEST_CASE("phi grows with silence and with regularity", "[actors][health]") {
  health_monitor regular, jittery;
  regular.add_peer(mesh::test::named("p"), 1, 0ms);
  jittery.add_peer(mesh::test::named("p"), 1, 0ms);
  mono_time tr{}, tj{};
  for (int i = 0; i < 50; ++i) {
    tr += 250ms;
    tj += (i % 2 ? 100ms : 400ms);
    regular.on_heartbeat(mesh::test::named("p"), 1, tr);
    jittery.on_heartbeat(mesh::test::named("p"), 1, tj);
  }
  CHECK(regular.phi(mesh::test::named("p"), tr + 300ms) < regular.phi(mesh::test::named("p"), tr + 900ms));
  CHECK(regular.phi(mesh::test::named("p"), tr + 900ms) > jittery.phi(mesh::test::named("p"), tj + 900ms));
}
