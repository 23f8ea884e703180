#pragma once
/// One QUIC connection to one peer: ngtcp2 + GnuTLS, the admission exchange, the control
/// stream, bulk streams and heartbeat datagrams. Internal to transport/; driven only by the
/// endpoint's I/O thread (no locking here), with explicit timestamps. connection.cpp holds set-up,
/// TLS, admission and the receiving side; connection_send.cpp the sending side.
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/address.hpp"
#include "transport/bulk_receiver.hpp"
#include "transport/delivery_meter.hpp"
#include "transport/endpoint.hpp"
#include "transport/frame.hpp"
#include "transport/delivery_receipt.hpp"
#include "transport/ordered_inbox.hpp"
#include "transport/tls.hpp"

namespace mesh::transport {

class connection;

/// What a connection tells the endpoint that owns it. Called from inside ngtcp2 callbacks:
/// implementations must not close or destroy the connection there.
class connection_owner {
 public:
  virtual ~connection_owner() = default;
  virtual void on_cid_added(connection& c, const ngtcp2_cid& cid) = 0;
  virtual void on_cid_removed(connection& c, const ngtcp2_cid& cid) = 0;
  /// Both proofs verified: the peer is admitted.
  virtual void on_admitted(connection& c) = 0;
  /// A message for the application; `receipt` charges its bytes to the connection's receive
  /// budget until released (delivery_receipt.hpp).
  virtual void on_message(connection& c, channel ch, std::vector<uint8_t> bytes, delivery_receipt receipt) = 0;
  /// A NAT traversal frame (observed address, introduce, punch, relay) from an admitted peer.
  virtual void on_traversal_frame(connection& c, frame f) = 0;
  /// `bytes` of queued application payload (control, bulk) were acknowledged or dropped.
  virtual void on_released(connection& c, uint64_t bytes) = 0;
  /// Buffers the application handed back (endpoint::recycle), lent to incoming bulk messages.
  virtual buffer_pool& receive_buffers() = 0;
  /// Where this owner's receipts wake it when released bytes may let credit go back.
  virtual std::shared_ptr<release_hub> releases() = 0;
};

/// QUIC application error codes carried in CONNECTION_CLOSE.
enum class close_code : uint64_t {
  none = 0,
  admission_refused = 1,
  protocol_violation = 2,
  duplicate = 3,
  shutting_down = 4,
  closed_by_application = 5,  ///< endpoint::disconnect
};

class connection {
 public:
  enum class state { handshaking, admitting, admitted, closing, draining, closed };

  /// Writes `len` bytes (datagrams of `segment` bytes) to `to`; false when the socket is full
  /// (the callee keeps the bytes and the connection stops writing for now).
  using send_fn = std::function<bool(const socket_address& to, const uint8_t* data, size_t len, size_t segment)>;

  static expected<std::unique_ptr<connection>> make_client(connection_owner& owner, const endpoint_config& cfg,
                                                           const tls_context& tls, const socket_address& local,
                                                           const socket_address& remote, const node_id& expected,
                                                           uint64_t ts);
  static expected<std::unique_ptr<connection>> make_server(connection_owner& owner, const endpoint_config& cfg,
                                                           const tls_context& tls, const socket_address& local,
                                                           const socket_address& remote, const ngtcp2_pkt_hd& hd,
                                                           const ngtcp2_cid* retry_odcid, uint64_t ts);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  /// One received UDP datagram.
  void read(const socket_address& local, const socket_address& remote, const uint8_t* data, size_t len, uint64_t ts);
  /// Timers (loss detection, idle, keep-alive, pacing, close deadline).
  void on_timer(uint64_t ts);
  /// Writes what there is to write; returns false when the socket blocked.
  bool write(const send_fn& send, uint64_t ts);
  /// When on_timer must be called next (UINT64_MAX: never).
  uint64_t expiry() const;

  /// Queues a message (the peer must be admitted). Bulk payloads are sent from `bytes` itself.
  void queue(channel ch, std::vector<uint8_t> bytes);
  /// Queues a frame of another kind on the control stream (NAT traversal frames).
  void queue_frame(frame_kind kind, std::span<const uint8_t> payload);
  /// Queues a relay_deliver frame of a box `from` sent through this node (we are the relay).
  void queue_relayed(const node_id& from, std::span<const uint8_t> payload);
  /// Bytes of boxes relayed from `from` queued here and not yet acknowledged by this peer.
  uint64_t relayed_backlog(const node_id& from) const {
    auto it = relayed_backlog_.find(from);
    return it == relayed_backlog_.end() ? 0 : it->second;
  }
  /// Closes with an application error and a reason the peer will log; takes effect at the next write.
  void close(close_code code, std::string reason);
  /// Drops the connection at once, sending nothing (an inbound attempt evicted while half-open).
  void abandon(std::string reason) { set_end(state::closed, std::move(reason)); }
  /// An inbound connection that was not admitted within endpoint_config::accept_timeout.
  bool accept_timed_out() const { return accept_timed_out_; }

