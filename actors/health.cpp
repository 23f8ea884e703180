#include "actors/health.hpp"

#include <algorithm>
#include <cmath>

namespace mesh {

void health_monitor::add_peer(const node_id& peer, uint64_t incarnation, mono_time now) {
  record r;
  r.incarnation = incarnation;
  r.last = now;
  peers_[peer] = std::move(r);
}

void health_monitor::remove_peer(const node_id& peer) { peers_.erase(peer); }

std::vector<health_transition> health_monitor::on_heartbeat(const node_id& peer, uint64_t incarnation,
                                                            mono_time now) {
  std::vector<health_transition> out;
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    add_peer(peer, incarnation, now);
    return out;
  }
  record& r = it->second;
  if (incarnation < r.incarnation) return out;  // a late heartbeat from before a restart
  if (incarnation > r.incarnation) {
    // The peer restarted: forget the old history, it is a new process.
    const peer_health before = r.state;
    add_peer(peer, incarnation, now);
    if (before != peer_health::healthy) out.push_back({peer, before, peer_health::healthy});
    return out;
  }
  if (r.state == peer_health::dead) return out;  // Dead is final for an incarnation
  const double ms = std::chrono::duration<double, std::milli>(now - r.last).count();
  if (ms > 0) {
    r.intervals_ms.push_back(ms);
    r.sum += ms;
    r.sum_sq += ms * ms;
    if (r.intervals_ms.size() > config_.window) {
      const double old = r.intervals_ms.front();
      r.intervals_ms.pop_front();
      r.sum -= old;
      r.sum_sq -= old * old;
    }
  }
  r.last = std::max(r.last, now);
  if (r.state == peer_health::suspect) {
    r.state = peer_health::healthy;
    out.push_back({peer, peer_health::suspect, peer_health::healthy});
  }
  return out;
}

double health_monitor::phi_of(const record& r, mono_time now) const {
  const double silence = std::chrono::duration<double, std::milli>(now - r.last).count();
  const double nominal = std::chrono::duration<double, std::milli>(config_.heartbeat_interval).count();
  // Until enough samples exist, assume the nominal interval with a generous spread.
  double mean = nominal, stddev = nominal / 2;
  const double n = static_cast<double>(r.intervals_ms.size());
  if (n >= 4) {
    mean = r.sum / n;
    const double var = std::max(0.0, r.sum_sq / n - mean * mean);
    // A floor on the spread: perfectly regular heartbeats must not make one late packet fatal.
    stddev = std::max(std::sqrt(var), nominal / 4);
  }
  // P(interval > silence) under a normal model; phi = -log10 of it.
  const double z = (silence - mean) / stddev;
  const double p_later = 0.5 * std::erfc(z / std::sqrt(2.0));
  return -std::log10(std::max(p_later, 1e-300));
}

double health_monitor::phi(const node_id& peer, mono_time now) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : phi_of(it->second, now);
}

std::vector<health_transition> health_monitor::tick(mono_time now) {
  std::vector<health_transition> out;
  for (auto& [peer, r] : peers_) {
    if (r.state == peer_health::dead) continue;
    const auto silence = now - r.last;
    peer_health next = r.state;
    if (silence >= config_.dead_after) next = peer_health::dead;
    else if (silence >= config_.min_suspect_silence && phi_of(r, now) >= config_.suspect_phi) next = peer_health::suspect;
    if (next != r.state) {
      out.push_back({peer, r.state, next});
      r.state = next;
    }
  }
  return out;
}

peer_health health_monitor::state(const node_id& peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? peer_health::dead : it->second.state;
}

std::vector<node_id> health_monitor::peers() const {
  std::vector<node_id> out;
  for (const auto& [p, r] : peers_) out.push_back(p);
  return out;
}

}  // namespace mesh
