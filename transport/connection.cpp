#include "transport/connection.hpp"

#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "transport/admission.hpp"

namespace mesh::transport {

namespace {
/// The peer's bulk streams are its unidirectional streams after its control stream, opened in the
/// order it queued the messages: stream id n is its (n >> 2)-th unidirectional stream, and bulk
/// message number (n >> 2) - 1.
uint64_t bulk_ordinal(int64_t sid) { return (static_cast<uint64_t>(sid) >> 2) - 1; }


/// Complete messages a peer may get us to hold before its admission proof arrives (they can
/// only overtake the proof when its packet is lost; more than this is not a race).
constexpr uint64_t held_before_admission_limit = 64u << 20;

constexpr size_t cid_len = 18;
constexpr uint64_t ns_per_ms = 1'000'000;

ngtcp2_path make_path(const socket_address& local, const socket_address& remote) {
  ngtcp2_path p{};
  p.local.addr = const_cast<sockaddr*>(local.get());
  p.local.addrlen = local.len;
  p.remote.addr = const_cast<sockaddr*>(remote.get());
  p.remote.addrlen = remote.len;
  return p;
}

socket_address from_ngtcp2(const ngtcp2_addr& a) {
  socket_address s;
  std::memcpy(&s.storage, a.addr, a.addrlen);
  s.len = a.addrlen;
  return s;
}

void random_cid(ngtcp2_cid* cid, size_t len) {
  cid->datalen = len;
  randombytes_buf(cid->data, len);
}

std::string liberr_text(int rv) { return ngtcp2_strerror(rv); }

}  // namespace

// ngtcp2 calls plain C functions; these forward to the connection (user_data).
struct connection_callbacks {
  static connection& self(void* user_data) { return *static_cast<connection*>(user_data); }

  static void rand(uint8_t* dest, size_t len, const ngtcp2_rand_ctx*) { randombytes_buf(dest, len); }

  static int get_new_connection_id(ngtcp2_conn*, ngtcp2_cid* cid, uint8_t* token, size_t len, void* ud) {
    random_cid(cid, len);
    // Stateless reset tokens are never honoured by this endpoint's peers in practice (we send
    // no stateless resets), but QUIC requires one per connection id.
    randombytes_buf(token, NGTCP2_STATELESS_RESET_TOKENLEN);
    self(ud).owner_.on_cid_added(self(ud), *cid);
    return 0;
  }

  static int remove_connection_id(ngtcp2_conn*, const ngtcp2_cid* cid, void* ud) {
    self(ud).owner_.on_cid_removed(self(ud), *cid);
    return 0;
  }

  static int handshake_completed(ngtcp2_conn*, void* ud) {
    try {
      self(ud).on_handshake_completed();
    } catch (const std::exception& e) {
      self(ud).close(close_code::admission_refused, std::string("admission failed: ") + e.what());
    }
    return 0;
  }

  static int recv_stream_data(ngtcp2_conn* conn, uint32_t flags, int64_t sid, uint64_t, const uint8_t* data,
                              size_t len, void* ud, void*) {
    connection& c = self(ud);
    expected<uint64_t> r = len;
    // No exception may unwind through ngtcp2's C frames (an allocation failure for a huge
    // message, or a throwing handler): it closes this connection instead.
    try {
      if (c.remote_stream_is_control(sid)) {
        if (auto e = c.on_control_data(data, len); !e) r = tl::unexpected(e.error());
      } else {
        r = c.on_bulk_data(sid, data, len, flags & NGTCP2_STREAM_DATA_FLAG_FIN);
      }
    } catch (const std::exception& e) {
      r = make_error(error_code::internal, std::string("cannot take the peer's data: ") + e.what());
    }
    if (!r) {
      c.close(close_code::protocol_violation, r.error().message);
      return 0;
    }
    // Everything received is consumed at once (decoded into memory), so connection credit goes
    // back now; stream credit as on_bulk_data says (held while a message waits for budget).
    if (*r) ngtcp2_conn_extend_max_stream_offset(conn, sid, *r);
    // Before admission connection credit is held too, so a peer that has not proven anything
    // can make us hold at most one connection window (its proof needs none: it goes first).
    if (c.state_ == connection::state::admitted)
      ngtcp2_conn_extend_max_offset(conn, len);
    else
      c.uncredited_before_admission_ += len;
    return 0;
  }