  state current_state() const { return state_; }
  /// Closing, draining or closed: it carries nothing more.
  bool ended() const { return state_ == state::closing || state_ == state::draining || state_ == state::closed; }
  bool handshake_done() const { return handshake_done_; }
  /// The peer's node id, once TLS showed its key.
  const std::optional<node_id>& peer() const { return check_.peer; }
  bool inbound() const { return inbound_; }
  const socket_address& remote() const { return remote_; }
  /// The peer closed this connection as a duplicate of another one to the same node.
  bool peer_closed_as_duplicate() const { return peer_closed_as_duplicate_; }
  /// Why the connection ended (closed or draining); empty while alive.
  const std::string& end_reason() const { return end_reason_; }
  /// Ended by a deliberate close from either side (shutting_down or closed_by_application):
  /// peer_down::orderly.
  bool orderly_end() const { return orderly_end_; }
  peer_stats stats() const;
  /// Application payload bytes queued and not yet acknowledged.
  uint64_t outstanding_bytes() const { return outstanding_; }
  /// Everything queued here (messages and frames) was sent and acknowledged.
  bool all_acknowledged() const { return control_out_.empty() && bulk_waiting_.empty() && bulk_out_.empty(); }

  /// Retiring a duplicate connection (simultaneous dials): nothing new is queued on it; what is
  /// queued is still sent and what arrives still delivered. Once all of it is acknowledged it
  /// sends `retire`; once both ends have, it closes. After `timeout_ns` it closes regardless.
  void retire(uint64_t ts, uint64_t timeout_ns);
  /// The twin that was to replace this one failed: this one carries the peer again.
  void unretire();
  bool retiring() const { return retiring_; }
  /// Sends `retire` or closes when due (see retire()); call once per I/O pass.
  void advance_retirement(uint64_t ts);
  /// While held, messages queued from now on wait (frames queued before still go): the winner of
  /// a simultaneous dial waits until its retiring twin's messages are acknowledged, so that no
  /// message overtakes one sent earlier on the twin.
  void hold_messages();
  void release_messages() { held_from_.reset(); }

  /// Charges `bytes` delivered on this connection's behalf (a relayed message) to its account.
  delivery_receipt charge(uint64_t bytes) { return {account_, bytes}; }
  /// Gives back the credit withheld while delivered messages held the receive budget, as far as
  /// releases made room (the endpoint calls it when a receipt wakes it).
  void refresh_credit();
  /// Bytes delivered and not yet released by the application.
  uint64_t delivered_held() const { return account_->held.load(); }

  /// Bookkeeping for the endpoint.
  bool up_reported = false;
  bool end_reported = false;
  std::vector<std::string> fallback_addresses;  ///< dial: the addresses still to try

 private:
  connection(connection_owner& owner, const endpoint_config& cfg, bool inbound, const socket_address& remote);
  expected<void> init_tls(const tls_context& tls, bool server);
  /// The first end decides the reason and whether it was orderly (a deliberate close).
  void set_end(state s, std::string reason, bool orderly = false);
  void on_handshake_completed();
  expected<void> on_control_data(const uint8_t* data, size_t len);
  expected<void> handle_control_frame(frame f);
  /// Returns the stream credit to give back for these bytes (0 while the message waits for budget).
  expected<uint64_t> on_bulk_data(int64_t sid, const uint8_t* data, size_t len, bool fin);
  /// Hands what the inbox released to the application, in the order the peer sent it.
  void deliver(std::vector<ordered_inbox::message> messages);
  void send_close_packet(const send_fn& send, uint64_t ts);
  void open_bulk_streams();
  void on_acked(int64_t sid, uint64_t offset, uint64_t len);
  void on_stream_closed(int64_t sid);
  bool remote_stream_is_control(int64_t sid) const;

  static ngtcp2_callbacks callbacks(bool server);
  static ngtcp2_conn* get_conn(ngtcp2_crypto_conn_ref* ref);
  friend struct connection_callbacks;

  connection_owner& owner_;
  const endpoint_config& cfg_;
  bool inbound_;
  ngtcp2_conn* conn_ = nullptr;
  gnutls_session_t tls_ = nullptr;
  ngtcp2_crypto_conn_ref conn_ref_{};
  tls_peer_check check_;
  state state_ = state::handshaking;
  bool handshake_done_ = false;
  bool peer_proof_ok_ = false;
  std::string end_reason_;
  std::optional<std::pair<close_code, std::string>> pending_close_;
  std::vector<uint8_t> close_packet_;
  uint64_t close_deadline_ = UINT64_MAX;
  socket_address remote_;
  size_t max_udp_payload_;  ///< largest datagram sent on this path (bigger to a loopback peer)
  socket_address local_;

