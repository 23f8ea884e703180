#pragma once
/// QUIC address validation (RFC 9000 §8.1): the stateless half. Classifies a datagram that
/// matched no connection and writes Retry packets. Pure functions of their arguments (the
/// endpoint's secret and the time included), no I/O; internal to transport/.
#include <ngtcp2/ngtcp2.h>

#include <array>
#include <cstdint>
#include <span>

#include "transport/address.hpp"

namespace mesh::transport {

/// Per-endpoint key of the Retry tokens (random at start, never leaves the process).
using retry_secret = std::array<uint8_t, 32>;

struct initial_check {
  enum class kind : uint8_t {
    not_initial,    ///< not a client Initial that may open a connection (garbage, 0-RTT, short header)
    no_token,       ///< an Initial without a token: the address is not validated
    valid_token,    ///< a Retry token this endpoint issued to this address, still fresh
    invalid_token,  ///< a token that is forged, expired, for another address or connection id
  } what = kind::not_initial;
  ngtcp2_pkt_hd hd{};  ///< the decoded header (all kinds but not_initial)
  ngtcp2_cid odcid{};  ///< valid_token: the connection id of the client's first Initial
};

/// Decodes `packet` from `from` as the first packet of a new connection and checks its token.
/// Any bytes are safe here (fuzzed: fuzz_inbound_initial).
initial_check check_initial(std::span<const uint8_t> packet, const socket_address& from, const retry_secret& secret,
                            uint64_t token_lifetime_ns, uint64_t now_ns);

/// Writes into `out` a Retry answering the Initial `hd` from `to`, with a token bound to that
/// address, a fresh server connection id and `now_ns`. Returns its length, or 0 on failure.
size_t write_retry(std::span<uint8_t> out, const ngtcp2_pkt_hd& hd, const socket_address& to,
                   const retry_secret& secret, uint64_t now_ns);

}  // namespace mesh::transport