  static int acked_stream_data_offset(ngtcp2_conn*, int64_t sid, uint64_t offset, uint64_t len, void* ud, void*) {
    self(ud).on_acked(sid, offset, len);
    return 0;
  }

  // Both may hand budget to a waiting message, which reserves its buffer: no exception may
  // unwind through ngtcp2's C frames, so a failure closes the connection instead.
  static int stream_close(ngtcp2_conn* conn, uint32_t, int64_t sid, uint64_t, void* ud, void*) {
    try {
      if (!ngtcp2_conn_is_local_stream(conn, sid)) self(ud).credit_remote_stream(sid);
      self(ud).on_stream_closed(sid);
    } catch (const std::exception& e) {
      self(ud).close(close_code::protocol_violation, std::string("stream close failed: ") + e.what());
    }
    return 0;
  }

  static int lost_datagram(ngtcp2_conn*, uint64_t, void* ud) {
    ++self(ud).lost_datagrams_;
    return 0;
  }

  static int stream_reset(ngtcp2_conn* conn, int64_t sid, uint64_t, uint64_t, void* ud, void*) {
    // A peer's bulk stream holds a place in the order of its messages: reset before it is
    // complete, everything the peer sent after it could never be handed over. (Our own sender
    // never resets a stream.)
    if (!ngtcp2_conn_is_local_stream(conn, sid) && !self(ud).remote_stream_is_control(sid) &&
        self(ud).inbox_.expects(bulk_ordinal(sid))) {
      self(ud).close(close_code::protocol_violation, "peer reset its bulk stream " + std::to_string(sid) +
                                                         " before the message was complete: later messages could not be delivered in order");
      return 0;
    }
    try {
      self(ud).bulk_rx_.forget(sid);
      self(ud).apply_bulk_grants();
      if (!ngtcp2_conn_is_local_stream(conn, sid)) self(ud).credit_remote_stream(sid);
    } catch (const std::exception& e) {
      self(ud).close(close_code::protocol_violation, std::string("stream reset failed: ") + e.what());
    }
    return 0;
  }

  static int recv_datagram(ngtcp2_conn*, uint32_t flags, const uint8_t* data, size_t len, void* ud) {
    try {
      return recv_datagram_unguarded(flags, data, len, ud);
    } catch (const std::exception& e) {
      self(ud).close(close_code::protocol_violation, std::string("cannot take the peer's datagram: ") + e.what());
      return 0;
    }
  }