  // Outgoing control stream: chunks kept until acknowledged (ngtcp2 does not copy).
  int64_t control_sid_ = -1;
  std::deque<std::vector<uint8_t>> control_out_;
  // Per chunk of control_out_: application payload bytes in it, and for a relayed box the node
  // that sent it (its share of the relay backlog ends when the chunk is acknowledged).
  struct control_chunk {
    size_t app_bytes = 0;
    std::optional<node_id> relayed_from;
  };
  std::deque<control_chunk> control_chunks_;
  std::unordered_map<node_id, uint64_t> relayed_backlog_;  // bytes per sender, not yet acknowledged
  void push_control(std::vector<uint8_t> frame_bytes, control_chunk info);
  uint64_t control_base_ = 0;    // stream offset of control_out_.front()
  uint64_t control_sent_ = 0;    // stream offset handed to ngtcp2
  uint64_t control_total_ = 0;   // stream offset after the last queued byte

  // Outgoing bulk streams, one message each.
  struct bulk_out {
    frame_header header;
    std::vector<uint8_t> payload;
    uint64_t sent = 0;
    uint64_t total() const { return header.size + payload.size(); }
  };
  std::deque<std::vector<uint8_t>> bulk_waiting_;  // no stream id yet (peer's stream limit)
  std::map<int64_t, bulk_out> bulk_out_;
  uint64_t lost_closed_streams_ = 0;  // packets lost, summed over streams already closed
  bool retiring_ = false, retire_sent_ = false, peer_retired_ = false;
  uint64_t retire_deadline_ = 0;
  std::optional<uint64_t> held_from_;  // control stream offset from which messages are held
  uint64_t acked_bytes_ = 0;  // stream bytes the peer acknowledged, all streams
  delivery_meter delivery_;   // for the bulk in-flight limit
  uint64_t bulk_limit_ = 0;   // bytes; 0 until bulk is first held (or never: floor 0)
  uint64_t lost_datagrams_ = 0;
  int64_t bulk_cursor_ = -1;  // the bulk stream served last (round robin continues after it)
  /// The bulk stream to write next (cfg_.bulk_scheduling), or end() when none can be written.
  std::map<int64_t, bulk_out>::iterator next_bulk_stream(const std::vector<int64_t>& blocked);
  /// Bulk data in flight reached its limit (endpoint_config::bulk_in_flight_floor).
  bool bulk_in_flight_full(uint64_t ts);

  std::deque<std::vector<uint8_t>> datagrams_out_;

  // Incoming.
  frame_decoder control_in_;
  std::vector<uint8_t> early_control_;  // control bytes that arrived before our handshake finished
  // Incoming bulk streams, one message each, under the receive budget (bulk_receiver.hpp).
  bulk_receiver bulk_rx_;
  /// Gives the stream credit bulk_rx_ granted to waiting messages back to the peer.
  void apply_bulk_grants();
  uint64_t held_bytes_ = 0;  // bulk payload bytes that arrived before admission
  /// Delivered bytes the application holds (delivery_receipt.hpp), and control-stream credit
  /// withheld while they are over the receive budget.
  std::shared_ptr<delivery_account> account_;
  uint64_t receive_budget_ = 0;
  int64_t control_in_sid_ = -1;
  uint64_t control_uncredited_ = 0;
  /// How much control-stream credit to give back for `len` bytes just read (0: withheld).
  uint64_t control_credit(int64_t sid, uint64_t len);
  /// Whether a release must wake the I/O thread (something waits for the budget).
  void update_starved();
  /// Gives waiting bulk messages and the control stream the credit `held` has room for now.
  void give_back_credit();
  uint64_t admission_deadline_ = UINT64_MAX;  // the peer's proof must come by then (inbound: TLS too)
  bool accept_timed_out_ = false;
  uint64_t uncredited_before_admission_ = 0;  // connection credit held until the peer is admitted
  uint64_t last_read_ts_ = 0;                 // of the latest packet read
  /// Peer-opened streams whose credit was given back (once each): see credit_remote_stream().
  std::set<int64_t> credited_;
  void credit_remote_stream(int64_t sid);
  /// Restores the order of the peer's control and bulk messages (ordered_inbox.hpp).
  ordered_inbox inbox_;

  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  uint64_t outstanding_ = 0;  // application payload queued, not yet acknowledged
  void release(uint64_t n) {
    outstanding_ -= std::min(outstanding_, n);
    if (n) owner_.on_released(*this, n);
  }
  bool peer_closed_as_duplicate_ = false;
  bool orderly_end_ = false;
  bool tls_alert_close_ = false;   // the close is a TLS failure, not an application decision
  int transport_close_liberr_ = 0; // the close is a QUIC transport error
  std::vector<uint8_t> write_buf_;
};

}  // namespace mesh::transport
