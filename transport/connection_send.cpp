// What a connection sends: queueing control frames, bulk messages and datagrams, the bulk
// scheduling and in-flight limit, the write loop that fills packets, acknowledgements, and the
// retirement of a duplicate connection. (connection.cpp has set-up, TLS, admission and what
// arrives.)
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include <algorithm>
#include <cstring>

#include "transport/connection.hpp"
#include "transport/connection_util.hpp"

namespace mesh::transport {

using detail::from_ngtcp2;
using detail::is_orderly;
using detail::liberr_text;

void connection::queue(channel ch, std::vector<uint8_t> bytes) {
  if (state_ != state::admitted) {
    if (ch != channel::heartbeat) owner_.on_released(*this, bytes.size());
    return;
  }
  switch (ch) {
    case channel::control: {
      auto f = encode_frame(frame_kind::control, bytes, cfg_.limits);
      if (!f) return owner_.on_released(*this, bytes.size());
      push_control(std::move(*f), {bytes.size(), std::nullopt});
      outstanding_ += bytes.size();
      break;
    }
    case channel::bulk: {
      // Its place among the control messages, for the receiver's inbox: a marker on the control
      // stream now, the message on the next bulk stream opened (streams open in queue order).
      auto marker = encode_frame(frame_kind::bulk_next, {}, cfg_.limits);
      push_control(std::move(*marker), {0, std::nullopt});
      outstanding_ += bytes.size();
      bulk_waiting_.push_back(std::move(bytes));
      break;
    }
    case channel::heartbeat: {
      auto f = encode_frame(frame_kind::heartbeat, bytes, cfg_.limits);
      if (f) datagrams_out_.push_back(std::move(*f));
      break;
    }
  }
}

void connection::push_control(std::vector<uint8_t> frame_bytes, control_chunk info) {
  control_total_ += frame_bytes.size();
  if (info.relayed_from) relayed_backlog_[*info.relayed_from] += frame_bytes.size();
  control_out_.push_back(std::move(frame_bytes));
  control_chunks_.push_back(std::move(info));
}

void connection::queue_frame(frame_kind kind, std::span<const uint8_t> payload) {
  if (state_ != state::admitted) return;
  auto f = encode_frame(kind, payload, cfg_.limits);
  if (f) push_control(std::move(*f), {});
}

void connection::queue_relayed(const node_id& from, std::span<const uint8_t> payload) {
  if (state_ != state::admitted) return;
  auto f = encode_frame(frame_kind::relay_deliver, payload, cfg_.limits);
  if (f) push_control(std::move(*f), {0, from});
}

void connection::retire(uint64_t ts, uint64_t timeout_ns) {
  retiring_ = true;
  retire_deadline_ = ts + timeout_ns;
}

void connection::unretire() {
  retiring_ = retire_sent_ = peer_retired_ = false;
}

void connection::advance_retirement(uint64_t ts) {
  if (!retiring_ || state_ != state::admitted || pending_close_) return;
  if (ts >= retire_deadline_) {
    close(close_code::duplicate, "duplicate connection closed: it did not drain in time (messages on it may be lost)");
    return;
  }
  if (!retire_sent_ && all_acknowledged()) {
    queue_frame(frame_kind::retire, {});
    retire_sent_ = true;
  }
  // Both ends have everything they sent here acknowledged, so nothing is lost by closing. The
  // peer may see this close before our retire frame: its copy of this connection is retiring
  // too, so for it the close is just as quiet.
  if (retire_sent_ && peer_retired_) close(close_code::duplicate, "duplicate connection retired after both ends drained it");
}

void connection::hold_messages() {
  if (!held_from_) held_from_ = control_total_;
}

void connection::on_acked(int64_t sid, uint64_t offset, uint64_t len) {
  acked_bytes_ += len;
  if (sid == control_sid_) {
    uint64_t end = offset + len;
    while (!control_out_.empty() && control_base_ + control_out_.front().size() <= end) {
      const uint64_t size = control_out_.front().size();
      control_base_ += size;
      control_out_.pop_front();
      const control_chunk info = std::move(control_chunks_.front());
      control_chunks_.pop_front();
      if (info.relayed_from) {
        auto it = relayed_backlog_.find(*info.relayed_from);
        if (it != relayed_backlog_.end() && (it->second -= std::min(it->second, size)) == 0) relayed_backlog_.erase(it);
      }
      release(info.app_bytes);
    }
    return;
  }
  // Bulk buffers are released when the stream closes (fully acknowledged).
}

void connection::open_bulk_streams() {
  while (!bulk_waiting_.empty()) {
    int64_t sid = -1;
    if (ngtcp2_conn_open_uni_stream(conn_, &sid, nullptr) != 0) return;  // peer's stream limit: later
    bulk_out b;
    b.payload = std::move(bulk_waiting_.front());
    bulk_waiting_.pop_front();
    b.header = *encode_frame_header(frame_kind::bulk, b.payload.size(), cfg_.limits);
    bulk_out_.emplace(sid, std::move(b));
  }
}

void connection::send_close_packet(const send_fn& send, uint64_t ts) {
  auto [code, reason] = *pending_close_;
  pending_close_.reset();
  ngtcp2_connection_close_error ccerr{};
  ngtcp2_connection_close_error_default(&ccerr);
  std::string phrase = reason.substr(0, 200);
  auto* rp = reinterpret_cast<const uint8_t*>(phrase.data());
  if (tls_alert_close_)
    ngtcp2_connection_close_error_set_transport_error_tls_alert(&ccerr, ngtcp2_conn_get_tls_alert(conn_), rp,
                                                               phrase.size());
  else if (transport_close_liberr_ != 0)
    ngtcp2_connection_close_error_set_transport_error_liberr(&ccerr, transport_close_liberr_, rp, phrase.size());
  else
    ngtcp2_connection_close_error_set_application_error(&ccerr, static_cast<uint64_t>(code), rp, phrase.size());
  set_end(state::closing, reason, !tls_alert_close_ && transport_close_liberr_ == 0 && is_orderly(static_cast<uint64_t>(code)));
  close_deadline_ = ts + 3 * ngtcp2_conn_get_pto(conn_);
  // An inbound connection that was never admitted (a stranger, a refused or timed-out attempt)
  // keeps no closing state: its close packet goes out once and the connection is freed at the
  // next timer pass, so refused attempts cannot pile up in the table while they linger.
  if (inbound_ && !peer_proof_ok_) close_deadline_ = ts;
  close_packet_.resize(std::max<size_t>(max_udp_payload_, 1452));
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi{};
  ngtcp2_ssize n = ngtcp2_conn_write_connection_close(conn_, &ps.path, &pi, close_packet_.data(),
                                                      close_packet_.size(), &ccerr, ts);
  if (n <= 0) {
    close_packet_.clear();
    return;
  }
  close_packet_.resize(static_cast<size_t>(n));
  bytes_sent_ += close_packet_.size();
  send(remote_, close_packet_.data(), close_packet_.size(), close_packet_.size());
}

std::map<int64_t, connection::bulk_out>::iterator connection::next_bulk_stream(const std::vector<int64_t>& blocked) {
  const auto usable = [&](const auto& kv) {
    return kv.second.sent < kv.second.total() && std::find(blocked.begin(), blocked.end(), kv.first) == blocked.end();
  };
  if (cfg_.bulk_scheduling == endpoint_config::bulk_order::oldest_first) {
    for (auto it = bulk_out_.begin(); it != bulk_out_.end(); ++it)  // streams open in send order
      if (usable(*it)) return it;
    return bulk_out_.end();
  }
  if (cfg_.bulk_scheduling == endpoint_config::bulk_order::shortest_first) {
    // The fewest bytes left, where messages within a quarter of that count as equally short
    // and the oldest of them (streams open in send order) goes first. Without the tolerance,
    // messages of nearly equal size (the pieces of an all-reduce differ by a few bytes) went
    // by those few bytes: a piece queued early could wait behind every later piece a byte
    // shorter, and the ring stalled on it for hundreds of milliseconds.
    uint64_t fewest = UINT64_MAX;
    for (const auto& kv : bulk_out_)
      if (usable(kv)) fewest = std::min(fewest, kv.second.total() - kv.second.sent);
    if (fewest == UINT64_MAX) return bulk_out_.end();
    const uint64_t equal_up_to = fewest + fewest / 4;
    for (auto it = bulk_out_.begin(); it != bulk_out_.end(); ++it)
      if (usable(*it) && it->second.total() - it->second.sent <= equal_up_to) return it;
    return bulk_out_.end();
  }
  auto it = bulk_out_.upper_bound(bulk_cursor_);  // round robin from the last stream served
  for (size_t n = 0; n < bulk_out_.size(); ++n, ++it) {
    if (it == bulk_out_.end()) it = bulk_out_.begin();
    if (usable(*it)) return it;
  }
  return bulk_out_.end();
}

bool connection::bulk_in_flight_full(uint64_t ts) {
  if (cfg_.bulk_in_flight_floor == 0) return false;
  ngtcp2_conn_stat cs;
  ngtcp2_conn_get_conn_stat(conn_, &cs);
  delivery_.sample(ts, acked_bytes_, cs.smoothed_rtt);
  const uint64_t floor = std::max<uint64_t>(cfg_.bulk_in_flight_floor, 16 * cs.max_tx_udp_payload_size);
  const uint64_t min_rtt = cs.min_rtt == UINT64_MAX ? 0 : cs.min_rtt;
  // 2 x bandwidth x delay (BBR's in-flight gain) lets a long fat path still fill its pipe; the
  // limit doubles each round trip (or two) while the measured rate keeps rising. It never
  // shrinks: the best rate only rises, and a lower minimum RTT is a better sample, not a
  // shorter path.
  const double bdp = static_cast<double>(delivery_.best_rate()) * static_cast<double>(min_rtt) / 1e9;
  bulk_limit_ = std::max({bulk_limit_, floor, static_cast<uint64_t>(2 * bdp)});
  return cs.bytes_in_flight >= bulk_limit_;
}

bool connection::write(const send_fn& send, uint64_t ts) {
  if (pending_close_ && !ended()) {
    send_close_packet(send, ts);
    return true;
  }
  if (ended()) return true;
  open_bulk_streams();

  const size_t max_pkt = ngtcp2_conn_get_path_max_tx_udp_payload_size(conn_);
  const size_t quantum = ngtcp2_conn_get_send_quantum(conn_);
  const size_t max_pkts = std::clamp<size_t>(quantum / max_pkt, 1, 64);
  std::vector<uint8_t>& buf = write_buf_;
  if (buf.size() < max_pkt * 64) buf.resize(max_pkt * 64);
  size_t pos = 0, pkts = 0;
  socket_address batch_to;
  std::vector<int64_t> blocked;  // streams ngtcp2 refused this round (flow control, shut)
  auto is_blocked = [&](int64_t sid) { return std::find(blocked.begin(), blocked.end(), sid) != blocked.end(); };
  bool ok = true;
  auto flush = [&] {
    if (pos == 0) return;
    bytes_sent_ += pos;
    if (!send(batch_to, buf.data(), pos, max_pkt)) ok = false;
    pos = 0;
    pkts = 0;
  };

  // A packet ngtcp2 just wrote at buf[pos] joins the GSO batch.
  auto append_packet = [&](const ngtcp2_path_storage& ps, ngtcp2_ssize n) {
    socket_address to = from_ngtcp2(ps.path.remote);
    if (pos > 0 && !(to == batch_to)) {
      // A packet for another path (migration, probing) cannot share the GSO batch.
      std::vector<uint8_t> pkt(buf.data() + pos, buf.data() + pos + n);
      flush();
      std::memcpy(buf.data(), pkt.data(), pkt.size());
    }
    batch_to = to;
    pos += static_cast<size_t>(n);
    ++pkts;
    // GSO needs equal-size segments: a short packet ends the batch.
    if (static_cast<size_t>(n) < max_pkt || pkts >= max_pkts) flush();
  };
  // A packet is being filled (ngtcp2 said WRITE_MORE): it must be finished before this returns,
  // or the next ngtcp2_conn_read_pkt aborts the process (PPE_PENDING assertion). With 64 KB
  // packets and many small messages the guard below can end the loop in the middle of one.
  bool filling = false;
  for (int guard = 0; guard < 4096 && ok; ++guard) {
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi{};
    ngtcp2_vec vec[3];
    size_t vcnt = 0;
    int64_t sid = -1;
    uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_MORE;
    bool is_datagram = false;

    // Priority: control messages, then heartbeats, then bulk streams round robin. A bulk
    // transfer therefore only ever fills space control and heartbeats left over.
    const uint64_t control_limit = held_from_ ? *held_from_ : control_total_;  // held messages wait
    if (control_sid_ >= 0 && control_sent_ < control_limit && !is_blocked(control_sid_)) {
      sid = control_sid_;
      uint64_t off = control_base_;
      for (auto& chunk : control_out_) {
        if (off >= control_limit) break;
        uint64_t end = off + chunk.size();
        if (end > control_sent_ && vcnt < 3) {
          size_t skip = static_cast<size_t>(control_sent_ > off ? control_sent_ - off : 0);
          vec[vcnt++] = {chunk.data() + skip, chunk.size() - skip};
        }
        off = end;
        if (vcnt == 3) break;
      }
    } else if (!datagrams_out_.empty() && state_ == state::admitted) {
      is_datagram = true;
    } else if (auto next = next_bulk_stream(blocked); next != bulk_out_.end() && !held_from_ && !bulk_in_flight_full(ts)) {
      auto& b = next->second;
      sid = next->first;
      if (b.sent < b.header.size)
        vec[vcnt++] = {const_cast<uint8_t*>(b.header.bytes.data()) + b.sent, b.header.size - b.sent};
      size_t poff = static_cast<size_t>(b.sent > b.header.size ? b.sent - b.header.size : 0);
      if (poff < b.payload.size()) vec[vcnt++] = {b.payload.data() + poff, b.payload.size() - poff};
      flags |= NGTCP2_WRITE_STREAM_FLAG_FIN;
      bulk_cursor_ = sid;
    }

    ngtcp2_ssize datalen = -1;
    ngtcp2_ssize n;
    int accepted = 0;
    if (is_datagram) {
      auto& d = datagrams_out_.front();
      ngtcp2_vec dv{d.data(), d.size()};
      n = ngtcp2_conn_writev_datagram(conn_, &ps.path, &pi, buf.data() + pos, max_pkt, &accepted,
                                      NGTCP2_WRITE_DATAGRAM_FLAG_MORE, 0, &dv, 1, ts);
      if (accepted || n == NGTCP2_ERR_INVALID_ARGUMENT) datagrams_out_.pop_front();  // too big for the peer: dropped
      if (n == NGTCP2_ERR_INVALID_ARGUMENT) continue;
    } else {
      n = ngtcp2_conn_writev_stream(conn_, &ps.path, &pi, buf.data() + pos, max_pkt, &datalen, flags, sid,
                                    vcnt ? vec : nullptr, vcnt, ts);
    }
    if (n < 0) {
      if (n == NGTCP2_ERR_STREAM_DATA_BLOCKED || n == NGTCP2_ERR_STREAM_SHUT_WR ||
          n == NGTCP2_ERR_STREAM_NOT_FOUND) {
        blocked.push_back(sid);
        continue;
      }
      if (n == NGTCP2_ERR_WRITE_MORE) {
        filling = true;
        if (!is_datagram && sid >= 0 && datalen > 0) {
          if (sid == control_sid_) control_sent_ += static_cast<uint64_t>(datalen);
          else bulk_out_[sid].sent += static_cast<uint64_t>(datalen);
        }
        continue;
      }
      pending_close_ = {close_code::protocol_violation, "QUIC write error: " + liberr_text(static_cast<int>(n))};
      transport_close_liberr_ = static_cast<int>(n);
      flush();
      return ok;
    }
    if (!is_datagram && sid >= 0 && datalen > 0) {
      if (sid == control_sid_) control_sent_ += static_cast<uint64_t>(datalen);
      else bulk_out_[sid].sent += static_cast<uint64_t>(datalen);
    }
    filling = false;
    if (n == 0) break;  // congestion window, pacing or nothing left
    append_packet(ps, n);
  }
  if (filling && ok) {
    // Close the packet being filled: no more data, no MORE flag.
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi{};
    const ngtcp2_ssize n = ngtcp2_conn_writev_stream(conn_, &ps.path, &pi, buf.data() + pos, max_pkt, nullptr,
                                                     NGTCP2_WRITE_STREAM_FLAG_NONE, -1, nullptr, 0, ts);
    if (n > 0) append_packet(ps, n);
  }
  flush();
  // ngtcp2 0.12.1 paces from initial_rtt before it has any sample, which delays the handshake
  // by tens of milliseconds; pacing starts once a real RTT sample exists (fixed upstream in 1.0).
  ngtcp2_conn_stat cstat;
  ngtcp2_conn_get_conn_stat(conn_, &cstat);
  if (cstat.first_rtt_sample_ts != UINT64_MAX) ngtcp2_conn_update_pkt_tx_time(conn_, ts);
  return ok;
}

}  // namespace mesh::transport
