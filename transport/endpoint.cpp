#include "transport/endpoint.hpp"

#include <future>

#include "transport/endpoint_impl.hpp"

namespace mesh::transport {

endpoint::endpoint(std::unique_ptr<endpoint_impl> impl) : impl_(std::move(impl)) {}
endpoint::~endpoint() { stop(); }

expected<std::unique_ptr<endpoint>> endpoint::start(endpoint_config config, handlers h) {
  auto impl = std::make_unique<endpoint_impl>(std::move(config), std::move(h));
  if (auto r = impl->init(); !r) return tl::unexpected(r.error());
  return std::unique_ptr<endpoint>(new endpoint(std::move(impl)));
}

uint16_t endpoint::port() const { return impl_->sock_.local().port(); }
node_id endpoint::id() const { return impl_->cfg_.id.id(); }

bool endpoint::can_reach(const std::string& address) const {
  auto a = parse_address(address);
  return a && a->for_family(impl_->sock_.family()).has_value();
}

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
    auto plain = impl->relay_sessions_.seal(peer, static_cast<uint8_t>(ch), std::move(b));
    if (!plain) return;  // the session went down meanwhile
    auto box = seal_for(impl->cfg_.id, peer, *plain);
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

bool endpoint::connected(const node_id& peer) const {
  std::lock_guard lock(impl_->view_mu_);
  return impl_->up_.count(peer) > 0;
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
    impl->asked_introductions_[target] = now_ns();  // its punch frame is one we asked for
    r->queue_frame(frame_kind::introduce, std::span<const uint8_t>(target.key.data(), target.key.size()));
  });
}

void endpoint::recycle(std::vector<uint8_t> buffer) { impl_->receive_buffers_.give(std::move(buffer)); }

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
    if (connection* c = impl->direct(peer)) return c->close(close_code::closed_by_application, "closed by the peer's application");
    impl->relay_peer_down(peer, "closed locally", true);
  });
}

void endpoint::stop() { impl_->stop(); }

}  // namespace mesh::transport
