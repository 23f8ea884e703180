#include "transport/endpoint.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "transport/connection.hpp"
#include "transport/traversal.hpp"
#include "transport/udp_socket.hpp"

namespace mesh::transport {

namespace {

uint64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

std::string cid_key(const uint8_t* data, size_t len) { return std::string(reinterpret_cast<const char*>(data), len); }

constexpr size_t short_header_cid_len = 18;  // every connection id this endpoint issues has this length

}  // namespace

class endpoint_impl final : public connection_owner {
 public:
  endpoint_impl(endpoint_config cfg, handlers h) : cfg_(std::move(cfg)), h_(std::move(h)) {}
  ~endpoint_impl() override { stop(); close_fds(); }

  expected<void> init();
  void stop();

  endpoint_config cfg_;
  handlers h_;
  udp_socket sock_;
  std::unique_ptr<tls_context> tls_;
  int epfd_ = -1, timerfd_ = -1, eventfd_ = -1;
  std::thread thread_;
  std::thread::id io_thread_id_;
  std::atomic<bool> stopping_{false};

  std::mutex cmd_mu_;
  std::vector<std::function<void()>> cmds_;

  mutable std::mutex view_mu_;
  std::unordered_set<node_id> up_;  // the peers other threads may send to
  std::optional<std::string> observed_;  // our address as the last peer saw it
  endpoint_counters counters_;           // published copy of the I/O thread's counters
  std::unordered_map<node_id, uint64_t> queued_;  // per peer: payload reserved by send(), not yet acked

  // Everything below belongs to the I/O thread.
  std::list<std::unique_ptr<connection>> conns_;
  std::unordered_map<std::string, connection*> by_cid_;
  std::unordered_map<node_id, connection*> by_peer_;
  std::unordered_map<connection*, node_id> dial_targets_;  // outbound: the id we asked for
  std::unordered_set<connection*> quiet_;  // superseded duplicates: their end is not a peer down
  std::unordered_map<node_id, node_id> relay_routes_;   // peer up through a relay -> that relay
  std::unordered_map<node_id, node_id> punch_pending_;  // peer being punched -> its rendezvous
  std::vector<std::pair<uint64_t, std::function<void()>>> tasks_;  // timed actions (punch, dial)
  std::vector<uint8_t> pending_;            // bytes the socket refused (EAGAIN), sent first next time
  socket_address pending_to_;
  size_t pending_segment_ = 0;
  bool blocked_ = false;
  uint64_t initials_shed_ = 0, packets_dropped_ = 0;
  bool need_write_ = false;  // a connection was made outside the read/write pass: write before sleeping
  std::vector<uint8_t> rx_buf_ = std::vector<uint8_t>(65536);

