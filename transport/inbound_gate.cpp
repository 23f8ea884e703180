#include "transport/inbound_gate.hpp"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace mesh::transport {

source_key source_key::of(const socket_address& a) {
  source_key k;
  const socket_address u = a.unmapped();
  if (u.family() == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(u.get());
    k.bytes[10] = 0xff;  // the v4-mapped form: never equal to a real IPv6 /64 key
    k.bytes[11] = 0xff;
    std::memcpy(k.bytes.data() + 12, &v4->sin_addr, 4);
  } else if (u.family() == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(u.get());
    std::memcpy(k.bytes.data(), &v6->sin6_addr, 8);  // the /64; the interface id stays zero
  }
  return k;
}

size_t source_key_hash::operator()(const source_key& k) const noexcept {
  uint64_t a, b;
  std::memcpy(&a, k.bytes.data(), 8);
  std::memcpy(&b, k.bytes.data() + 8, 8);
  return std::hash<uint64_t>{}(a * 0x9e3779b97f4a7c15ull ^ b);
}

size_t inbound_gate::half_open_from(const source_key& src) const {
  auto it = count_.find(src);
  return it == count_.end() ? 0 : it->second;
}

inbound_gate::verdict inbound_gate::on_initial(const source_key& src, bool validated, uint64_t now_ns) {
  if (!validated && (limits_.retry_above_half_open == 0 || half_open() >= limits_.retry_above_half_open))
    return {decision::retry, std::nullopt};
  const size_t mine = half_open_from(src);
  if (mine >= limits_.max_half_open_per_source) {
    ++refused_.source_full;
    return {};
  }
  std::optional<uint64_t> evict;
  if (half_open() >= limits_.max_half_open) {
    // Full: the largest holder gives up its oldest attempt, unless this source is (one of) the
    // largest itself.
    const source_key* largest = nullptr;
    size_t most = 0;
    for (const auto& [k, n] : count_)
      if (n > most) {
        most = n;
        largest = &k;
      }
    if (!largest || mine >= most) {
      ++refused_.global_full;
      return {};
    }
    uint64_t oldest_at = UINT64_MAX;
    for (const auto& [h, e] : by_handle_) {
      if (e.src == *largest && e.opened_at < oldest_at) {
        oldest_at = e.opened_at;
        evict = h;
      }
    }
  }
  if (!take_rate_token(src, now_ns)) {
    ++refused_.source_rate;
    return {};
  }
  if (evict) {
    settled(*evict);
    ++evicted_;
  }
  return {decision::accept, evict};
}

void inbound_gate::opened(const source_key& src, uint64_t handle, uint64_t now_ns) {
  if (!by_handle_.emplace(handle, entry{src, now_ns}).second) return;
  ++count_[src];
}

void inbound_gate::settled(uint64_t handle) {
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end()) return;
  auto c = count_.find(it->second.src);
  if (c != count_.end() && --c->second == 0) count_.erase(c);
  by_handle_.erase(it);
}

bool inbound_gate::take_rate_token(const source_key& src, uint64_t now_ns) {
  if (limits_.source_rate_per_s <= 0) return true;  // no rate bound
  auto it = buckets_.find(src);
  if (it == buckets_.end()) {
    if (buckets_.size() >= max_tracked_sources) prune_buckets(now_ns);
    it = buckets_.emplace(src, bucket{limits_.source_burst, now_ns}).first;
  }
  bucket& b = it->second;
  const double elapsed_s = static_cast<double>(now_ns - std::min(now_ns, b.at)) / 1e9;
  b.tokens = std::min(limits_.source_burst, b.tokens + elapsed_s * limits_.source_rate_per_s);
  b.at = now_ns;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

void inbound_gate::prune_buckets(uint64_t now_ns) {
  // A bucket that has refilled is the same as no bucket: forget those. If none has (more than
  // max_tracked_sources validated sources within one refill time), forget the stalest half:
  // those sources get a fresh burst, the memory stays bounded.
  const double refill_s = limits_.source_burst / limits_.source_rate_per_s;
  std::erase_if(buckets_, [&](const auto& kv) {
    return static_cast<double>(now_ns - std::min(now_ns, kv.second.at)) / 1e9 >= refill_s;
  });
  if (buckets_.size() < max_tracked_sources) return;
  std::vector<uint64_t> ats;
  ats.reserve(buckets_.size());
  for (const auto& [k, b] : buckets_) ats.push_back(b.at);
  std::nth_element(ats.begin(), ats.begin() + static_cast<std::ptrdiff_t>(ats.size() / 2), ats.end());
  const uint64_t median = ats[ats.size() / 2];
  std::erase_if(buckets_, [&](const auto& kv) { return kv.second.at <= median; });
}

}  // namespace mesh::transport
