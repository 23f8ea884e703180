#pragma once
/// Framing of everything a node sends on a QUIC stream or datagram: a pure codec, no I/O.
///
/// Wire form: `kind:u8 | length:varint | payload[length]` (varint as in QUIC, RFC 9000 §16).
/// Each kind has its own size limit; an unknown kind or an oversized length is a decode error
/// and the caller closes the connection that sent it.
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "transport/buffer_pool.hpp"

namespace mesh::transport {

/// What a frame carries.
enum class frame_kind : uint8_t {
  admission = 1,  ///< the mesh admission proof; must be the first frame of the control stream
  control = 2,    ///< an ordered message on the control stream
  bulk = 3,       ///< one large message, alone on its own unidirectional stream
  heartbeat = 4,  ///< a small unreliable message in a QUIC DATAGRAM
  observed_address = 5,  ///< "this is the address I see you at" (control stream, NAT traversal)
  introduce = 6,         ///< to a rendezvous: "help me reach node X" (control stream)
  punch = 7,             ///< from a rendezvous: "node X is at address A: punch now" (control stream)
  relay_send = 8,        ///< to a relay: "forward this sealed box to node X" (control stream)
  relay_deliver = 9,     ///< from a relay: "node X sent you this sealed box" (control stream)
  /// "I send nothing more on this connection and everything I sent here is acknowledged": the
  /// last frame on a duplicate connection being retired (control stream, empty).
  retire = 10,
  /// "My next bulk message takes this place in the order of my messages" (control stream,
  /// empty): how the receiver restores the order in which control and bulk messages were sent
  /// (transport/ordered_inbox.hpp).
  bulk_next = 11,
};

/// Largest payload accepted per kind. Limits protect the receiver's memory.
struct frame_limits {
  uint64_t admission = 64;
  uint64_t control = 16u << 20;
  uint64_t bulk = uint64_t{4} << 30;
  uint64_t heartbeat = 1024;
  uint64_t observed_address = 64;
  uint64_t introduce = 64;
  uint64_t punch = 128;
  uint64_t relay = 16u << 20;  ///< relay_send and relay_deliver

  uint64_t for_kind(frame_kind k) const;
};

/// A decoded frame.
struct frame {
  frame_kind kind{};
  std::vector<uint8_t> payload;
};

/// Largest header: one kind byte plus an 8-byte varint.
inline constexpr size_t max_frame_header = 9;

/// A frame header for a payload of `length` bytes; the payload follows it on the wire unchanged
/// (so large payloads are sent from the caller's buffer, never copied into a frame).
struct frame_header {
  std::array<uint8_t, max_frame_header> bytes{};
  uint8_t size = 0;
  std::span<const uint8_t> view() const { return {bytes.data(), size}; }
};

/// Header for a payload of `length` bytes of kind `k`; an error when it exceeds `limits`.
expected<frame_header> encode_frame_header(frame_kind k, uint64_t length, const frame_limits& limits);

/// Header and payload in one buffer (for small frames).
expected<std::vector<uint8_t>> encode_frame(frame_kind k, std::span<const uint8_t> payload,
                                            const frame_limits& limits);

/// Incremental decoder for one byte stream: feed it stream data in any chunking.
/// After an error it stays failed (the stream is unusable and the connection must close).
class frame_decoder {
 public:
  /// `reserve_limit` caps the memory reserved from a header alone, before the payload arrives:
  /// small for peers not yet trusted, the whole frame for admitted ones (no regrowth copies).
  /// `pool`, when given, lends a reused buffer for each payload it can hold (see buffer_pool).
  explicit frame_decoder(frame_limits limits = {}, uint64_t reserve_limit = 16u << 20, buffer_pool* pool = nullptr)
      : limits_(limits), reserve_limit_(reserve_limit), pool_(pool) {}

  /// Replaces `reserve_limit` by a rule evaluated when each header arrives: how many bytes to
  /// reserve for a payload of `length` (the connection reserves a bulk message whole only once
  /// it fits the receive budget).
  void set_reserve_rule(std::function<uint64_t(uint64_t length)> rule) { reserve_rule_ = std::move(rule); }
  /// Grows the buffer of the frame being received to hold `bytes` (no-op between frames).
  void reserve_payload(uint64_t bytes);

  /// Consumes `bytes`; every frame completed by them is appended to `out`.
  expected<void> feed(std::span<const uint8_t> bytes, std::vector<frame>& out);
  /// True when no partial frame is buffered (a stream may end cleanly only here).
  bool at_boundary() const { return header_size_ == 0 && !in_payload_; }
  /// The payload length announced by the header of the frame being received, once that
  /// header is complete; nullopt between frames.
  std::optional<uint64_t> receiving_length() const { return in_payload_ ? std::optional(length_) : std::nullopt; }
  /// Payload bytes of the frame being received that are already buffered.
  uint64_t receiving_bytes() const { return in_payload_ ? length_ - remaining_ : 0; }

 private:
  frame_limits limits_;
  uint64_t reserve_limit_;
  std::function<uint64_t(uint64_t)> reserve_rule_;
  buffer_pool* pool_;
  std::array<uint8_t, max_frame_header> header_{};
  size_t header_size_ = 0;
  bool in_payload_ = false;
  bool failed_ = false;
  frame current_;
  uint64_t remaining_ = 0;
  uint64_t length_ = 0;  // of the frame being received
};

/// Decodes a buffer holding exactly one frame (a datagram).
expected<frame> decode_single_frame(std::span<const uint8_t> bytes, const frame_limits& limits);

}  // namespace mesh::transport
