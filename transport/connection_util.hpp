#pragma once
// Small helpers the two halves of the connection share (connection.cpp: set-up, TLS, admission
// and what arrives; connection_send.cpp: what leaves). Internal to transport/.
#include <ngtcp2/ngtcp2.h>

#include <cstring>
#include <string>

#include "transport/address.hpp"
#include "transport/connection.hpp"

namespace mesh::transport::detail {

inline socket_address from_ngtcp2(const ngtcp2_addr& a) {
  socket_address s;
  std::memcpy(&s.storage, a.addr, a.addrlen);
  s.len = a.addrlen;
  return s;
}

inline std::string liberr_text(int rv) { return ngtcp2_strerror(rv); }

/// A close on purpose (the peer's endpoint stopped or its application closed the connection),
/// told by the close code, not by the reason text.
inline bool is_orderly(uint64_t code) {
  return code == static_cast<uint64_t>(close_code::shutting_down) ||
         code == static_cast<uint64_t>(close_code::closed_by_application);
}

}  // namespace mesh::transport::detail
