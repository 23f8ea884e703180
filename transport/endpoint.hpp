#pragma once
/// The QUIC endpoint of a node: one UDP socket, one I/O thread, any number of authenticated,
/// admitted connections in both directions. Every public member is thread-safe.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "transport/delivery_receipt.hpp"
#include "transport/frame.hpp"
#include "transport/identity.hpp"

namespace mesh::transport {

/// Which kind of traffic a message is; each has its own path through QUIC.
enum class channel : uint8_t {
  control,    ///< reliable; delivered in the order sent, with the bulk messages to the same peer
  bulk,       ///< reliable, on a stream of its own (no retransmission waits on another message's);
              ///< delivered in the order sent, with the control messages to the same peer
  heartbeat,  ///< unreliable QUIC DATAGRAM: never waits behind anything, may be lost
};

/// The reason a stopping endpoint gives its peers (the text of its CONNECTION_CLOSE).
inline constexpr const char* shutdown_reason = "peer is shutting down";

/// Why an admitted peer went down.
struct peer_down {
  std::string reason;    ///< readable: "peer closed the connection: peer is shutting down", "idle timeout", ...
  /// The connection was closed on purpose (the peer's endpoint stopped or its application closed
  /// the connection, or this endpoint did), not lost to a failure, a timeout or a refusal. Told
  /// by the close code of the CONNECTION_CLOSE, not by the reason text.
  bool orderly = false;
};

/// What an endpoint knows about a peer when it comes up.
struct peer_info {
  std::string remote_address;  ///< "ip:port" the connection runs to
  bool inbound = false;        ///< the peer dialed us
  bool relayed = false;        ///< no direct path: messages go through `relay`, sealed end to end
  std::optional<node_id> relay;
};

/// Counters of one connection.
struct peer_stats {
  std::chrono::nanoseconds smoothed_rtt{0};
  std::chrono::nanoseconds min_rtt{0};
  uint64_t bytes_sent = 0;      ///< UDP payload bytes, all packets of the connection
  uint64_t bytes_received = 0;  ///< UDP payload bytes, all packets of the connection
  uint64_t cwnd = 0;            ///< congestion window, bytes
  uint64_t bytes_in_flight = 0; ///< sent, not yet acknowledged or declared lost
  /// Queued payload not yet put into packets (control and bulk): with bytes_in_flight it tells
  /// why a link stands idle (nothing to send, or the congestion window / flow control holds it).
  uint64_t unsent_bytes = 0;
  /// Bulk bytes allowed in flight now (endpoint_config::bulk_in_flight_floor); 0 = not held.
  uint64_t bulk_in_flight_limit = 0;
  /// Packets this side sent that QUIC declared lost (spurious losses included), counted per
  /// stream they carried data of (ngtcp2 0.12 counts losses per stream only: a lost packet with
  /// frames of two streams counts twice) plus lost heartbeat datagrams.
  uint64_t packets_lost = 0;
  /// Bulk payload bytes received of messages not yet complete, now and at most so far (the
  /// receive budget bounds it: endpoint_config::bulk_receive_budget).
  uint64_t bulk_receiving_bytes = 0;
  uint64_t bulk_receiving_peak = 0;
  /// Bytes of delivered messages the application still holds receipts for (bounded by the
  /// same budget; delivery_receipt.hpp).
  uint64_t delivered_held_bytes = 0;
  std::string remote_address;
  bool relayed = false;  ///< counters are those of the connection to the relay
};

/// Endpoint-wide counters (metrics).
struct endpoint_counters {
  size_t connections = 0;         ///< in any state
  size_t half_open = 0;           ///< inbound connections in handshake or awaiting the admission proof
  uint64_t initials_shed = 0;     ///< validated Initials refused: the sum of the four refused_* bounds below
  uint64_t packets_dropped = 0;   ///< datagrams that matched no connection and were no Initial
  uint64_t retries_sent = 0;      ///< Initials without a token answered by a Retry (no state kept)
  uint64_t refused_invalid_token = 0;  ///< Initials whose token was forged, expired or for another address
  uint64_t refused_source_full = 0;    ///< the source already held max_half_open_per_source
  uint64_t refused_source_rate = 0;    ///< the source opened connections faster than its rate allows
  uint64_t refused_global_full = 0;    ///< max_half_open reached and the source was the largest holder
  uint64_t refused_table_full = 0;     ///< max_connections reached
  uint64_t evicted = 0;           ///< half-open connections dropped to make room for another source
  uint64_t accept_timeouts = 0;   ///< inbound connections not admitted within accept_timeout
  uint64_t relay_refused = 0;     ///< relayed messages refused: not of the open session, or replayed
  uint64_t punches_refused = 0;   ///< punch and introduce frames past their bounds (hole-punch reflection)
};

/// Callbacks, all invoked on the endpoint's I/O thread: they must only hand work off (queue it),
/// never block, and may call the endpoint's public functions.
struct handlers {
  /// The peer finished TLS and admission both ways; messages may flow.
  std::function<void(const node_id&, const peer_info&)> on_peer_up;
  /// An admitted peer went away (closed, idle timeout, error); `why` says which.
  std::function<void(const node_id&, const peer_down& why)> on_peer_down;
  /// A message from an admitted peer. Its bytes count against the peer's receive budget until
  /// the call returns, or, if the handler takes its receipt (take_delivery_receipt(),
  /// delivery_receipt.hpp), until the receipt is released: an application that queues messages
  /// for later handling keeps the receipt with them, so a peer cannot make it queue more than
  /// the budget.
  std::function<void(const node_id&, channel, std::vector<uint8_t>)> on_message;
  /// A connection that never got admitted: wrong key, wrong mesh secret, wrong version,
  /// unreachable. `peer` is known when TLS got far enough to see the peer's key; inbound
  /// attempts that never showed one go to on_log only.
  std::function<void(const std::optional<node_id>& peer, const std::string& address, const std::string& reason)>
      on_connect_failed;
  /// One line per notable event (connection refused, closed with an error).
  std::function<void(const std::string&)> on_log;
  /// This node relayed a sealed box from `from` to `to` (metrics, tests): the bytes are all a
  /// relay ever holds of a relayed message.
  std::function<void(const node_id& from, const node_id& to, const std::vector<uint8_t>& sealed)> on_relay;
};

/// How an endpoint runs.
struct endpoint_config {
  identity id = identity::generate();
  std::vector<uint8_t> mesh_secret;  ///< empty = the open LAN mesh
  std::string bind = "::";           ///< "::" (IPv4 and IPv6), "0.0.0.0", or one address
  uint16_t port = 0;                 ///< 0 = ephemeral (see endpoint::port())
  uint32_t protocol_version = 1;
  frame_limits limits;
  std::chrono::milliseconds idle_timeout{15000};       ///< no packet for this long: peer down
  std::chrono::milliseconds keep_alive{5000};          ///< send a PING after this much quiet
  std::chrono::milliseconds handshake_timeout{5000};   ///< dial attempt gives up after this
  size_t max_half_open = 64;       ///< inbound connections in handshake or admission, more Initials are dropped; the same bound applies to dials under way (dial() beyond it fails at once)
  /// Admission before state (docs/security.md, "Handshake floods"). An inbound connection must
  /// finish TLS and prove the mesh secret within this time from its first validated Initial,
  /// or it is dropped (a dial's own limit is handshake_timeout).
  std::chrono::milliseconds accept_timeout{2000};
  /// Half-open inbound connections one source (IPv4 address, IPv6 /64) may hold at once.
  size_t max_half_open_per_source = 8;
  /// New inbound connections one source may open: a bucket of this burst refilled at this
  /// rate per second (0 = no rate bound).
  double source_rate_per_s = 20;
  double source_burst = 20;
  /// An Initial without a valid token gets a Retry (address validation) when at least this many
  /// connections are half-open; 0 = always, which costs one round trip per inbound connection.
  size_t retry_above_half_open = 0;
  /// How long a Retry token stays valid (the client echoes it one round trip later).
  std::chrono::milliseconds retry_token_lifetime{3000};
  size_t max_connections = 1024;   ///< all connections, any state
  int socket_buffer_bytes = 8 << 20;
  size_t max_udp_payload = 1452;   ///< to peers on other hosts; above 1452 only where every path allows it
  /// To a peer on this host (a loopback address: 127.0.0.0/8, ::1), whose path is the loopback
  /// device (MTU 65536): packets this big, as kernel TCP uses 64 KiB segments there. Halves the
  /// CPU per byte (per-packet work of ngtcp2 and GnuTLS dominates). 0 = max_udp_payload.
  size_t loopback_udp_payload = 65000;
  uint64_t stream_window = 16u << 20;      ///< per-stream flow control window
  uint64_t connection_window = 64u << 20;  ///< per-connection flow control window
  /// Per peer: control and bulk payload queued and not yet acknowledged. Beyond it send()
  /// refuses (limit_exceeded) until acknowledgements free room: the sender's backpressure.
  uint64_t max_queued_bytes = uint64_t{2} << 30;
  /// Which bulk message gets the next packet when several are queued to one peer. The receiver
  /// hands messages over in the order they were sent (ordered_inbox.hpp), so one that finishes
  /// before an earlier one only waits there.
  /// oldest_first: in send order, so messages finish in the order they are handed over and
  /// nothing waits at the receiver.
  /// shortest_first: the one with the fewest bytes left; a large message waits while smaller
  /// ones keep coming, and they wait for it at the receiver (its budget bounds them).
  /// round_robin: a packet each in turn, so every message progresses and all finish late.
  enum class bulk_order : uint8_t { oldest_first, shortest_first, round_robin } bulk_scheduling = bulk_order::oldest_first;
  /// ngtcp2's congestion controller. cubic grows the window until loss; bbr and bbr2 model the
  /// path's bandwidth and minimum RTT and pace at that rate.
  enum class congestion : uint8_t { cubic, bbr, bbr2 } congestion_control = congestion::cubic;
  /// Bulk data in flight on a connection is held to max(this floor, 2 x the best delivery rate
  /// seen x the minimum RTT), the floor at least 16 packets; control messages and heartbeats are
  /// never held. ngtcp2 0.12's windows stop growing at random sizes (0.3-0.8 MB on a LAN), and a
  /// large one fills the sender's egress queue, where the acknowledgements it owes other peers
  /// wait behind it: in a ring all-reduce every connection's RTT then depends on its successor's
  /// window, and unequal windows leave links idle (docs/training.md). 0 = no hold.
  uint64_t bulk_in_flight_floor = 256u << 10;
  /// Per peer: the most bytes of unfinished incoming bulk messages this side holds at once,
  /// together with delivered messages whose receipts the application still holds.
  /// A message gets flow-control credit beyond stream_window only when its announced size fits
  /// what is left; others wait (oldest first) with their sender held; past it, control-stream
  /// credit is withheld too. Never less than limits.bulk, so that any message allowed can be
  /// received. Bounds what one peer can make this node hold: this plus stream_window per open
  /// stream (128) and the control stream's window (which ngtcp2 grows up to 4 x stream_window),
  /// not 128 x limits.bulk.
  uint64_t bulk_receive_budget = uint64_t{4} << 30;
  /// Tests only: as a relay, forwards every sealed box twice (a relay replaying what it saw).
  bool replay_relayed = false;
  /// Tests only: false plays a peer that finishes TLS and then never sends its admission proof
  /// nor reads the other side's (which must close it after handshake_timeout).
  bool send_admission_proof = true;
};

class endpoint_impl;

/// See the file comment. Destroying it stops it (closing every connection); never destroy it
/// from one of its own callbacks.
class endpoint {
 public:
  static expected<std::unique_ptr<endpoint>> start(endpoint_config config, handlers h);
  ~endpoint();
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  /// The UDP port actually bound.
  uint16_t port() const;
  /// This node's id.
  node_id id() const;
  /// Whether `address` ("host:port") parses and is of a family this endpoint's socket can send
  /// to (an IPv4 socket cannot reach an IPv6 address; a dual-stack one reaches both). Discovery
  /// uses it to leave out what mDNS or a peer announced that this node could never dial.
  bool can_reach(const std::string& address) const;
  /// Connects to the node `expected` at the first of `addresses` ("host:port") that answers;
  /// the result arrives as on_peer_up or on_connect_failed. No-op when already connected or
  /// already dialing it; fails at once (on_connect_failed) past max_half_open dials under way or
  /// max_connections.
  void dial(const node_id& expected, std::vector<std::string> addresses);
  /// Queues a message to an admitted peer. Errors: the peer is not up (network), the message
  /// exceeds its channel's limit, or the peer's send queue is full (both limit_exceeded; retry
  /// later). Success means queued, not delivered.
  expected<void> send(const node_id& peer, channel ch, std::vector<uint8_t> bytes);
  /// Whether `peer` is up (admitted, directly or through a relay): send() can queue to it.
  bool connected(const node_id& peer) const;
  /// Counters of the connection to `peer`, if it is up.
  std::optional<peer_stats> stats(const node_id& peer) const;
  /// Reaches `target` through `rendezvous` (a peer that is up and also connected to `target`):
  /// both ends punch their NATs at once and the smaller node id dials; if no direct path opens
  /// within the handshake timeout, `rendezvous` relays (on_peer_up with relayed = true).
  void connect_via(const node_id& target, const node_id& rendezvous);
  /// The address the most recent peer reported seeing this node at (its public mapping behind a NAT).
  std::optional<std::string> observed_address() const;
  /// Counters as of the I/O thread's last loop iteration.
  endpoint_counters counters() const;
  /// Ids of the peers that are up now.
  std::vector<node_id> peers() const;
  /// Hands back a message buffer (from on_message) the application has finished reading: the
  /// next incoming bulk message of about its size is received into it. Optional, any thread;
  /// saves the kernel zeroing fresh pages for every large message (a third of the receiving
  /// thread's time at 64 MiB messages). Small buffers and buffers beyond the pool's bound
  /// (8 buffers, 256 MiB) are simply freed, and so are buffers not reused within 10 s.
  void recycle(std::vector<uint8_t> buffer);
  /// Closes the connection to `peer` (CONNECTION_CLOSE, then on_peer_down "closed locally").
  void disconnect(const node_id& peer);
  /// Closes every connection and joins the I/O thread. Idempotent. From a callback it only
  /// asks the loop to end (destroy the endpoint from another thread).
  void stop();

 private:
  explicit endpoint(std::unique_ptr<endpoint_impl> impl);
  std::unique_ptr<endpoint_impl> impl_;
};

}  // namespace mesh::transport