  static int recv_datagram_unguarded(uint32_t, const uint8_t* data, size_t len, void* ud) {
    connection& c = self(ud);
    auto f = decode_single_frame({data, len}, c.cfg_.limits);
    if (!f || f->kind != frame_kind::heartbeat) {
      c.close(close_code::protocol_violation, "malformed datagram frame");
      return 0;
    }
    // Datagrams are unreliable: one that overtakes admission is simply dropped.
    if (c.state_ == connection::state::admitted) c.owner_.on_message(c, channel::heartbeat, std::move(f->payload));
    return 0;
  }
};

ngtcp2_callbacks connection::callbacks(bool server) {
  ngtcp2_callbacks cb{};
  if (server) {
    cb.recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  } else {
    cb.client_initial = ngtcp2_crypto_client_initial_cb;
    cb.recv_retry = ngtcp2_crypto_recv_retry_cb;
  }
  cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb.encrypt = ngtcp2_crypto_encrypt_cb;
  cb.decrypt = ngtcp2_crypto_decrypt_cb;
  cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb.update_key = ngtcp2_crypto_update_key_cb;
  cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb.rand = connection_callbacks::rand;
  cb.get_new_connection_id = connection_callbacks::get_new_connection_id;
  cb.remove_connection_id = connection_callbacks::remove_connection_id;
  cb.handshake_completed = connection_callbacks::handshake_completed;
  cb.recv_stream_data = connection_callbacks::recv_stream_data;
  cb.acked_stream_data_offset = connection_callbacks::acked_stream_data_offset;
  cb.stream_close = connection_callbacks::stream_close;
  cb.stream_reset = connection_callbacks::stream_reset;
  cb.recv_datagram = connection_callbacks::recv_datagram;
  cb.lost_datagram = connection_callbacks::lost_datagram;
  return cb;
}

ngtcp2_conn* connection::get_conn(ngtcp2_crypto_conn_ref* ref) {
  return static_cast<connection*>(ref->user_data)->conn_;
}

connection::connection(connection_owner& owner, const endpoint_config& cfg, bool inbound, const socket_address& remote)
    : owner_(owner),
      cfg_(cfg),
      inbound_(inbound),
      control_in_(cfg.limits),
      bulk_rx_({cfg.limits, cfg.bulk_receive_budget, cfg.stream_window, &owner.receive_buffers()}),
      // Finished messages waiting for an earlier one get a budget of their own, as large as the
      // receive budget of unfinished ones (which is never below the largest message allowed).
      inbox_(std::max(cfg.bulk_receive_budget, cfg.limits.bulk)) {
  remote_ = remote;
  max_udp_payload_ = remote.is_loopback() && cfg.loopback_udp_payload > 0
                         ? std::max(cfg.max_udp_payload, cfg.loopback_udp_payload)
                         : cfg.max_udp_payload;
  conn_ref_.get_conn = &connection::get_conn;
  conn_ref_.user_data = this;
}

connection::~connection() {
  if (conn_) ngtcp2_conn_del(conn_);
  free_tls_session(tls_);
}

namespace {

void fill_settings(ngtcp2_settings& s, size_t max_udp_payload, const endpoint_config& cfg, uint64_t ts) {
  ngtcp2_settings_default(&s);
  s.initial_ts = ts;
  s.max_tx_udp_payload_size = max_udp_payload;
  // Without this ngtcp2 shapes packets down to 1200 B until PMTUD probes up (0.12 probes only
  // up to ~1500): loopback paths and meshes that ask for bigger packets want them from the start.
  if (max_udp_payload > 1452) s.no_tx_udp_payload_size_shaping = 1;
  s.handshake_timeout = static_cast<uint64_t>(cfg.handshake_timeout.count()) * ns_per_ms;
  s.max_window = cfg.connection_window * 4;
  s.max_stream_window = cfg.stream_window * 4;
  switch (cfg.congestion_control) {
    case endpoint_config::congestion::cubic: s.cc_algo = NGTCP2_CC_ALGO_CUBIC; break;
    case endpoint_config::congestion::bbr: s.cc_algo = NGTCP2_CC_ALGO_BBR; break;
    case endpoint_config::congestion::bbr2: s.cc_algo = NGTCP2_CC_ALGO_BBR2; break;
  }
}

void fill_params(ngtcp2_transport_params& p, const endpoint_config& cfg) {
  ngtcp2_transport_params_default(&p);
  p.initial_max_stream_data_uni = cfg.stream_window;
  p.initial_max_data = cfg.connection_window;
  p.initial_max_streams_uni = 128;
  p.initial_max_streams_bidi = 0;  // this protocol uses unidirectional streams only
  p.max_idle_timeout = static_cast<uint64_t>(cfg.idle_timeout.count()) * ns_per_ms;
  p.max_datagram_frame_size = 65535;
  p.active_connection_id_limit = 4;
}

}  // namespace

expected<void> connection::init_tls(const tls_context& tls, bool server) {
  auto s = make_tls_session(tls, server, &conn_ref_, &check_);
  if (!s) return tl::unexpected(s.error());
  tls_ = *s;
  ngtcp2_conn_set_tls_native_handle(conn_, tls_);
  ngtcp2_conn_set_keep_alive_timeout(conn_, static_cast<uint64_t>(cfg_.keep_alive.count()) * ns_per_ms);
  return {};
}

expected<std::unique_ptr<connection>> connection::make_client(connection_owner& owner, const endpoint_config& cfg,
                                                              const tls_context& tls, const socket_address& local,
                                                              const socket_address& remote, const node_id& expected,
                                                              uint64_t ts) {
  std::unique_ptr<connection> c(new connection(owner, cfg, false, remote));
  c->check_.expected = expected;
  c->local_ = local;
  ngtcp2_cid dcid{}, scid{};
  random_cid(&dcid, cid_len);
  random_cid(&scid, cid_len);
  ngtcp2_settings settings;
  fill_settings(settings, c->max_udp_payload_, cfg, ts);
  ngtcp2_transport_params params;
  fill_params(params, cfg);
  auto path = make_path(c->local_, c->remote_);
  auto cb = callbacks(false);
  int rv = ngtcp2_conn_client_new(&c->conn_, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &cb, &settings, &params,
                                  nullptr, c.get());
  if (rv != 0) return make_error(error_code::internal, "ngtcp2_conn_client_new: " + liberr_text(rv));
  if (auto r = c->init_tls(tls, false); !r) return tl::unexpected(r.error());
  owner.on_cid_added(*c, scid);
  return c;
}

expected<std::unique_ptr<connection>> connection::make_server(connection_owner& owner, const endpoint_config& cfg,
                                                              const tls_context& tls, const socket_address& local,
                                                              const socket_address& remote, const ngtcp2_pkt_hd& hd,
                                                              uint64_t ts) {
  std::unique_ptr<connection> c(new connection(owner, cfg, true, remote));
  c->local_ = local;
  ngtcp2_cid scid{};
  random_cid(&scid, cid_len);
  ngtcp2_settings settings;
  fill_settings(settings, c->max_udp_payload_, cfg, ts);
  ngtcp2_transport_params params;
  fill_params(params, cfg);
  params.original_dcid = hd.dcid;
  auto path = make_path(c->local_, c->remote_);
  auto cb = callbacks(true);
  int rv = ngtcp2_conn_server_new(&c->conn_, &hd.scid, &scid, &path, hd.version, &cb, &settings, &params, nullptr,
                                  c.get());
  if (rv != 0) return make_error(error_code::internal, "ngtcp2_conn_server_new: " + liberr_text(rv));
  if (auto r = c->init_tls(tls, true); !r) return tl::unexpected(r.error());
  // The client keeps addressing its first packets to the id it made up.
  owner.on_cid_added(*c, hd.dcid);
  owner.on_cid_added(*c, scid);
  return c;
}

bool connection::remote_stream_is_control(int64_t sid) const {
  // Each side opens its control stream first, so it is that side's first unidirectional
  // stream: 2 when the client opened it, 3 when the server did (RFC 9000 §2.1).
  return sid == (inbound_ ? 2 : 3);
}

namespace {
bool is_orderly(uint64_t code) {
  return code == static_cast<uint64_t>(close_code::shutting_down) ||
         code == static_cast<uint64_t>(close_code::closed_by_application);
}
}  // namespace

void connection::set_end(state s, std::string reason, bool orderly) {
  if (ended()) {
    if (s == state::closed) state_ = s;
    return;
  }
  state_ = s;
  if (end_reason_.empty()) {
    end_reason_ = std::move(reason);
    orderly_end_ = orderly;
  }
}

void connection::on_handshake_completed() {
  handshake_done_ = true;
  if (!check_.peer) {
    close(close_code::admission_refused, "peer presented no node key");
    return;
  }
  auto exporter = admission_exporter(tls_);
  if (!exporter) {
    close(close_code::admission_refused, exporter.error().message);
    return;
  }
  int rv = ngtcp2_conn_open_uni_stream(conn_, &control_sid_, nullptr);
  if (rv != 0) {
    close(close_code::protocol_violation, "cannot open the control stream: " + liberr_text(rv));
    return;
  }
  admission_binding b{*exporter, node_id{cfg_.id.public_key()}, *check_.peer, cfg_.protocol_version};
  auto proof = make_admission_proof(cfg_.mesh_secret, b);
  auto f = encode_frame(frame_kind::admission, proof, cfg_.limits);
  if (cfg_.send_admission_proof) push_control(std::move(*f), {});
  state_ = state::admitting;
  // A peer that finished TLS but never proves itself must not hold the connection (and what it
  // sent) for ever: it gets as long as a handshake.
  admission_deadline_ = last_read_ts_ + static_cast<uint64_t>(cfg_.handshake_timeout.count()) * ns_per_ms;
  if (!early_control_.empty()) {
    auto early = std::move(early_control_);
    early_control_.clear();
    if (auto r = on_control_data(early.data(), early.size()); !r)
      close(close_code::protocol_violation, r.error().message);
  }
}

expected<void> connection::on_control_data(const uint8_t* data, size_t len) {
  if (!handshake_done_) {
    if (early_control_.size() + len > 4096)
      return make_error(error_code::limit_exceeded, "too much control data before the handshake finished");
    early_control_.insert(early_control_.end(), data, data + len);
    return {};
  }
  std::vector<frame> frames;
  auto r = control_in_.feed({data, len}, frames);
  for (auto& f : frames) {
    if (state_ == state::closing || state_ == state::closed || pending_close_) break;
    if (auto h = handle_control_frame(std::move(f)); !h) return h;
  }
  if (!r) return make_error(r.error().code, "control stream: " + r.error().message);
  return {};
}

expected<void> connection::handle_control_frame(frame f) {
  if (!cfg_.send_admission_proof) return {};  // the test seam's mute peer says and admits nothing
  if (!peer_proof_ok_) {
    if (f.kind != frame_kind::admission)
      return make_error(error_code::decode_error, "peer sent a message before its admission proof");
    auto exporter = admission_exporter(tls_);
    if (!exporter) return tl::unexpected(exporter.error());
    admission_binding b{*exporter, *check_.peer, node_id{cfg_.id.public_key()}, cfg_.protocol_version};
    if (auto v = verify_admission_proof(f.payload, cfg_.mesh_secret, b); !v) {
      close(close_code::admission_refused, "admission refused: " + v.error().message);
      return {};
    }
    peer_proof_ok_ = true;
    state_ = state::admitted;
    admission_deadline_ = UINT64_MAX;
    owner_.on_admitted(*this);
    held_bytes_ = 0;  // bulk messages that came before the proof wait in the inbox for their markers
    ngtcp2_conn_extend_max_offset(conn_, uncredited_before_admission_);
    uncredited_before_admission_ = 0;
    bulk_rx_.admit();  // messages that arrived before the proof waited for budget
    apply_bulk_grants();
    return {};
  }
  std::vector<ordered_inbox::message> ready;
  switch (f.kind) {
    case frame_kind::control:
      if (auto ok = inbox_.on_control(std::move(f.payload), ready); !ok) return ok;
      deliver(std::move(ready));
      return {};
    case frame_kind::bulk_next:
      if (auto ok = inbox_.on_bulk_marker(ready); !ok) return ok;
      deliver(std::move(ready));
      return {};
    case frame_kind::observed_address:
    case frame_kind::introduce:
    case frame_kind::punch:
    case frame_kind::relay_send:
    case frame_kind::relay_deliver: owner_.on_traversal_frame(*this, std::move(f)); return {};
    case frame_kind::retire: peer_retired_ = true; return {};
    default: return make_error(error_code::decode_error, "unexpected frame kind on the control stream");
  }
}

expected<uint64_t> connection::on_bulk_data(int64_t sid, const uint8_t* data, size_t len, bool fin) {
  if (ngtcp2_conn_is_local_stream(conn_, sid))
    return make_error(error_code::decode_error, "data on a stream this side opened");
  auto r = bulk_rx_.on_data(sid, {data, len}, fin);
  apply_bulk_grants();  // the end of this message may have made room for waiting ones
  if (!r) return tl::unexpected(r.error());
  // The whole stream is read. ngtcp2 0.12 does not close a peer's unidirectional stream on its
  // own here (stream_close never fired for them), so its credit goes back now; without this a
  // peer could open only initial_max_streams_uni (128) bulk streams per connection, ever.
  if (fin) credit_remote_stream(sid);
  if (!r->message) return r->credit;
  if (state_ != state::admitted) {
    // Overtook the proof (its packet was lost); it waits in the inbox for its marker, which
    // comes after the proof. A peer that keeps sending without proving anything is cut off.
    held_bytes_ += r->message->size();
    if (held_bytes_ > held_before_admission_limit)
      return make_error(error_code::limit_exceeded, "peer sent more than " + std::to_string(held_before_admission_limit >> 20) +
                                                        " MiB of messages before its admission proof");
  }
  std::vector<ordered_inbox::message> ready;
  if (auto ok = inbox_.on_bulk(bulk_ordinal(sid), std::move(*r->message), ready); !ok) return tl::unexpected(ok.error());
  deliver(std::move(ready));
  return r->credit;
}

void connection::apply_bulk_grants() {
  for (const auto& [sid, credit] : bulk_rx_.take_grants()) ngtcp2_conn_extend_max_stream_offset(conn_, sid, credit);
}

void connection::deliver(std::vector<ordered_inbox::message> messages) {
  for (auto& m : messages) {
    if (state_ == state::closing || state_ == state::closed || pending_close_) return;
    owner_.on_message(*this, m.bulk ? channel::bulk : channel::control, std::move(m.bytes));
  }
}

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

void connection::close(close_code code, std::string reason) {
  if (ended() || pending_close_) return;
  pending_close_ = {code, std::move(reason)};
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

void connection::credit_remote_stream(int64_t sid) {
  if (!credited_.insert(sid).second) return;
  ngtcp2_conn_extend_max_streams_uni(conn_, 1);
  // Stream ids only grow: forget old ones so the set stays small.
  while (credited_.size() > 4096) credited_.erase(credited_.begin());
}

void connection::on_stream_closed(int64_t sid) {
  // The stream's loss count goes with it; keep it for stats (called before ngtcp2 frees it).
  if (ngtcp2_conn_is_local_stream(conn_, sid)) lost_closed_streams_ += ngtcp2_conn_get_stream_loss_count(conn_, sid);
  if (auto it = bulk_out_.find(sid); it != bulk_out_.end()) {
    uint64_t n = it->second.payload.size();
    bulk_out_.erase(it);
    release(n);
  }
  bulk_rx_.forget(sid);
  apply_bulk_grants();
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

void connection::read(const socket_address& local, const socket_address& remote, const uint8_t* data, size_t len,
                      uint64_t ts) {
  bytes_received_ += len;
  last_read_ts_ = ts;
  if (state_ == state::closed || state_ == state::draining) return;
  if (state_ == state::closing) return;  // the close packet is re-sent by on_timer's caller if needed
  ngtcp2_path path = make_path(local, remote);
  ngtcp2_pkt_info pi{};
  int rv = ngtcp2_conn_read_pkt(conn_, &path, &pi, data, len, ts);
  if (rv == 0) {
    remote_ = from_ngtcp2(ngtcp2_conn_get_path(conn_)->remote);
    return;
  }
  if (rv == NGTCP2_ERR_DRAINING) {
    ngtcp2_connection_close_error ccerr{};
    ngtcp2_conn_get_connection_close_error(conn_, &ccerr);
    std::string why(reinterpret_cast<const char*>(ccerr.reason), ccerr.reasonlen);
    if (why.empty()) why = "no reason given, code " + std::to_string(ccerr.error_code);
    const bool application = ccerr.type == NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION;
    peer_closed_as_duplicate_ = application && ccerr.error_code == static_cast<uint64_t>(close_code::duplicate);
    set_end(state::draining, "peer closed the connection: " + why, application && is_orderly(ccerr.error_code));
    close_deadline_ = ts + 3 * ngtcp2_conn_get_pto(conn_);
    return;
  }
  if (rv == NGTCP2_ERR_DROP_CONN) {
    set_end(state::closed, "connection dropped: " + liberr_text(rv));
    return;
  }
  if (rv == NGTCP2_ERR_CRYPTO) {
    std::string why = check_.failure.empty() ? "TLS handshake failed (alert " +
                                                   std::to_string(ngtcp2_conn_get_tls_alert(conn_)) + ")"
                                             : "TLS handshake failed: " + check_.failure;
    pending_close_ = {close_code::none, why};
    tls_alert_close_ = true;
    return;
  }
  pending_close_ = {close_code::protocol_violation, "QUIC error: " + liberr_text(rv)};
  transport_close_liberr_ = rv;
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

void connection::on_timer(uint64_t ts) {
  if (state_ == state::closing || state_ == state::draining) {
    if (ts >= close_deadline_) set_end(state::closed, "");
    return;
  }
  if (state_ == state::closed) return;
  if (state_ == state::admitting && ts >= admission_deadline_) {
    close(close_code::admission_refused,
          "no admission proof from the peer within " + std::to_string(cfg_.handshake_timeout.count()) + " ms");
    return;
  }
  int rv = ngtcp2_conn_handle_expiry(conn_, ts);
  if (rv == 0) return;
  if (rv == NGTCP2_ERR_IDLE_CLOSE) {
    set_end(state::closed, "idle timeout: no packet from the peer for " + std::to_string(cfg_.idle_timeout.count()) +
                               " ms");
  } else if (rv == NGTCP2_ERR_HANDSHAKE_TIMEOUT) {
    set_end(state::closed, "handshake timed out after " + std::to_string(cfg_.handshake_timeout.count()) + " ms");
  } else {
    pending_close_ = {close_code::protocol_violation, "QUIC error: " + liberr_text(rv)};
    transport_close_liberr_ = rv;
  }
}

uint64_t connection::expiry() const {
  if (state_ == state::closed) return UINT64_MAX;
  if (state_ == state::closing || state_ == state::draining) return close_deadline_;
  if (pending_close_) return 0;
  return std::min(ngtcp2_conn_get_expiry(conn_), state_ == state::admitting ? admission_deadline_ : UINT64_MAX);
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

peer_stats connection::stats() const {
  peer_stats s;
  ngtcp2_conn_stat cstat;
  ngtcp2_conn_get_conn_stat(conn_, &cstat);
  s.smoothed_rtt = std::chrono::nanoseconds(cstat.smoothed_rtt);
  s.min_rtt = std::chrono::nanoseconds(cstat.min_rtt == UINT64_MAX ? 0 : cstat.min_rtt);
  s.cwnd = cstat.cwnd;
  s.bytes_in_flight = cstat.bytes_in_flight;
  s.unsent_bytes = control_total_ - control_sent_;
  s.bulk_in_flight_limit = bulk_limit_;
  for (const auto& [sid, b] : bulk_out_) s.unsent_bytes += b.total() - b.sent;
  for (const auto& b : bulk_waiting_) s.unsent_bytes += b.size();
  s.packets_lost = lost_closed_streams_ + lost_datagrams_;
  if (control_sid_ >= 0) s.packets_lost += ngtcp2_conn_get_stream_loss_count(conn_, control_sid_);
  for (const auto& [sid, b] : bulk_out_) s.packets_lost += ngtcp2_conn_get_stream_loss_count(conn_, sid);
  s.bytes_sent = bytes_sent_;
  s.bytes_received = bytes_received_;
  s.bulk_receiving_bytes = bulk_rx_.receiving();
  s.bulk_receiving_peak = bulk_rx_.peak();
  s.remote_address = remote_.to_string();
  return s;
}

}  // namespace mesh::transport
