// NAT traversal inside the endpoint: observed addresses, rendezvous introductions, hole
// punching and the sealed relay (wire formats and sealing in traversal.hpp).
#include "transport/endpoint_impl.hpp"

namespace mesh::transport {

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
      // Each introduction makes the target punch and dial: one a second per requester.
      const uint64_t now = now_ns();
      auto& last = last_introduction_[from];
      if (last != 0 && now - last < punch_interval_ns) {
        ++punches_refused_;
        return log_limited("refused an introduction for " + from.short_string() + ": more than one a second");
      }
      last = now;
      c.queue_frame(frame_kind::punch, encode_peer_address({*target, t->remote()}));
      t->queue_frame(frame_kind::punch, encode_peer_address({from, c.remote()}));
      return;
    }
    case frame_kind::punch: {  // from a rendezvous: punch now, the smaller id dials
      auto p = decode_peer_address(f.payload);
      if (!p) return log("peer " + from.short_string() + " sent a malformed punch frame");
      if (direct(p->id) || p->id == node_id{cfg_.id.public_key()}) return;
      // A punch sends packets to, and may dial, whatever address the rendezvous names: bounded so
      // that a member cannot use this node to reflect traffic at a third party. One session per
      // target at a time, at most max_punch_sessions at once, and a punch this node did not ask
      // for (connect_via) at most once a second per rendezvous.
      uint64_t now = now_ns();
      if (punch_pending_.count(p->id)) return;
      const uint64_t expiry = 3 * static_cast<uint64_t>(cfg_.handshake_timeout.count()) * 1'000'000u;
      std::erase_if(asked_introductions_, [&](const auto& kv) { return now - kv.second > expiry; });
      const bool asked = asked_introductions_.erase(p->id) > 0;
      if (!asked) {
        auto& last = last_unsolicited_punch_[from];
        if (last != 0 && now - last < punch_interval_ns) {
          ++punches_refused_;
          return log_limited("refused a punch from " + from.short_string() + ": more than one unasked punch a second");
        }
        last = now;
      }
      if (punch_pending_.size() >= max_punch_sessions) {
        ++punches_refused_;
        return log_limited("refused a punch from " + from.short_string() + ": " + std::to_string(max_punch_sessions) + " punch sessions under way");
      }
      punch_pending_[p->id] = from;
      // A burst, then a back-off: the peer's punch frame may arrive later than ours, and its
      // mapping towards us only opens when its own punch packets leave.
      for (uint64_t ms : {0u, 10u, 20u, 40u, 80u, 160u, 320u, 640u}) {
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
      // A sender faster than its target reads would pile up here without bound: once the boxes
      // from this sender not yet acknowledged by the target pass four control messages' worth,
      // the sender's connection is closed (visibly: its peers go down, rather than relayed
      // messages vanishing). Other senders' boxes and our own messages do not count.
      if (t->relayed_backlog(from) > 4 * cfg_.limits.control) {
        log("relay backlog to " + env->peer.short_string() + " is full; closing the connection to " + from.short_string());
        c.close(close_code::protocol_violation, "relay backlog to " + env->peer.short_string() + " exceeded " +
                                                     std::to_string((4 * cfg_.limits.control) >> 10) + " KiB");
        return;
      }
      if (h_.on_relay) h_.on_relay(from, env->peer, env->box);
      if (cfg_.replay_relayed) t->queue_relayed(from, encode_relay({from, env->box}));  // the test seam's replaying relay
      t->queue_relayed(from, encode_relay({from, std::move(env->box)}));
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

void endpoint_impl::relay_peer_down(const node_id& peer, const std::string& why, bool orderly) {
  if (!relay_routes_.erase(peer)) return;
  relay_sessions_.forget(peer);
  {
    std::lock_guard lock(view_mu_);
    up_.erase(peer);
    queued_.erase(peer);
  }
  log("peer " + peer.short_string() + " down: " + why);
  if (h_.on_peer_down) h_.on_peer_down(peer, {why, orderly});
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
      // The peer proves the mesh secret to us, not only to the relay (relay_sessions.hpp).
      auto answer = relay_sessions_.on_hello(env.peer, *plain);
      if (!answer) return log_limited("refused a relay session: " + answer.error().message);
      auto ack = seal_for(cfg_.id, env.peer, *answer);
      relay.queue_frame(frame_kind::relay_send, encode_relay({env.peer, std::move(ack)}));
      relay_peer_up(env.peer, relay_id);
      return;
    }
    case relay_kind::hello_ack: {
      auto pending = punch_pending_.find(env.peer);
      if (pending == punch_pending_.end() || !(pending->second == relay_id)) return;
      if (auto ok = relay_sessions_.on_ack(env.peer, *plain); !ok) return log_limited("refused a relay session: " + ok.error().message);
      relay_peer_up(env.peer, relay_id);
      return;
    }
    case relay_kind::message: {
      auto route = relay_routes_.find(env.peer);
      if (route == relay_routes_.end() || !(route->second == relay_id)) return;
      // Of the open session and not seen before: a box the relay recorded and sends again is refused.
      if (auto ok = relay_sessions_.accept(env.peer, *plain); !ok) {
        ++relay_refused_;
        return log_limited("dropped a relayed message: " + ok.error().message);
      }
      // Charged to the relay's connection, which carried it: its control credit is what holds
      // the relayed sender back.
      auto receipt = relay.charge(plain->payload.size());
      deliver(env.peer, static_cast<channel>(plain->channel), std::move(plain->payload), std::move(receipt));
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
  auto hello = seal_for(cfg_.id, target, relay_sessions_.hello(target));
  r->queue_frame(frame_kind::relay_send, encode_relay({target, std::move(hello)}));
  need_write_ = true;
  schedule(now_ns() + static_cast<uint64_t>(cfg_.handshake_timeout.count()) * 1'000'000u, [this, target, relay] {
    if (direct(target) || relay_routes_.count(target)) return;
    punch_pending_.erase(target);
    if (h_.on_connect_failed) h_.on_connect_failed(target, "via " + relay.short_string(), "relay session got no answer");
  });
}

}  // namespace mesh::transport
