#include "transport/endpoint_impl.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include <sodium.h>

namespace mesh::transport {

expected<void> endpoint_impl::init() {
  auto s = udp_socket::open(cfg_.bind, cfg_.port, cfg_.socket_buffer_bytes);
  if (!s) return tl::unexpected(s.error());
  sock_ = std::move(*s);
  randombytes_buf(retry_secret_.data(), retry_secret_.size());
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
  // A receipt released while its connection withholds credit posts one refresh (not one per
  // receipt) that gives every connection back what the releases made room for.
  releases_->wake = [this] {
    if (refresh_posted_) return;  // under releases_->mu
    refresh_posted_ = true;
    post([this] {
      {
        std::lock_guard lock(releases_->mu);
        refresh_posted_ = false;
      }
      for (auto& c : conns_) c->refresh_credit();
      need_write_ = true;  // credit goes out in the next write pass
    });
  };
  thread_ = std::thread([this] { run(); });
  io_thread_id_ = thread_.get_id();
  return {};
}

void endpoint_impl::post(std::function<void()> fn) {
  bool was_empty = false;
  {
    std::lock_guard lock(cmd_mu_);
    was_empty = cmds_.empty();
    cmds_.push_back(std::move(fn));
  }
  // One wake-up per batch, not per command: a non-empty queue has a wake-up pending already, or
  // the I/O thread has read the eventfd and is about to take the whole queue (drain_commands
  // reads the eventfd before it swaps the queue out). Saves a syscall per send() under load.
  if (!was_empty) return;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(eventfd_, &one, sizeof(one));
}

void endpoint_impl::stop() {
  {
    std::lock_guard lock(releases_->mu);  // receipts that outlive the endpoint wake nothing
    releases_->wake = nullptr;
  }
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
  // A timer already armed for this deadline or an earlier one stays: firing early costs one
  // idle loop pass, which then arms the real deadline, while re-arming on every pass cost a
  // syscall per message (each packet sent moves the loss-detection deadline a little later).
  if (at >= timer_armed_at_) return;
  timer_armed_at_ = at;
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
  accept_initial(from, data, len, ts);
}

void endpoint_impl::accept_initial(const socket_address& from, const uint8_t* data, size_t len, uint64_t ts) {
  const uint64_t lifetime_ns = static_cast<uint64_t>(cfg_.retry_token_lifetime.count()) * 1'000'000u;
  initial_check check = check_initial({data, len}, from, retry_secret_, lifetime_ns, ts);
  using kind = initial_check::kind;
  if (check.what == kind::not_initial) {  // not a valid Initial: stateless drop
    ++packets_dropped_;
    return;
  }
  if (check.what == kind::invalid_token) {
    gate_.on_invalid_token();
    log_limited("dropped an Initial from " + from.to_string() + ": its Retry token is invalid or expired");
    return;
  }
  const source_key src = source_key::of(from);
  const bool validated = check.what == kind::valid_token;
  if (validated && conns_.size() >= cfg_.max_connections) {
    gate_.on_table_full();
    log_limited("refused a connection from " + from.to_string() + ": " + std::to_string(conns_.size()) +
                " connections (max_connections)");
    return;
  }
  auto v = gate_.on_initial(src, validated, ts);
  if (v.what == inbound_gate::decision::retry) {
    // Address validation: the client must echo this token from the same address before it
    // gets any state here (RFC 9000 §8.1). A Retry is smaller than the Initial: no amplification.
    const size_t n = write_retry(retry_buf_, check.hd, from, retry_secret_, ts);
    if (n > 0 && send_bytes(from, retry_buf_.data(), n, n)) ++retries_sent_;
    return;
  }
  if (v.what == inbound_gate::decision::refuse) {
    // Dropped statelessly: the client retransmits, or gives up.
    log_limited("refused a connection from " + from.to_string() + " (" + std::to_string(gate_.half_open_from(src)) +
                " half-open from that source, " + std::to_string(half_open()) + " in all; counted in the endpoint's refused_* counters)");
    return;
  }
  if (v.evict) {
    for (auto& c : conns_) {
      if (handle_of(c.get()) != *v.evict) continue;
      c->abandon("dropped while half-open to make room for another source (" + std::to_string(half_open() + 1) +
                 " half-open connections, max_half_open " + std::to_string(cfg_.max_half_open) + ")");
      break;
    }
  }
  auto c = connection::make_server(*this, cfg_, *tls_, sock_.local(), from, check.hd,
                                   validated ? &check.odcid : nullptr, ts);
  if (!c) {
    log("cannot accept a connection from " + from.to_string() + ": " + c.error().message);
    return;
  }
  connection* raw = c->get();
  gate_.opened(src, handle_of(raw), ts);
  conns_.push_back(std::move(*c));
  raw->read(sock_.local(), from, data, len, ts);
}

void endpoint_impl::read_socket(uint64_t ts) {
  // A batch that comes back short found the socket empty: back to epoll (level-triggered),
  // without the extra receive call that would only say EAGAIN (a syscall per small message).
  std::array<udp_socket::received, rx_slots> got;
  for (int batch = 0; batch < 128; ++batch) {
    size_t n = sock_.receive_batch(rx_buf_.data(), rx_slot_size, rx_slots, got.data());
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* base = rx_buf_.data() + i * rx_slot_size;
      // With GRO one receive holds several datagrams of `segment` bytes each.
      for (size_t off = 0; off < got[i].len; off += got[i].segment)
        dispatch(got[i].from, base + off, std::min(got[i].segment, got[i].len - off), ts);
    }
    if (n < rx_slots) return;
  }
}

