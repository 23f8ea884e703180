#pragma once
/// Socket addresses: parsing "host:port" / "[v6]:port" and printing them.
#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <string_view>

#include "base/error.hpp"

namespace mesh::transport {

/// An IPv4 or IPv6 socket address.
struct socket_address {
  sockaddr_storage storage{};
  socklen_t len = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  uint16_t port() const;
  /// "1.2.3.4:5" or "[::1]:5"; an IPv4-mapped IPv6 address prints as IPv4.
  std::string to_string() const;
  /// The same address as the given socket family can send to (IPv4 becomes v4-mapped IPv6).
  expected<socket_address> for_family(int family) const;
  /// IPv4-mapped IPv6 becomes plain IPv4; anything else is unchanged.
  socket_address unmapped() const;
  /// 127.0.0.0/8 or ::1 (also v4-mapped): a peer on this very host.
  bool is_loopback() const;

  friend bool operator==(const socket_address& a, const socket_address& b);
};

/// Parses "host:port", "[v6]:port" or a bare IPv6 with port after the last colon in brackets.
/// Host names are resolved (getaddrinfo, first result).
expected<socket_address> parse_address(std::string_view text);

}  // namespace mesh::transport
