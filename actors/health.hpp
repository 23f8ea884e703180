#pragma once
/// The health monitor's pure core: who is Healthy, Suspect or Dead, from heartbeat arrival times.
///
/// Driven by explicit time (no clock, no sockets): the actor feeds it heartbeats and ticks, and
/// forwards the transitions it returns. Suspicion is phi-accrual (Hayashibara et al.): phi is
/// -log10 of the probability that a heartbeat this late would still come, given the observed
/// inter-arrival times, so a peer on a jittery link needs more silence before it is suspected.
/// Death is a hard bound on silence (dead_after), which bounds detection time no matter what the
/// history says. Suspect -> Healthy when heartbeats return; Dead is final for that incarnation: a
/// restarted peer announces a higher incarnation and comes back as Healthy.
///
/// Defaults (heartbeats every 250 ms, Dead after 2.5 s of silence) detect a crash within 3 s and
/// give no false Dead under 10% heartbeat loss or a 1 s stall (see tests/actors/test_health.cpp).
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "base/node_id.hpp"
#include "wire/states.hpp"

namespace mesh {

/// Monotonic time since an arbitrary origin; tests use simulated values.
using mono_time = std::chrono::nanoseconds;

struct health_config {
  std::chrono::milliseconds heartbeat_interval{250};  ///< how often peers send heartbeats
  double suspect_phi = 8.0;                           ///< phi above which a peer is Suspect
  std::chrono::milliseconds min_suspect_silence{750};  ///< never suspect before this much silence
  std::chrono::milliseconds dead_after{2500};         ///< silence after which a peer is Dead
  size_t window = 100;                                ///< inter-arrival samples kept per peer
};

struct health_transition {
  node_id peer;
  peer_health from, to;
};

class health_monitor {
 public:
  explicit health_monitor(health_config config = {}) : config_(config) {}

  /// Starts watching `peer` as Healthy, as if a heartbeat had just arrived.
  void add_peer(const node_id& peer, uint64_t incarnation, mono_time now);
  void remove_peer(const node_id& peer);

  /// A heartbeat arrived. Returns the transitions it causes (Suspect -> Healthy, or a restarted
  /// peer's Dead -> Healthy); heartbeats of an old incarnation are ignored.
  std::vector<health_transition> on_heartbeat(const node_id& peer, uint64_t incarnation, mono_time now);

  /// Re-evaluates every peer at `now`; returns the transitions (Healthy -> Suspect -> Dead).
  std::vector<health_transition> tick(mono_time now);

  peer_health state(const node_id& peer) const;
  /// Current suspicion level of `peer` (0 when it has no history yet).
  double phi(const node_id& peer, mono_time now) const;
  std::vector<node_id> peers() const;

 private:
  struct record {
    uint64_t incarnation = 0;
    peer_health state = peer_health::healthy;
    mono_time last{};
    std::deque<double> intervals_ms;
    double sum = 0, sum_sq = 0;
  };
  double phi_of(const record& r, mono_time now) const;

  health_config config_;
  std::map<node_id, record> peers_;
};

}  // namespace mesh