void endpoint_impl::on_admitted(connection& c) {
  if (c.inbound()) gate_.settled(handle_of(&c));
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
    // The loser is retired, not closed: messages already queued on it, and those the peer
    // sends on it before it has switched too, still arrive (connection::retire).
    bool local_smaller = node_id{cfg_.id.public_key()} < id;
    bool keep_new = local_smaller ? !c.inbound() : c.inbound();
    connection* loser = keep_new ? old : &c;
    quiet_.insert(loser);
    loser->retire(now_ns(), retire_timeout_ns);
    if (!keep_new) return;
    old->up_reported = false;
    c.up_reported = true;
    it->second = &c;
    // Messages sent from now on go to `c`, after everything queued on `old` (order kept).
    if (!old->all_acknowledged()) {
      c.hold_messages();
      held_behind_[&c] = old;
    }
    return;  // the peer stays up: no second on_peer_up
  }
  by_peer_[id] = &c;
  c.up_reported = true;
  punch_pending_.erase(id);
  // Tell the peer where its packets come from: behind a NAT that is its public mapping.
  c.queue_frame(frame_kind::observed_address, encode_address(c.remote()));
  if (replacing_.erase(id)) return;     // the peer never went down: this connection replaces its twin
  if (relay_routes_.erase(id)) return;  // was up through a relay: now direct, still the same peer
  {
    std::lock_guard lock(view_mu_);
    up_.insert(id);
  }
  if (h_.on_peer_up) h_.on_peer_up(id, peer_info{c.remote().to_string(), c.inbound(), false, std::nullopt});
}

void endpoint_impl::start_dial(const node_id& expected, std::vector<std::string> addresses, uint64_t ts) {
  if (by_peer_.count(expected)) return;
  // A dial already under way (handshake or admission) is not repeated: mDNS and peer exchange
  // often name the same peer at once, and two outbound connections to one peer were taken for a
  // copied identity, each side closing a different one (the demo's nodes then missed a peer).
  size_t dialing = 0;
  for (auto& c : conns_) {
    if (c->inbound()) continue;
    auto target = dial_targets_.find(c.get());
    const bool same = c->peer() == expected || (target != dial_targets_.end() && target->second == expected);
    const bool pending = c->current_state() == connection::state::handshaking || c->current_state() == connection::state::admitting;
    if (same && pending) return;
    dialing += pending;
  }
  // Dials are bounded like accepts: peer exchange names peers and addresses a remote node
  // chooses, and a flood of them must not grow the connection table or spray Initials.
  if (dialing >= cfg_.max_half_open || conns_.size() >= cfg_.max_connections) {
    if (h_.on_connect_failed)
      h_.on_connect_failed(expected, addresses.empty() ? "" : addresses.front(),
                           "not dialed: " + std::to_string(dialing) + " dials under way, " + std::to_string(conns_.size()) +
                               " connections (limits " + std::to_string(cfg_.max_half_open) + " and " +
                               std::to_string(cfg_.max_connections) + ")");
    return;
  }
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
  // This pass writes whatever was queued so far (a reply queued by a callback included): no
  // extra zero-timeout loop pass for it. What the socket refuses waits for EPOLLOUT.
  need_write_ = false;
  if (!flush_pending()) return;
  auto send = [this](const socket_address& to, const uint8_t* d, size_t n, size_t seg) { return send_bytes(to, d, n, seg); };
  for (auto& c : conns_) {
    if (!c->write(send, ts)) return;  // socket full: the rest waits for EPOLLOUT
  }
}

