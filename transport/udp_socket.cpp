#include "transport/udp_socket.hpp"

#include <fcntl.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace mesh::transport {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

udp_socket& udp_socket::operator=(udp_socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    local_ = o.local_;
    gso_ = o.gso_;
    o.fd_ = -1;
  }
  return *this;
}

udp_socket::~udp_socket() {
  if (fd_ >= 0) ::close(fd_);
}

expected<udp_socket> udp_socket::open(const std::string& bind_host, uint16_t port, int buffer_bytes) {
  std::string host = bind_host.find(':') != std::string::npos ? "[" + bind_host + "]" : bind_host;
  auto addr = parse_address(host + ":" + std::to_string(port));
  if (!addr) return tl::unexpected(addr.error());
  udp_socket s;
  s.fd_ = ::socket(addr->family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s.fd_ < 0) return make_error(error_code::io_error, "cannot create UDP socket: " + errno_text());
  int zero = 0, one = 1;
  if (addr->family() == AF_INET6) ::setsockopt(s.fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  // Large buffers keep bursts from being dropped; the FORCE variants pass the sysctl caps when
  // we are root, the plain ones are the best an unprivileged process can do.
  for (int opt : {SO_RCVBUF, SO_SNDBUF}) {
    int force = opt == SO_RCVBUF ? SO_RCVBUFFORCE : SO_SNDBUFFORCE;
    if (::setsockopt(s.fd_, SOL_SOCKET, force, &buffer_bytes, sizeof(buffer_bytes)) != 0)
      ::setsockopt(s.fd_, SOL_SOCKET, opt, &buffer_bytes, sizeof(buffer_bytes));
  }
  ::setsockopt(s.fd_, IPPROTO_UDP, UDP_GRO, &one, sizeof(one));
  if (::bind(s.fd_, addr->get(), addr->len) != 0)
    return make_error(error_code::io_error, "cannot bind UDP " + addr->to_string() + ": " + errno_text());
  s.local_.len = sizeof(s.local_.storage);
  ::getsockname(s.fd_, s.local_.get(), &s.local_.len);
  int seg = 1200;
  s.gso_ = ::setsockopt(s.fd_, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof(seg)) == 0;
  if (s.gso_) {
    seg = 0;  // per-call segment sizes go in a cmsg; leave the socket default off
    ::setsockopt(s.fd_, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof(seg));
  }
  return s;
}

udp_socket::send_result udp_socket::send(const socket_address& to, const uint8_t* data, size_t len, size_t segment,
                                         size_t* sent) {
  *sent = 0;
  while (*sent < len) {
    size_t left = len - *sent;
    iovec iov{const_cast<uint8_t*>(data + *sent), left};
    msghdr msg{};
    msg.msg_name = const_cast<sockaddr*>(to.get());
    msg.msg_namelen = to.len;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(uint16_t))] = {};
    bool batched = gso_ && left > segment;
    if (!batched) iov.iov_len = std::min(left, segment);
    if (batched) {
      // The kernel caps one GSO call at 64 segments and 64 KiB.
      size_t max_segments = std::min<size_t>(64, 65000 / segment);
      if (max_segments < 2) {
        batched = false;
        iov.iov_len = segment;
      } else {
        iov.iov_len = std::min(left, max_segments * segment);
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        cmsghdr* cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = IPPROTO_UDP;
        cm->cmsg_type = UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t s16 = static_cast<uint16_t>(segment);
        std::memcpy(CMSG_DATA(cm), &s16, sizeof(s16));
      }
    }
    ssize_t n = ::sendmsg(fd_, &msg, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) return send_result::would_block;
      if (batched && (errno == EIO || errno == EINVAL)) {
        gso_ = false;  // the route cannot offload segmentation: fall back to one datagram per call
        continue;
      }
      // Unreachable destinations and the like: the datagram is lost, QUIC recovers or times out.
      *sent += iov.iov_len;
      continue;
    }
    *sent += iov.iov_len;
  }
  return send_result::sent;
}

size_t udp_socket::receive_batch(uint8_t* buf, size_t slot_size, size_t slots, received* out) {
  constexpr size_t max_slots = 16;
  slots = std::min(slots, max_slots);
  std::array<mmsghdr, max_slots> msgs{};
  std::array<iovec, max_slots> iovs{};
  struct control_space {
    alignas(cmsghdr) char bytes[CMSG_SPACE(sizeof(int))];
  };
  std::array<control_space, max_slots> controls{};
  for (size_t i = 0; i < slots; ++i) {
    iovs[i] = {buf + i * slot_size, slot_size};
    auto& h = msgs[i].msg_hdr;
    h.msg_name = out[i].from.get();
    h.msg_namelen = sizeof(out[i].from.storage);
    h.msg_iov = &iovs[i];
    h.msg_iovlen = 1;
    h.msg_control = controls[i].bytes;
    h.msg_controllen = sizeof(controls[i].bytes);
  }
  for (;;) {
    int n = ::recvmmsg(fd_, msgs.data(), static_cast<unsigned>(slots), 0, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      continue;  // ICMP errors surface here (ECONNREFUSED): nothing to read, try the next one
    }
    for (int i = 0; i < n; ++i) {
      auto& h = msgs[static_cast<size_t>(i)].msg_hdr;
      auto& r = out[i];
      r.from.len = h.msg_namelen;
      r.len = msgs[static_cast<size_t>(i)].msg_len;
      r.segment = r.len;
      for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm; cm = CMSG_NXTHDR(&h, cm)) {
        if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == UDP_GRO) {
          int seg = 0;
          std::memcpy(&seg, CMSG_DATA(cm), sizeof(seg));
          if (seg > 0) r.segment = static_cast<size_t>(seg);
        }
      }
    }
    return static_cast<size_t>(n);
  }
}

}  // namespace mesh::transport