  void post(std::function<void()> fn);
  void run();
  void drain_commands();
  void read_socket(uint64_t ts);
  void dispatch(const socket_address& from, const uint8_t* data, size_t len, uint64_t ts);
  void write_all(uint64_t ts);
  void reap();
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
  void on_cid_added(connection& c, const ngtcp2_cid& cid) override { by_cid_[cid_key(cid.data, cid.datalen)] = &c; }
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
  void relay_peer_down(const node_id& peer, const std::string& why);
  void send_punch_packets(const socket_address& to);
  size_t half_open() const {
    size_t n = 0;
    for (auto& c : conns_)
      if (c->inbound() && c->current_state() == connection::state::handshaking) ++n;
    return n;
  }
  void publish_counters() {
    endpoint_counters k{conns_.size(), half_open(), initials_shed_, packets_dropped_};
    std::lock_guard lock(view_mu_);
    counters_ = k;
  }
  void schedule(uint64_t at, std::function<void()> fn) { tasks_.emplace_back(at, std::move(fn)); }
  connection* direct(const node_id& id) {
    auto it = by_peer_.find(id);
    return it == by_peer_.end() ? nullptr : it->second;
  }
  void on_message(connection& c, channel ch, std::vector<uint8_t> bytes) override {
    if (!c.up_reported || !c.peer()) return;
    if (h_.on_message) h_.on_message(*c.peer(), ch, std::move(bytes));
  }
};

expected<void> endpoint_impl::init() {
  auto s = udp_socket::open(cfg_.bind, cfg_.port, cfg_.socket_buffer_bytes);
  if (!s) return tl::unexpected(s.error());
  sock_ = std::move(*s);
  auto t = tls_context::create(cfg_.id);
  if (!t) return tl::unexpected(t.error());
  tls_ = std::move(*t);
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  timerfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  eventfd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || timerfd_ < 0 || eventfd_ < 0)
    return make_error(error_code::io_error, std::string("cannot create epoll/timerfd/eventfd: ") + std::strerror(errno));
  for (int fd : {sock_.fd(), timerfd_, eventfd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return make_error(error_code::io_error, std::string("epoll_ctl: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { run(); });
  io_thread_id_ = thread_.get_id();
  return {};
}

void endpoint_impl::post(std::function<void()> fn) {
  {
    std::lock_guard lock(cmd_mu_);
    cmds_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(eventfd_, &one, sizeof(one));
}

void endpoint_impl::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(eventfd_, &one, sizeof(one));
  // From a callback the loop just ends after this iteration; the thread is joined by the
  // destructor, which therefore must not run on the I/O thread.
  if (std::this_thread::get_id() == io_thread_id_) return;
  thread_.join();
}

void endpoint_impl::drain_commands() {
  uint64_t v;
  while (::read(eventfd_, &v, sizeof(v)) > 0) {
  }
  std::vector<std::function<void()>> cmds;
  {
    std::lock_guard lock(cmd_mu_);
    cmds.swap(cmds_);
  }
  for (auto& c : cmds) c();
}

void endpoint_impl::set_writable_interest(bool on) {
  epoll_event ev{};
  ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
  ev.data.fd = sock_.fd();
  epoll_ctl(epfd_, EPOLL_CTL_MOD, sock_.fd(), &ev);
}

bool endpoint_impl::send_bytes(const socket_address& to, const uint8_t* data, size_t len, size_t segment) {
  if (blocked_) return false;
  auto dest = to.for_family(sock_.family());
  if (!dest) return true;  // unreachable from this socket: the packet is lost, QUIC copes
  size_t sent = 0;
  if (sock_.send(*dest, data, len, segment, &sent) == udp_socket::send_result::would_block) {
    pending_.assign(data + sent, data + len);
    pending_to_ = *dest;
    pending_segment_ = segment;
    blocked_ = true;
    set_writable_interest(true);
    return false;
  }
  return true;
}

bool endpoint_impl::flush_pending() {
  if (!blocked_) return true;
  size_t sent = 0;
  auto r = sock_.send(pending_to_, pending_.data(), pending_.size(), pending_segment_, &sent);
  if (r == udp_socket::send_result::would_block) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(sent));
    return false;
  }
  pending_.clear();
  blocked_ = false;
  set_writable_interest(false);
  return true;
}

void endpoint_impl::arm_timer(uint64_t at) {
  itimerspec its{};
  if (at != UINT64_MAX) {
    its.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000u);
    its.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000u);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  timerfd_settime(timerfd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

void endpoint_impl::dispatch(const socket_address& from, const uint8_t* data, size_t len, uint64_t ts) {
  ngtcp2_version_cid vc{};
  if (ngtcp2_pkt_decode_version_cid(&vc, data, len, short_header_cid_len) != 0) {  // garbage or VN: drop
    ++packets_dropped_;
    return;
  }
  auto it = by_cid_.find(cid_key(vc.dcid, vc.dcidlen));
  if (it != by_cid_.end()) {
    it->second->read(sock_.local(), from, data, len, ts);
    return;
  }
  if (stopping_) return;
  ngtcp2_pkt_hd hd{};
  if (ngtcp2_accept(&hd, data, len) != 0) {  // not a valid Initial: stateless drop
    ++packets_dropped_;
    return;
  }
  if (half_open() >= cfg_.max_half_open || conns_.size() >= cfg_.max_connections) {
    ++initials_shed_;  // shed load statelessly: the client retransmits, or gives up
    return;
  }
  auto c = connection::make_server(*this, cfg_, *tls_, sock_.local(), from, hd, ts);
  if (!c) {
    log("cannot accept a connection from " + from.to_string() + ": " + c.error().message);
    return;
  }
  connection* raw = c->get();
  conns_.push_back(std::move(*c));
  raw->read(sock_.local(), from, data, len, ts);
}

void endpoint_impl::read_socket(uint64_t ts) {
  for (int i = 0; i < 1024; ++i) {
    auto r = sock_.receive(rx_buf_.data(), rx_buf_.size());
    if (!r) return;
    // With GRO one receive holds several datagrams of `segment` bytes each.
    for (size_t off = 0; off < r->len; off += r->segment) {
      size_t n = std::min(r->segment, r->len - off);
      dispatch(r->from, rx_buf_.data() + off, n, ts);
    }
  }
}

void endpoint_impl::on_admitted(connection& c) {
  const node_id id = *c.peer();
  auto it = by_peer_.find(id);
  if (it != by_peer_.end() && it->second != &c) {
    // Two connections to one peer (both dialed at once, or a copied identity). Both ends keep
    // the one dialed by the smaller node id, so they agree without talking about it.
    connection* old = it->second;
    if (old->inbound() == c.inbound()) {
      // Same direction twice: not a simultaneous dial but two live nodes with one identity (a
      // copied state directory). The first one keeps the id; the second is refused.
      c.close(close_code::duplicate, "another live node already uses node id " + id.short_string() +
                                         " (copied state directory?)");
      return;
    }
    bool local_smaller = node_id{cfg_.id.public_key()} < id;
    bool keep_new = local_smaller ? !c.inbound() : c.inbound();
    connection* loser = keep_new ? old : &c;
    quiet_.insert(loser);
    loser->close(close_code::duplicate, "duplicate connection to the same node; keeping the other one");
    if (!keep_new) return;
    old->up_reported = false;
    c.up_reported = true;
    it->second = &c;
    return;  // the peer stays up: no second on_peer_up
  }
  by_peer_[id] = &c;
  c.up_reported = true;
  punch_pending_.erase(id);
  // Tell the peer where its packets come from: behind a NAT that is its public mapping.
  c.queue_frame(frame_kind::observed_address, encode_address(c.remote()));
  if (relay_routes_.erase(id)) return;  // was up through a relay: now direct, still the same peer
  {
    std::lock_guard lock(view_mu_);
    up_.insert(id);
  }
  if (h_.on_peer_up) h_.on_peer_up(id, peer_info{c.remote().to_string(), c.inbound(), false, std::nullopt});
}

void endpoint_impl::send_punch_packets(const socket_address& to) {
  // Not QUIC (too short for a short header with our 18-byte ids): the receiver drops it
  // statelessly; its only job is to open this side's NAT mapping towards `to`.
  static const uint8_t punch[] = {'m', 'e', 's', 'h', '-', 'p', 'u', 'n', 'c', 'h'};
  auto dest = to.for_family(sock_.family());
  if (!dest) return;
  size_t sent = 0;
  sock_.send(*dest, punch, sizeof(punch), sizeof(punch), &sent);
}

void endpoint_impl::on_traversal_frame(connection& c, frame f) {
  const node_id from = *c.peer();
  switch (f.kind) {
    case frame_kind::observed_address: {
      auto a = decode_address(f.payload);
      if (!a) return log("peer " + from.short_string() + " sent a malformed observed address");
      std::lock_guard lock(view_mu_);
      observed_ = a->to_string();
      return;
    }
    case frame_kind::introduce: {  // we are the rendezvous
      auto target = decode_node_id(f.payload);
      if (!target) return log("peer " + from.short_string() + " sent a malformed introduce frame");
      connection* t = direct(*target);
      if (!t) return log("cannot introduce " + from.short_string() + " to " + target->short_string() + ": not connected");
      c.queue_frame(frame_kind::punch, encode_peer_address({*target, t->remote()}));
      t->queue_frame(frame_kind::punch, encode_peer_address({from, c.remote()}));
      return;
    }
    case frame_kind::punch: {  // from a rendezvous: punch now, the smaller id dials
      auto p = decode_peer_address(f.payload);
      if (!p) return log("peer " + from.short_string() + " sent a malformed punch frame");
      if (direct(p->id) || p->id == node_id{cfg_.id.public_key()}) return;
      punch_pending_[p->id] = from;
      uint64_t now = now_ns();
      for (uint64_t ms : {0u, 10u, 20u, 40u}) {
        socket_address a = p->address;
        schedule(now + ms * 1'000'000u, [this, a] { send_punch_packets(a); });
      }
      if (node_id{cfg_.id.public_key()} < p->id) {
        node_id target = p->id;
        std::string addr = p->address.to_string();
        schedule(now + 30'000'000u, [this, target, addr] { start_dial(target, {addr}, now_ns()); });
      } else {
        // The other side dials; if no direct path appears it asks the rendezvous to relay.
        node_id target = p->id;
        schedule(now + 3 * static_cast<uint64_t>(cfg_.handshake_timeout.count()) * 1'000'000u,
                 [this, target] { punch_pending_.erase(target); });
      }
      return;
    }
    case frame_kind::relay_send: {  // we are the relay
      auto env = decode_relay(f.payload);
      if (!env) return log("peer " + from.short_string() + " sent a malformed relay frame");
      connection* t = direct(env->peer);
      if (!t) return log("cannot relay from " + from.short_string() + " to " + env->peer.short_string() + ": not connected");
      if (h_.on_relay) h_.on_relay(from, env->peer, env->box);
      t->queue_frame(frame_kind::relay_deliver, encode_relay({from, std::move(env->box)}));
      return;
    }
    case frame_kind::relay_deliver: {
      auto env = decode_relay(f.payload);
      if (!env) return log("peer " + from.short_string() + " sent a malformed relay frame");
      on_relay_deliver(c, std::move(*env));
      return;
    }
    default: return;
  }
}

void endpoint_impl::relay_peer_up(const node_id& peer, const node_id& relay) {
  if (direct(peer) || relay_routes_.count(peer)) return;
  relay_routes_[peer] = relay;
  punch_pending_.erase(peer);
  {
    std::lock_guard lock(view_mu_);
    up_.insert(peer);
  }
  if (h_.on_peer_up) h_.on_peer_up(peer, peer_info{"via " + relay.short_string(), false, true, relay});
}

void endpoint_impl::relay_peer_down(const node_id& peer, const std::string& why) {
  if (!relay_routes_.erase(peer)) return;
  {
    std::lock_guard lock(view_mu_);
    up_.erase(peer);
    queued_.erase(peer);
  }
  log("peer " + peer.short_string() + " down: " + why);
  if (h_.on_peer_down) h_.on_peer_down(peer, why);
}

void endpoint_impl::on_relay_deliver(connection& relay, relay_envelope env) {
  const node_id relay_id = *relay.peer();
  auto plain = open_from(cfg_.id, env.peer, env.box);
  if (!plain) return log("dropped a relayed box from " + env.peer.short_string() + ": " + plain.error().message);
  switch (plain->kind) {
    case relay_kind::hello: {
      // Only a peer the rendezvous introduced us to may open a relayed session.
      auto pending = punch_pending_.find(env.peer);
      if (!direct(env.peer) && (pending == punch_pending_.end() || !(pending->second == relay_id)))
        return log("refused a relay session from " + env.peer.short_string() + ": not introduced by this relay");
      auto ack = seal_for(cfg_.id, env.peer, relay_plain{relay_kind::hello_ack, 0, {}});
      relay.queue_frame(frame_kind::relay_send, encode_relay({env.peer, std::move(ack)}));
      relay_peer_up(env.peer, relay_id);
      return;
    }
    case relay_kind::hello_ack: {
      auto pending = punch_pending_.find(env.peer);
      if (pending == punch_pending_.end() || !(pending->second == relay_id)) return;
      relay_peer_up(env.peer, relay_id);
      return;
    }
    case relay_kind::message: {
      auto route = relay_routes_.find(env.peer);
      if (route == relay_routes_.end() || !(route->second == relay_id)) return;
      if (h_.on_message) h_.on_message(env.peer, static_cast<channel>(plain->channel), std::move(plain->payload));
      return;
    }
  }
}

void endpoint_impl::start_relay(const node_id& target, const node_id& relay) {
  connection* r = direct(relay);
  if (!r) {
    if (h_.on_connect_failed) h_.on_connect_failed(target, "", "no direct path and the relay is gone");
    return;
  }
  punch_pending_[target] = relay;
  log("no direct path to " + target.short_string() + ": relaying through " + relay.short_string());
  auto hello = seal_for(cfg_.id, target, relay_plain{relay_kind::hello, 0, {}});
  r->queue_frame(frame_kind::relay_send, encode_relay({target, std::move(hello)}));
  need_write_ = true;
  schedule(now_ns() + static_cast<uint64_t>(cfg_.handshake_timeout.count()) * 1'000'000u, [this, target, relay] {
    if (direct(target) || relay_routes_.count(target)) return;
    punch_pending_.erase(target);
    if (h_.on_connect_failed) h_.on_connect_failed(target, "via " + relay.short_string(), "relay session got no answer");
  });
}

void endpoint_impl::start_dial(const node_id& expected, std::vector<std::string> addresses, uint64_t ts) {
  if (by_peer_.count(expected)) return;
  for (auto& c : conns_)
    if (!c->inbound() && c->peer() == expected && c->current_state() == connection::state::handshaking) return;
  std::string last_error = "no address given";
  for (size_t i = 0; i < addresses.size(); ++i) {
    auto a = parse_address(addresses[i]);
    if (!a) {
      last_error = a.error().message;
      continue;
    }
    auto dest = a->for_family(sock_.family());
    if (!dest) {
      last_error = dest.error().message;
      continue;
    }
    auto c = connection::make_client(*this, cfg_, *tls_, sock_.local(), *dest, expected, ts);
    if (!c) {
      last_error = c.error().message;
      continue;
    }
    (*c)->fallback_addresses.assign(addresses.begin() + static_cast<std::ptrdiff_t>(i) + 1, addresses.end());
    node_id target = expected;  // `expected` may point into dial_targets_, which this insert rehashes
    dial_targets_[c->get()] = target;
    conns_.push_back(std::move(*c));
    need_write_ = true;
    return;
  }
  if (h_.on_connect_failed) h_.on_connect_failed(expected, addresses.empty() ? "" : addresses.back(), last_error);
}

void endpoint_impl::write_all(uint64_t ts) {
  if (!flush_pending()) return;
  auto send = [this](const socket_address& to, const uint8_t* d, size_t n, size_t seg) { return send_bytes(to, d, n, seg); };
  for (auto& c : conns_) {
    if (!c->write(send, ts)) return;  // socket full: the rest waits for EPOLLOUT
  }
}

void endpoint_impl::reap() {
  uint64_t ts = now_ns();
  for (auto it = conns_.begin(); it != conns_.end();) {
    connection* c = it->get();
    auto s = c->current_state();
    bool ended = s == connection::state::closing || s == connection::state::draining || s == connection::state::closed;
    if (ended && !c->end_reported) {
      c->end_reported = true;
      bool quiet = quiet_.count(c) > 0;
      if (quiet && c->peer()) release(*c->peer(), c->outstanding_bytes());  // lost with the duplicate
      if (c->up_reported) {
        node_id id = *c->peer();
        by_peer_.erase(id);
        {
          std::lock_guard lock(view_mu_);
          up_.erase(id);
          queued_.erase(id);
        }
        log("peer " + id.short_string() + " down: " + c->end_reason());
        if (h_.on_peer_down) h_.on_peer_down(id, c->end_reason());
        std::vector<node_id> orphans;
        for (auto& [peer, relay] : relay_routes_)
          if (relay == id) orphans.push_back(peer);
        for (auto& p : orphans) relay_peer_down(p, "the relay " + id.short_string() + " went away");
      } else if (!quiet) {
        log("connection " + std::string(c->inbound() ? "from " : "to ") + c->remote().to_string() +
            " failed: " + c->end_reason());
        auto target = dial_targets_.find(c);
        auto punched = target == dial_targets_.end() ? punch_pending_.end() : punch_pending_.find(target->second);
        if (punched != punch_pending_.end() && !stopping_ && !direct(punched->first)) {
          node_id t = punched->first, relay = punched->second;
          start_relay(t, relay);
        } else if (!c->handshake_done() && target != dial_targets_.end() && !c->fallback_addresses.empty() && !stopping_) {
          node_id expected = target->second;
          start_dial(expected, c->fallback_addresses, ts);
        } else if (h_.on_connect_failed) {
          std::optional<node_id> who = c->peer();
          if (!who && target != dial_targets_.end()) who = target->second;
          h_.on_connect_failed(who, c->remote().to_string(), c->end_reason());
        }
      }
    }
    if (s == connection::state::closed) {
      for (auto cit = by_cid_.begin(); cit != by_cid_.end();) {
        if (cit->second == c) cit = by_cid_.erase(cit);
        else ++cit;
      }
      quiet_.erase(c);
      dial_targets_.erase(c);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void endpoint_impl::run() {
  epoll_event events[8];
  bool closing_all = false;
  uint64_t stop_deadline = 0;
  for (;;) {
    uint64_t next = UINT64_MAX;
    for (auto& c : conns_) next = std::min(next, c->expiry());
    for (auto& t : tasks_) next = std::min(next, t.first);
    uint64_t now = now_ns();
    int timeout = -1;
    if (next <= now || need_write_) {
      need_write_ = false;
      timeout = 0;
    } else {
      arm_timer(next);
    }
    if (closing_all) timeout = std::min<int>(timeout < 0 ? 10 : timeout, 10);
    int n = epoll_wait(epfd_, events, 8, timeout);
    uint64_t ts = now_ns();
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == eventfd_) {
        drain_commands();
      } else if (fd == timerfd_) {
        uint64_t v;
        [[maybe_unused]] auto r = ::read(timerfd_, &v, sizeof(v));
      } else if (fd == sock_.fd()) {
        if (events[i].events & EPOLLOUT) flush_pending();
        if (events[i].events & EPOLLIN) read_socket(ts);
      }
    }
    ts = now_ns();
    for (auto& c : conns_)
      if (c->expiry() <= ts) c->on_timer(ts);
    if (!tasks_.empty() && !stopping_) {
      std::vector<std::function<void()>> due;
      for (auto it = tasks_.begin(); it != tasks_.end();) {
        if (it->first <= ts) {
          due.push_back(std::move(it->second));
          it = tasks_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& fn : due) fn();
    }
    if (stopping_ && !closing_all) {
      // Graceful stop: CONNECTION_CLOSE to everyone, then leave (peers see a clean close, not
      // an idle timeout).
      closing_all = true;
      stop_deadline = ts + 200'000'000u;
      for (auto& c : conns_) c->close(close_code::shutting_down, "peer is shutting down");
    }
    write_all(ts);
    reap();
    publish_counters();
    if (closing_all) {
      bool all_sent = !blocked_;
      for (auto& c : conns_)
        if (c->current_state() == connection::state::handshaking || c->current_state() == connection::state::admitting ||
            c->current_state() == connection::state::admitted)
          all_sent = false;
      if (all_sent || ts >= stop_deadline) break;
    }
  }
  // Report the peers that were up as down, so the layer above sees a consistent end.
  for (auto& c : conns_) {
    if (c->up_reported && !c->end_reported && c->peer()) {
      c->end_reported = true;
      if (h_.on_peer_down) h_.on_peer_down(*c->peer(), "endpoint stopped");
    }
  }
  {
    std::lock_guard lock(view_mu_);
    up_.clear();
    queued_.clear();
  }
  conns_.clear();
  by_cid_.clear();
  by_peer_.clear();
}

// ---- endpoint ----

endpoint::endpoint(std::unique_ptr<endpoint_impl> impl) : impl_(std::move(impl)) {}
endpoint::~endpoint() { stop(); }

expected<std::unique_ptr<endpoint>> endpoint::start(endpoint_config config, handlers h) {
  auto impl = std::make_unique<endpoint_impl>(std::move(config), std::move(h));
  if (auto r = impl->init(); !r) return tl::unexpected(r.error());
  return std::unique_ptr<endpoint>(new endpoint(std::move(impl)));
}

uint16_t endpoint::port() const { return impl_->sock_.local().port(); }
node_id endpoint::id() const { return impl_->cfg_.id.id(); }

void endpoint::dial(const node_id& expected, std::vector<std::string> addresses) {
  impl_->post([impl = impl_.get(), expected, a = std::move(addresses)]() mutable {
    impl->start_dial(expected, std::move(a), now_ns());
  });
}

expected<void> endpoint::send(const node_id& peer, channel ch, std::vector<uint8_t> bytes) {
  uint64_t limit = ch == channel::control ? impl_->cfg_.limits.control
                   : ch == channel::bulk  ? impl_->cfg_.limits.bulk
                                          : impl_->cfg_.limits.heartbeat;
  if (bytes.size() > limit)
    return make_error(error_code::limit_exceeded, "message of " + std::to_string(bytes.size()) +
                                                      " bytes exceeds its channel's limit of " + std::to_string(limit));
  const uint64_t size = bytes.size();
  if (ch != channel::heartbeat) {
    std::lock_guard lock(impl_->view_mu_);
    if (!impl_->up_.count(peer))
      return make_error(error_code::network, "peer " + peer.short_string() + " is not connected");
    uint64_t& queued = impl_->queued_[peer];
    if (queued + size > impl_->cfg_.max_queued_bytes)
      return make_error(error_code::limit_exceeded, "send queue to " + peer.short_string() + " is full (" +
                                                        std::to_string(queued) +
                                                        " bytes not yet acknowledged); retry later");
    queued += size;
  } else {
    std::lock_guard lock(impl_->view_mu_);
    if (!impl_->up_.count(peer))
      return make_error(error_code::network, "peer " + peer.short_string() + " is not connected");
  }
  auto queue = [impl = impl_.get(), peer, ch, b = std::move(bytes)]() mutable {
    impl->need_write_ = true;
    if (connection* c = impl->direct(peer)) return c->queue(ch, std::move(b));
    // Relayed (or gone): the reservation ends here; the relay connection's own queue holds it.
    if (ch != channel::heartbeat) impl->release(peer, b.size());
    auto route = impl->relay_routes_.find(peer);
    if (route == impl->relay_routes_.end()) return;
    connection* relay = impl->direct(route->second);
    if (!relay) return;
    // Every channel becomes an ordered message on the relay's control stream, sealed for `peer`.
    auto box = seal_for(impl->cfg_.id, peer, relay_plain{relay_kind::message, static_cast<uint8_t>(ch), std::move(b)});
    auto env = encode_relay({peer, std::move(box)});
    if (env.size() <= impl->cfg_.limits.relay) relay->queue_frame(frame_kind::relay_send, env);
  };
  // From a callback (the I/O thread itself) the message is queued at once: a reply then leaves
  // in the same loop iteration instead of one eventfd round later.
  if (std::this_thread::get_id() == impl_->io_thread_id_)
    queue();
  else
    impl_->post(std::move(queue));
  return {};
}

std::optional<peer_stats> endpoint::stats(const node_id& peer) const {
  auto compute = [impl = impl_.get(), peer]() -> std::optional<peer_stats> {
    if (connection* c = impl->direct(peer)) return c->stats();
    auto route = impl->relay_routes_.find(peer);
    if (route == impl->relay_routes_.end()) return std::nullopt;
    connection* relay = impl->direct(route->second);
    if (!relay) return std::nullopt;
    peer_stats s = relay->stats();
    s.relayed = true;
    return s;
  };
  if (std::this_thread::get_id() == impl_->io_thread_id_) return compute();
  if (!impl_->thread_.joinable()) return std::nullopt;
  auto done = std::make_shared<std::promise<std::optional<peer_stats>>>();
  auto fut = done->get_future();
  impl_->post([compute, done] { done->set_value(compute()); });
  if (fut.wait_for(std::chrono::seconds(5)) != std::future_status::ready) return std::nullopt;
  return fut.get();
}

void endpoint::connect_via(const node_id& target, const node_id& rendezvous) {
  impl_->post([impl = impl_.get(), target, rendezvous] {
    if (impl->direct(target) || impl->relay_routes_.count(target)) return;
    connection* r = impl->direct(rendezvous);
    if (!r) {
      if (impl->h_.on_connect_failed)
        impl->h_.on_connect_failed(target, "", "rendezvous " + rendezvous.short_string() + " is not connected");
      return;
    }
    r->queue_frame(frame_kind::introduce, std::span<const uint8_t>(target.key.data(), target.key.size()));
  });
}

std::optional<std::string> endpoint::observed_address() const {
  std::lock_guard lock(impl_->view_mu_);
  return impl_->observed_;
}

endpoint_counters endpoint::counters() const {
  std::lock_guard lock(impl_->view_mu_);
  return impl_->counters_;
}

std::vector<node_id> endpoint::peers() const {
  std::lock_guard lock(impl_->view_mu_);
  return {impl_->up_.begin(), impl_->up_.end()};
}

void endpoint::disconnect(const node_id& peer) {
  impl_->post([impl = impl_.get(), peer] {
    if (connection* c = impl->direct(peer)) return c->close(close_code::none, "closed by the peer's application");
    impl->relay_peer_down(peer, "closed locally");
  });
}

void endpoint::stop() { impl_->stop(); }

}  // namespace mesh::transport
