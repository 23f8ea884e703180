#include "transport/address.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstring>

namespace mesh::transport {

uint16_t socket_address::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

socket_address socket_address::unmapped() const {
  if (family() != AF_INET6) return *this;
  auto* a6 = reinterpret_cast<const sockaddr_in6*>(&storage);
  if (!IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) return *this;
  socket_address out;
  auto* a4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  a4->sin_family = AF_INET;
  a4->sin_port = a6->sin6_port;
  std::memcpy(&a4->sin_addr, a6->sin6_addr.s6_addr + 12, 4);
  out.len = sizeof(sockaddr_in);
  return out;
}

bool socket_address::is_loopback() const {
  socket_address u = unmapped();
  if (u.family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&u.storage)->sin_addr.s_addr) >> 24) == 127;
  if (u.family() == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&u.storage)->sin6_addr);
  return false;
}

std::string socket_address::to_string() const {
  socket_address u = unmapped();
  char buf[INET6_ADDRSTRLEN] = {};
  if (u.family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&u.storage)->sin_addr, buf, sizeof(buf));
    std::string out(buf);
    out.append(":").append(std::to_string(u.port()));
    return out;
  }
  if (u.family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&u.storage)->sin6_addr, buf, sizeof(buf));
    // Built by append: g++ 12 -O2 reports a false -Wrestrict on the operator+ chain.
    std::string out("[");
    out.append(buf).append("]:").append(std::to_string(u.port()));
    return out;
  }
  return "(no address)";
}

expected<socket_address> socket_address::for_family(int fam) const {
  if (family() == fam) return *this;
  if (fam == AF_INET6 && family() == AF_INET) {
    socket_address out;
    auto* a4 = reinterpret_cast<const sockaddr_in*>(&storage);
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = a4->sin_port;
    a6->sin6_addr.s6_addr[10] = 0xff;
    a6->sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(a6->sin6_addr.s6_addr + 12, &a4->sin_addr, 4);
    out.len = sizeof(sockaddr_in6);
    return out;
  }
  if (fam == AF_INET) {
    socket_address u = unmapped();
    if (u.family() == AF_INET) return u;
  }
  return make_error(error_code::unsupported, "cannot reach " + to_string() + " from a socket of this family");
}

bool operator==(const socket_address& a, const socket_address& b) {
  socket_address x = a.unmapped(), y = b.unmapped();
  if (x.family() != y.family() || x.port() != y.port()) return false;
  if (x.family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&x.storage)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&y.storage)->sin_addr.s_addr;
  if (x.family() == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&x.storage)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&y.storage)->sin6_addr, 16) == 0;
  return false;
}

expected<socket_address> parse_address(std::string_view text) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return make_error(error_code::invalid_argument, "bad address '" + std::string(text) + "': expected [v6]:port");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon)
      return make_error(error_code::invalid_argument,
                        "bad address '" + std::string(text) + "': expected host:port or [v6]:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || port.empty())
    return make_error(error_code::invalid_argument, "bad address '" + std::string(text) + "'");
  // getaddrinfo takes "99999" and wraps it to 34463: check the port ourselves.
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535)
    return make_error(error_code::invalid_argument, "bad address '" + std::string(text) + "': the port must be 0-65535");
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rv = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rv != 0 || !res)
    return make_error(error_code::not_found, "cannot resolve '" + std::string(text) + "': " + gai_strerror(rv));
  socket_address out;
  std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

}  // namespace mesh::transport
