#pragma once
/// The endpoint's insides, shared by endpoint.cpp (public API), endpoint_impl.cpp (the I/O loop)
/// and endpoint_traversal.cpp (NAT traversal). Internal to transport/.
#include <time.h>

#include <atomic>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transport/connection.hpp"
#include "transport/endpoint.hpp"
#include "transport/inbound_gate.hpp"
#include "transport/relay_sessions.hpp"
#include "transport/retry.hpp"
#include "transport/traversal.hpp"
#include "transport/udp_socket.hpp"

namespace mesh::transport {

/// CLOCK_MONOTONIC in nanoseconds: the time base of every ngtcp2 timestamp and of the timerfd.
inline uint64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

/// Connection ids as map keys. Looked up as string_views (no allocation per packet: an
/// 18-byte id does not fit std::string's inline buffer), stored as strings.
inline std::string_view cid_key(const uint8_t* data, size_t len) {
  return {reinterpret_cast<const char*>(data), len};
}
struct cid_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// Every connection id this endpoint issues has this length (short headers carry no length).
inline constexpr size_t short_header_cid_len = 18;

/// One endpoint's state. The members are open to the three files above only; everything after
/// "Everything below belongs to the I/O thread" is touched by that thread alone, the rest is
/// immutable after init() or guarded by its mutex.
class endpoint_impl final : public connection_owner {
 public:
  endpoint_impl(endpoint_config cfg, handlers h)
      : cfg_(std::move(cfg)),
        h_(std::move(h)),
        gate_(inbound_limits{cfg_.max_half_open, cfg_.max_half_open_per_source, cfg_.source_rate_per_s,
                             cfg_.source_burst, cfg_.retry_above_half_open}) {}
  ~endpoint_impl() override { stop(); close_fds(); }

  expected<void> init();
  void stop();
  /// Handles deadlines that came due during the read/write pass (see the definition).
  void settle_timers();

  endpoint_config cfg_;
  handlers h_;
  udp_socket sock_;
  std::unique_ptr<tls_context> tls_;
  int epfd_ = -1, timerfd_ = -1, eventfd_ = -1;
  uint64_t timer_armed_at_ = UINT64_MAX;  // the deadline timerfd_ holds (a syscall saved when unchanged)
  std::thread thread_;
  std::thread::id io_thread_id_;
  std::atomic<bool> stopping_{false};

  std::mutex cmd_mu_;
  std::vector<std::function<void()>> cmds_;

  buffer_pool receive_buffers_;  // thread-safe itself: filled by recycle() from any thread
  uint64_t next_pool_trim_ = 0;  // I/O thread: when to free receive buffers unused for 10 s next

  mutable std::mutex view_mu_;
  std::unordered_set<node_id> up_;  // the peers other threads may send to
  std::optional<std::string> observed_;  // our address as the last peer saw it
  endpoint_counters counters_;           // published copy of the I/O thread's counters
  std::unordered_map<node_id, uint64_t> queued_;  // per peer: payload reserved by send(), not yet acked

