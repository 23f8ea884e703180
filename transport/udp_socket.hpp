#pragma once
/// The endpoint's one UDP socket: non-blocking, dual-stack, large buffers, GSO on send and GRO
/// on receive where the kernel has them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "transport/address.hpp"

namespace mesh::transport {

class udp_socket {
 public:
  /// Binds `bind_host:port` ("::" = every IPv4 and IPv6 address; port 0 = ephemeral).
  static expected<udp_socket> open(const std::string& bind_host, uint16_t port, int buffer_bytes);
  udp_socket() = default;
  udp_socket(udp_socket&& o) noexcept { *this = std::move(o); }
  udp_socket& operator=(udp_socket&& o) noexcept;
  ~udp_socket();

  int fd() const { return fd_; }
  int family() const { return local_.family(); }
  const socket_address& local() const { return local_; }
  bool gso() const { return gso_; }

  /// Outcome of a send.
  enum class send_result { sent, would_block, failed };
  /// Sends `len` bytes as datagrams of `segment` bytes (the last may be shorter) in one call
  /// with UDP GSO, or one by one where GSO is unavailable. `sent` is how many bytes went out.
  send_result send(const socket_address& to, const uint8_t* data, size_t len, size_t segment, size_t* sent);

  /// One receive: `len` bytes from `from`; with GRO they are several datagrams of `segment`
  /// bytes each (the last may be shorter); segment == len when not coalesced.
  struct received {
    size_t len = 0;
    size_t segment = 0;
    socket_address from;
  };
  /// Up to `slots` receives in one system call (recvmmsg), the i-th into
  /// `buf + i * slot_size`; returns how many, 0 when nothing is waiting. Fewer than `slots`
  /// means the socket was empty when the call ran: no further call is needed to find out.
  size_t receive_batch(uint8_t* buf, size_t slot_size, size_t slots, received* out);

 private:
  int fd_ = -1;
  socket_address local_;
  bool gso_ = false;
};

}  // namespace mesh::transport
