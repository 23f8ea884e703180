#include "transport/connection.hpp"
#include "transport/connection_util.hpp"

#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "transport/admission.hpp"

namespace mesh::transport {

using detail::from_ngtcp2;
using detail::is_orderly;
using detail::liberr_text;

namespace {
/// The peer's bulk streams are its unidirectional streams after its control stream, opened in the
/// order it queued the messages: stream id n is its (n >> 2)-th unidirectional stream, and bulk
/// message number (n >> 2) - 1.
uint64_t bulk_ordinal(int64_t sid) { return (static_cast<uint64_t>(sid) >> 2) - 1; }
/// The peer's stream that carries its bulk message number `ordinal` (a client's unidirectional
/// stream ids end in binary 10, a server's in 11).
int64_t bulk_sid(uint64_t ordinal, bool peer_is_client) {
  return static_cast<int64_t>(((ordinal + 1) << 2) | (peer_is_client ? 2u : 3u));
}


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

void random_cid(ngtcp2_cid* cid, size_t len) {
  cid->datalen = len;
  randombytes_buf(cid->data, len);
}

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
    // back now; stream credit as on_bulk_data says (held while a message waits for budget), and
    // on the control stream while delivered messages hold the receive budget.
    if (c.remote_stream_is_control(sid) && *r) r = c.control_credit(sid, *r);
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
    if (c.state_ == connection::state::admitted) c.owner_.on_message(c, channel::heartbeat, std::move(f->payload), {});
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
      account_(std::make_shared<delivery_account>()),
      receive_budget_(std::max(cfg.bulk_receive_budget, cfg.limits.bulk)),
      // Finished messages waiting for an earlier one get a budget of their own, as large as the
      // receive budget of unfinished ones (which is never below the largest message allowed).
      inbox_(std::max(cfg.bulk_receive_budget, cfg.limits.bulk)) {
  remote_ = remote;
  account_->hub = owner.releases();
  bulk_rx_.set_inbox(bulk_sid(0, inbound_), 0, false);  // the inbox waits for the first bulk message (deliver())
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
                                                              const ngtcp2_cid* retry_odcid, uint64_t ts) {
  std::unique_ptr<connection> c(new connection(owner, cfg, true, remote));
  c->local_ = local;
  ngtcp2_cid scid{};
  random_cid(&scid, cid_len);
  ngtcp2_settings settings;
  fill_settings(settings, c->max_udp_payload_, cfg, ts);
  // An inbound attempt holds a half-open slot: TLS and the admission proof together get
  // accept_timeout from this first validated Initial (a stranger's slot frees up quickly).
  const uint64_t accept_ns = static_cast<uint64_t>(cfg.accept_timeout.count()) * ns_per_ms;
  settings.handshake_timeout = std::min<uint64_t>(settings.handshake_timeout, accept_ns);
  c->admission_deadline_ = ts + accept_ns;
  ngtcp2_transport_params params;
  fill_params(params, cfg);
  if (retry_odcid) {
    // After a Retry the client addresses us by the Retry's connection id (hd.dcid) and both
    // sides authenticate the exchange through these two transport parameters (RFC 9000 §7.3).
    params.original_dcid = *retry_odcid;
    params.retry_scid = hd.dcid;
    params.retry_scid_present = 1;
  } else {
    params.original_dcid = hd.dcid;
  }
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
  // sent) for ever: a dialed peer gets as long as a handshake, an inbound one what is left of
  // accept_timeout (set when it arrived).
  if (!inbound_) admission_deadline_ = last_read_ts_ + static_cast<uint64_t>(cfg_.handshake_timeout.count()) * ns_per_ms;
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
  bulk_rx_.set_delivered(account_->held.load());
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
  // bulk_rx_ counted the finished message as delivered; if it waits in the inbox for an earlier
  // one instead (the inbox has a budget of its own), this gives its share back.
  bulk_rx_.set_delivered(account_->held.load());
  apply_bulk_grants();
  update_starved();
  return r->credit;
}

void connection::apply_bulk_grants() {
  for (const auto& [sid, credit] : bulk_rx_.take_grants()) ngtcp2_conn_extend_max_stream_offset(conn_, sid, credit);
}

void connection::deliver(std::vector<ordered_inbox::message> messages) {
  for (auto& m : messages) {
    if (state_ == state::closing || state_ == state::closed || pending_close_) return;
    delivery_receipt receipt(account_, m.bytes.size());
    owner_.on_message(*this, m.bulk ? channel::bulk : channel::control, std::move(m.bytes), std::move(receipt));
  }
  // The inbox may have handed messages over, or taken in one that finished early: bulk_rx_
  // grants budget ahead of the message it waits for only as far as the inbox has room.
  bulk_rx_.set_inbox(bulk_sid(inbox_.next_bulk(), inbound_), inbox_.held_bytes(), inbox_.next_bulk_marked());
  bulk_rx_.set_delivered(account_->held.load());  // what the application kept takes its share
  apply_bulk_grants();
  update_starved();
}

void connection::update_starved() {
  // Messages waiting for budget, or control credit withheld: a release must wake the I/O thread.
  const bool starved = bulk_rx_.waiting() > 0 || control_uncredited_ > 0;
  if (!starved) {
    account_->starved = false;
    return;
  }
  // Just raised: a receipt released (on another thread) after `held` was last read here but
  // before the flag went up saw no flag and woke nothing, and with the peer held nothing else
  // may come to read `held` again. So it is read once more now the flag is up; any later release
  // sees the flag (both sides are seq_cst). Should that free everything, the flag stays up until
  // the next refresh: one wake-up too many, never one too few.
  if (!account_->starved.exchange(true)) give_back_credit();
}

uint64_t connection::control_credit(int64_t sid, uint64_t len) {
  control_in_sid_ = sid;
  if (account_->held.load() <= receive_budget_ && control_uncredited_ == 0) return len;
  control_uncredited_ += len;
  update_starved();
  return 0;
}

void connection::refresh_credit() {
  if (ended()) return;
  give_back_credit();
  update_starved();
}

void connection::give_back_credit() {
  const uint64_t held = account_->held.load();
  bulk_rx_.set_delivered(held);
  apply_bulk_grants();
  if (control_uncredited_ && held <= receive_budget_) {
    ngtcp2_conn_extend_max_stream_offset(conn_, control_in_sid_, control_uncredited_);
    control_uncredited_ = 0;
  }
}

void connection::close(close_code code, std::string reason) {
  if (ended() || pending_close_) return;
  pending_close_ = {code, std::move(reason)};
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

void connection::on_timer(uint64_t ts) {
  if (state_ == state::closing || state_ == state::draining) {
    if (ts >= close_deadline_) set_end(state::closed, "");
    return;
  }
  if (state_ == state::closed) return;
  if (inbound_ && state_ == state::handshaking && ts >= admission_deadline_) {
    accept_timed_out_ = true;
    set_end(state::closed, "handshake not finished within accept_timeout (" + std::to_string(cfg_.accept_timeout.count()) + " ms)");
    return;
  }
  if (state_ == state::admitting && ts >= admission_deadline_) {
    accept_timed_out_ = inbound_;
    close(close_code::admission_refused,
          "no admission proof from the peer within " +
              std::to_string((inbound_ ? cfg_.accept_timeout : cfg_.handshake_timeout).count()) + " ms");
    return;
  }
  int rv = ngtcp2_conn_handle_expiry(conn_, ts);
  if (rv == 0) return;
  if (rv == NGTCP2_ERR_IDLE_CLOSE) {
    set_end(state::closed, "idle timeout: no packet from the peer for " + std::to_string(cfg_.idle_timeout.count()) +
                               " ms");
  } else if (rv == NGTCP2_ERR_HANDSHAKE_TIMEOUT) {
    accept_timed_out_ = inbound_;
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
  const bool deadline = state_ == state::admitting || (inbound_ && state_ == state::handshaking);
  return std::min(ngtcp2_conn_get_expiry(conn_), deadline ? admission_deadline_ : UINT64_MAX);
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
  s.delivered_held_bytes = account_->held.load();
  s.bulk_receiving_peak = bulk_rx_.peak();
  s.remote_address = remote_.to_string();
  return s;
}

}  // namespace mesh::transport