  // Everything below belongs to the I/O thread.
  std::list<std::unique_ptr<connection>> conns_;
  std::unordered_map<std::string, connection*, cid_hash, std::equal_to<>> by_cid_;
  std::unordered_map<node_id, connection*> by_peer_;
  std::unordered_map<connection*, node_id> dial_targets_;  // outbound: the id we asked for
  std::unordered_set<connection*> quiet_;  // superseded duplicates: their end is not a peer down
  // A simultaneous dial's winner whose messages wait until its retiring twin's are acknowledged.
  std::unordered_map<connection*, connection*> held_behind_;
  static constexpr uint64_t retire_timeout_ns = 30'000'000'000;
  // Peers whose connection the other side closed as a duplicate while our copy of the winning
  // connection was still being set up: they stay up, and its admission brings no second up.
  std::unordered_set<node_id> replacing_;
  std::unordered_map<node_id, node_id> relay_routes_;   // peer up through a relay -> that relay
  relay_sessions relay_sessions_{node_id{cfg_.id.public_key()}, cfg_.mesh_secret};  // end to end, through relays
  std::unordered_map<node_id, node_id> punch_pending_;  // peer being punched -> its rendezvous
  // Hole punching on a member's word, bounded (endpoint_traversal.cpp): punch frames make this
  // node send packets to, and dial, an address the rendezvous names.
  static constexpr size_t max_punch_sessions = 16;          // punch_pending_ entries at once
  static constexpr uint64_t punch_interval_ns = 1'000'000'000;  // unsolicited punches per rendezvous, introductions per requester
  std::unordered_map<node_id, uint64_t> asked_introductions_;  // target -> when connect_via asked a rendezvous
  std::unordered_map<node_id, uint64_t> last_unsolicited_punch_;  // rendezvous -> its last punch we did not ask for
  std::unordered_map<node_id, uint64_t> last_introduction_;       // requester -> its last introduce (we are the rendezvous)
  uint64_t punches_refused_ = 0;
  std::vector<std::pair<uint64_t, std::function<void()>>> tasks_;  // timed actions (punch, dial)
  std::vector<uint8_t> pending_;            // bytes the socket refused (EAGAIN), sent first next time
  socket_address pending_to_;
  size_t pending_segment_ = 0;
  bool blocked_ = false;
  uint64_t packets_dropped_ = 0;
  // Admission before state (inbound_gate.hpp, retry.hpp).
  inbound_gate gate_;
  retry_secret retry_secret_{};
  uint64_t retries_sent_ = 0, accept_timeouts_ = 0;
  uint64_t relay_refused_ = 0;  // relayed messages refused: not of the open session, or replayed
  log_limiter refusal_log_{1'000'000'000};  // refused and failed inbound attempts: a line a second
  std::array<uint8_t, 256> retry_buf_{};
  /// Logs an event a stranger can cause at line rate, at most one line a second.
  void log_limited(const std::string& line) {
    uint64_t suppressed = 0;
    if (!refusal_log_.allow(now_ns(), suppressed)) return;
    log(suppressed ? line + " (" + std::to_string(suppressed) + " similar lines suppressed)" : line);
  }
  static uint64_t handle_of(const connection* c) { return reinterpret_cast<uintptr_t>(c); }
  /// Stateless handling of a datagram that matched no connection (the inbound gate).
  void accept_initial(const socket_address& from, const uint8_t* data, size_t len, uint64_t ts);
  bool need_write_ = false;  // a connection was made outside the read/write pass: write before sleeping
  static constexpr size_t rx_slot_size = 65536, rx_slots = 8;  // one recvmmsg: 8 receives of up to 64 KiB
  std::vector<uint8_t> rx_buf_ = std::vector<uint8_t>(rx_slot_size * rx_slots);

  void post(std::function<void()> fn);
  void run();
  void drain_commands();
  void read_socket(uint64_t ts);
  void dispatch(const socket_address& from, const uint8_t* data, size_t len, uint64_t ts);
  void write_all(uint64_t ts);
  void reap();
  /// Retiring duplicates: send `retire`, close when both ends drained; release held winners.
  void advance_retirements(uint64_t ts);
  /// A live, retiring connection to `id` other than `c`.
  connection* retiring_twin(const node_id& id, const connection* c) const;
  void arm_timer(uint64_t at);
  bool send_bytes(const socket_address& to, const uint8_t* data, size_t len, size_t segment);
  bool flush_pending();
  void set_writable_interest(bool on);
  void start_dial(const node_id& expected, std::vector<std::string> addresses, uint64_t ts);
  void log(const std::string& line) {
    if (h_.on_log) h_.on_log(line);
  }
  void close_fds() {
    for (int* fd : {&epfd_, &timerfd_, &eventfd_})
      if (*fd >= 0) {
        ::close(*fd);
        *fd = -1;
      }
  }

  // connection_owner
  void on_cid_added(connection& c, const ngtcp2_cid& cid) override { by_cid_[std::string(cid_key(cid.data, cid.datalen))] = &c; }
  void on_cid_removed(connection& c, const ngtcp2_cid& cid) override {
    auto it = by_cid_.find(cid_key(cid.data, cid.datalen));
    if (it != by_cid_.end() && it->second == &c) by_cid_.erase(it);
  }
  void on_admitted(connection& c) override;
  void on_traversal_frame(connection& c, frame f) override;
  void on_released(connection& c, uint64_t bytes) override {
    if (c.peer()) release(*c.peer(), bytes);
  }
  void release(const node_id& peer, uint64_t bytes) {
    std::lock_guard lock(view_mu_);
    auto it = queued_.find(peer);
    if (it != queued_.end()) it->second -= std::min(it->second, bytes);
  }
  void on_relay_deliver(connection& relay, relay_envelope env);
  void start_relay(const node_id& target, const node_id& relay);
  void relay_peer_up(const node_id& peer, const node_id& relay);
  /// A relayed peer is down (the relay went away, or this side closed it: `orderly`).
  void relay_peer_down(const node_id& peer, const std::string& why, bool orderly = false);
  void send_punch_packets(const socket_address& to);
  size_t half_open() const { return gate_.half_open(); }
  /// Another live connection attempt to `id` besides `c` (for the duplicate hand-over).
  bool has_other_attempt(const node_id& id, const connection* c) const {
    for (auto& other : conns_) {
      if (other.get() == c || other->end_reported || other->ended()) continue;
      auto t = dial_targets_.find(other.get());
      if (other->peer() == id || (t != dial_targets_.end() && t->second == id)) return true;
    }
    return false;
  }
  void publish_counters() {
    const inbound_refusals& r = gate_.refusals();
    endpoint_counters k{conns_.size(),
                        half_open(),
                        r.source_full + r.source_rate + r.global_full + r.table_full,
                        packets_dropped_,
                        retries_sent_,
                        r.invalid_token,
                        r.source_full,
                        r.source_rate,
                        r.global_full,
                        r.table_full,
                        gate_.evicted(),
                        accept_timeouts_,
                        relay_refused_,
                        punches_refused_};
    std::lock_guard lock(view_mu_);
    counters_ = k;
  }
  void schedule(uint64_t at, std::function<void()> fn) { tasks_.emplace_back(at, std::move(fn)); }
  connection* direct(const node_id& id) {
    auto it = by_peer_.find(id);
    return it == by_peer_.end() ? nullptr : it->second;
  }
  buffer_pool& receive_buffers() override { return receive_buffers_; }
  void on_message(connection& c, channel ch, std::vector<uint8_t> bytes, delivery_receipt receipt) override {
    // A retiring duplicate still delivers: the peer may have sent on it before it switched.
    if (!(c.up_reported || c.retiring()) || !c.peer()) return;
    deliver(*c.peer(), ch, std::move(bytes), std::move(receipt));
  }
  /// Hands a message to the application with its receipt (released when on_message returns,
  /// unless the handler takes it: delivery_receipt.hpp).
  void deliver(const node_id& from, channel ch, std::vector<uint8_t> bytes, delivery_receipt receipt) {
    if (!h_.on_message) return;
    detail::receipt_scope scope(receipt);
    h_.on_message(from, ch, std::move(bytes));
  }
  std::shared_ptr<release_hub> releases() override { return releases_; }
  /// Receipts released while a connection withholds credit wake the I/O thread through this;
  /// it gives back what their releases made room for (connection::refresh_credit).
  std::shared_ptr<release_hub> releases_ = std::make_shared<release_hub>();
  bool refresh_posted_ = false;  // guarded by releases_->mu
};

}  // namespace mesh::transport
