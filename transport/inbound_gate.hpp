#pragma once
/// Admission before state: which inbound connection attempts get connection state. A pure
/// class driven by the endpoint's I/O thread with explicit timestamps, no I/O (tested alone).
///
/// An Initial from an address that has not proven it receives packets (no valid Retry token)
/// gets a Retry at most, never state. A validated one is accepted only within three bounds:
/// a per-source bound on half-open connections (TLS or the admission proof not finished), a
/// per-source rate of new connections, and the global half-open bound. When the global bound is
/// full, an attempt from a source that holds fewer half-open connections than the largest
/// holder evicts that holder's oldest one: one address (or /64) flooding cannot keep others out.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "transport/address.hpp"

namespace mesh::transport {

/// What an inbound attempt is charged to: the IPv4 address, or the /64 of an IPv6 address (one
/// host usually holds a whole /64). IPv4-mapped IPv6 counts as IPv4.
struct source_key {
  std::array<uint8_t, 16> bytes{};
  static source_key of(const socket_address& a);
  friend bool operator==(const source_key&, const source_key&) = default;
};
struct source_key_hash {
  size_t operator()(const source_key& k) const noexcept;
};

/// The bounds (endpoint_config carries the same values).
struct inbound_limits {
  size_t max_half_open = 64;            ///< all sources together
  size_t max_half_open_per_source = 8;  ///< one source (address or IPv6 /64)
  /// New connections per source: a token bucket of `source_burst` refilled at this rate.
  double source_rate_per_s = 20;
  double source_burst = 20;
  /// A Retry is demanded when at least this many connections are half-open; 0 = always.
  size_t retry_above_half_open = 0;
};

/// Why an attempt got no state, one counter each (endpoint_counters publishes them).
struct inbound_refusals {
  uint64_t invalid_token = 0;  ///< a token that did not verify (forged, expired, other address)
  uint64_t source_full = 0;    ///< the source already holds max_half_open_per_source
  uint64_t source_rate = 0;    ///< the source opened connections faster than its rate
  uint64_t global_full = 0;    ///< max_half_open reached and the source is the largest holder
  uint64_t table_full = 0;     ///< max_connections reached
};

class inbound_gate {
 public:
  explicit inbound_gate(inbound_limits limits) : limits_(limits) {}

  enum class decision : uint8_t { accept, retry, refuse };
  struct verdict {
    decision what = decision::refuse;
    /// accept: the half-open connection to drop first (handle given to opened()).
    std::optional<uint64_t> evict;
  };

  /// A client Initial with no connection yet. `validated`: it carried a valid Retry token.
  /// Refusals are counted here; an accept must be followed by opened() (or abandoned silently,
  /// in which case the rate token it took is simply spent).
  verdict on_initial(const source_key& src, bool validated, uint64_t now_ns);
  /// The token check failed (counted; the packet is dropped).
  void on_invalid_token() { ++refused_.invalid_token; }
  /// The connection table is full (counted; the packet is dropped).
  void on_table_full() { ++refused_.table_full; }
  /// An accepted attempt now has state under `handle` (unique while it lives).
  void opened(const source_key& src, uint64_t handle, uint64_t now_ns);
  /// The connection stopped being half-open (admitted, closed, evicted). Idempotent.
  void settled(uint64_t handle);

  size_t half_open() const { return by_handle_.size(); }
  size_t half_open_from(const source_key& src) const;
  const inbound_refusals& refusals() const { return refused_; }
  uint64_t evicted() const { return evicted_; }
  /// Sources with a rate bucket (bounded: bounded memory whatever the number of sources).
  size_t tracked_sources() const { return buckets_.size(); }
  static constexpr size_t max_tracked_sources = 4096;

 private:
  struct entry {
    source_key src;
    uint64_t opened_at;
  };
  struct bucket {
    double tokens;
    uint64_t at;
  };
  bool take_rate_token(const source_key& src, uint64_t now_ns);
  void prune_buckets(uint64_t now_ns);

  inbound_limits limits_;
  std::unordered_map<uint64_t, entry> by_handle_;                   // half-open connections
  std::unordered_map<source_key, size_t, source_key_hash> count_;  // half-open per source (> 0 only)
  std::unordered_map<source_key, bucket, source_key_hash> buckets_;
  inbound_refusals refused_;
  uint64_t evicted_ = 0;
};

/// Lets one line through per interval and counts the rest, for events an attacker can make
/// happen at line rate (refused attempts): the next line says how many were suppressed.
class log_limiter {
 public:
  explicit log_limiter(uint64_t interval_ns) : interval_ns_(interval_ns) {}
  /// Whether to log now; `suppressed` receives how many were held back since the last line.
  bool allow(uint64_t now_ns, uint64_t& suppressed) {
    if (logged_once_ && now_ns < last_ + interval_ns_) {
      ++held_;
      return false;
    }
    logged_once_ = true;
    last_ = now_ns;
    suppressed = held_;
    held_ = 0;
    return true;
  }

 private:
  uint64_t interval_ns_;
  uint64_t last_ = 0, held_ = 0;
  bool logged_once_ = false;
};

}  // namespace mesh::transport