void endpoint_impl::advance_retirements(uint64_t ts) {
  for (auto& c : conns_) c->advance_retirement(ts);
  for (auto it = held_behind_.begin(); it != held_behind_.end();) {
    connection* twin = it->second;
    if (twin->ended() || twin->all_acknowledged()) {
      it->first->release_messages();
      need_write_ = true;
      it = held_behind_.erase(it);
    } else {
      ++it;
    }
  }
}

connection* endpoint_impl::retiring_twin(const node_id& id, const connection* c) const {
  for (auto& other : conns_) {
    if (other.get() == c || !other->retiring() || other->peer() != id) continue;
    if (other->current_state() == connection::state::admitted) return other.get();
  }
  return nullptr;
}

void endpoint_impl::reap() {
  uint64_t ts = now_ns();
  for (auto it = conns_.begin(); it != conns_.end();) {
    connection* c = it->get();
    if (c->ended() && !c->end_reported) {
      c->end_reported = true;
      if (c->inbound()) gate_.settled(handle_of(c));
      if (c->accept_timed_out()) ++accept_timeouts_;
      bool quiet = quiet_.count(c) > 0;
      if (quiet && c->peer()) release(*c->peer(), c->outstanding_bytes());  // lost with the duplicate
      if (c->up_reported && c->peer_closed_as_duplicate() && has_other_attempt(*c->peer(), c)) {
        // Simultaneous dials: the other side already chose the twin connection, which is still
        // being set up here. The peer stays up; messages queued on this one are lost.
        node_id id = *c->peer();
        by_peer_.erase(id);
        replacing_.insert(id);
        release(id, c->outstanding_bytes());
        log("peer " + id.short_string() + ": connection replaced by its simultaneous twin");
      } else if (connection* twin = c->up_reported ? retiring_twin(*c->peer(), c) : nullptr) {
        // The winner of a simultaneous dial ended while its twin was still being retired: the
        // twin carries the peer again (messages queued on the winner are lost with it).
        node_id id = *c->peer();
        release(id, c->outstanding_bytes());
        twin->unretire();
        quiet_.erase(twin);
        twin->up_reported = true;
        by_peer_[id] = twin;
        log("peer " + id.short_string() + ": connection ended (" + c->end_reason() + "); its retiring twin carries the peer again");
      } else if (c->up_reported) {
        node_id id = *c->peer();
        by_peer_.erase(id);
        last_unsolicited_punch_.erase(id);  // the rate limits' memory goes with the peer
        last_introduction_.erase(id);
        {
          std::lock_guard lock(view_mu_);
          up_.erase(id);
          queued_.erase(id);
        }
        log("peer " + id.short_string() + " down: " + c->end_reason());
        if (h_.on_peer_down) h_.on_peer_down(id, {c->end_reason(), c->orderly_end()});
        std::vector<node_id> orphans;
        for (auto& [peer, relay] : relay_routes_)
          if (relay == id) orphans.push_back(peer);
        for (auto& p : orphans) relay_peer_down(p, "the relay " + id.short_string() + " went away");
      } else if (!quiet) {
        const std::string line = "connection " + std::string(c->inbound() ? "from " : "to ") + c->remote().to_string() +
                                 " failed: " + c->end_reason();
        if (c->inbound()) log_limited(line);  // a stranger can make these at line rate
        else log(line);
        auto target = dial_targets_.find(c);
        std::optional<node_id> about = c->peer();
        if (!about && target != dial_targets_.end()) about = target->second;
        bool reported_down = false;
        if (about && replacing_.count(*about) && !has_other_attempt(*about, c)) {
          // The twin that was to replace a peer's connection failed: now the peer is down.
          replacing_.erase(*about);
          {
            std::lock_guard lock(view_mu_);
            up_.erase(*about);
            queued_.erase(*about);
          }
          if (h_.on_peer_down) h_.on_peer_down(*about, {c->end_reason(), false});
          reported_down = true;
        }
        auto punched = target == dial_targets_.end() ? punch_pending_.end() : punch_pending_.find(target->second);
        if (reported_down) {
          // nothing more to say about this attempt
        } else if (punched != punch_pending_.end() && !stopping_ && !direct(punched->first)) {
          node_id t = punched->first, relay = punched->second;
          start_relay(t, relay);
        } else if (!c->handshake_done() && target != dial_targets_.end() && !c->fallback_addresses.empty() && !stopping_) {
          node_id expected = target->second;
          start_dial(expected, c->fallback_addresses, ts);
        } else if (h_.on_connect_failed && (!c->inbound() || c->peer())) {
          // An inbound attempt that never showed a node key (a scan, garbage, an aborted TLS
          // handshake) is only logged: the layer above has no peer to attach it to.
          std::optional<node_id> who = c->peer();
          if (!who && target != dial_targets_.end()) who = target->second;
          h_.on_connect_failed(who, c->remote().to_string(), c->end_reason());
        }
      }
    }
    if (c->current_state() == connection::state::closed) {
      for (auto cit = by_cid_.begin(); cit != by_cid_.end();) {
        if (cit->second == c) cit = by_cid_.erase(cit);
        else ++cit;
      }
      quiet_.erase(c);
      dial_targets_.erase(c);
      held_behind_.erase(c);
      for (auto& [winner, twin] : held_behind_)
        if (twin == c) winner->release_messages();
      std::erase_if(held_behind_, [c](const auto& kv) { return kv.second == c; });
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void endpoint_impl::settle_timers() {
  // Writing sets ngtcp2's pacing deadline a few microseconds ahead (0.12 lets a packet go when
  // that deadline is within 1 ms, and cancels it once it is that close), so right after a write
  // a connection often reports a deadline already due. Handling it here saves a zero-timeout
  // epoll_wait pass per message sent; anything it makes sendable is written at once.
  const uint64_t ts = now_ns();
  bool fired = false;
  for (auto& c : conns_) {
    if (c->expiry() > ts) continue;
    c->on_timer(ts);
    fired = true;
  }
  if (fired) write_all(ts);
}

void endpoint_impl::run() {
  epoll_event events[8];
  bool closing_all = false;
  uint64_t stop_deadline = 0;
  for (;;) {
    uint64_t next = UINT64_MAX;
    for (auto& c : conns_) next = std::min(next, c->expiry());
    for (auto& t : tasks_) next = std::min(next, t.first);
    if (receive_buffers_.buffers() > 0) next = std::min(next, next_pool_trim_);  // wake to free them
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
        timer_armed_at_ = UINT64_MAX;  // fired: disarmed
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
      for (auto& c : conns_) c->close(close_code::shutting_down, shutdown_reason);
    }
    advance_retirements(ts);
    write_all(ts);
    settle_timers();
    reap();
    publish_counters();
    // Receive buffers not reused within 10 s go back to the system (the burst is over).
    if (ts >= next_pool_trim_) {
      receive_buffers_.release_older_than(std::chrono::steady_clock::now() - std::chrono::seconds(10));
      next_pool_trim_ = ts + 1'000'000'000u;
    }
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
      if (h_.on_peer_down) h_.on_peer_down(*c->peer(), {"endpoint stopped", true});
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

}  // namespace mesh::transport
