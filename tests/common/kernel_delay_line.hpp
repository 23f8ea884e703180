#pragma once
// Delays packets inside the kernel's forwarding path, for kernels without sch_netem (this
// machine's has none). An iptables NFQUEUE rule hands each matching packet's verdict to user
// space; this class holds every verdict for `delay` and then accepts the packet, in arrival
// order. The packets themselves never leave the kernel: no proxy, no rewritten addresses, the
// endpoints' own sockets on both ends. Paired with nftables' `numgen random` for loss, it stands
// in for `tc qdisc add ... netem delay D loss P`.
//
// The netlink socket is opened inside network namespace `ns` (queues are per namespace), on a
// thread of its own; the destructor stops it, and the kernel drops what is still queued when the
// socket closes (the rule is removed with the namespace).
// glibc's network headers first: the kernel's then skip what glibc already defined.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

namespace mesh::test {

class kernel_delay_line {
 public:
  using clock = std::chrono::steady_clock;

  kernel_delay_line(const std::string& ns, uint16_t queue, std::chrono::milliseconds delay)
      : queue_(queue), delay_(delay) {
    std::atomic<int> state{0};  // 0 starting, 1 ready, -1 failed
    thread_ = std::thread([&] {
      if (!open_in(ns)) {
        state = -1;
        return;
      }
      state = 1;
      loop();
    });
    while (state == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ok_ = state == 1;
    if (!ok_) thread_.join();
  }
  ~kernel_delay_line() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  kernel_delay_line(const kernel_delay_line&) = delete;
  kernel_delay_line& operator=(const kernel_delay_line&) = delete;

  /// False when the queue could not be bound (no nfnetlink_queue, not root); `error()` says why.
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  /// Packets released so far (each after `delay`).
  uint64_t released() const { return released_; }

 private:
  struct held {
    uint32_t id;
    clock::time_point due;
  };

  // One nfnetlink message: header, nfgenmsg (family, queue number), then attributes.
  struct message {
    std::vector<uint8_t> bytes;
    message(uint16_t type, uint16_t flags, uint16_t queue) {
      bytes.resize(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)));
      auto* h = reinterpret_cast<nlmsghdr*>(bytes.data());
      h->nlmsg_type = static_cast<uint16_t>((NFNL_SUBSYS_QUEUE << 8) | type);
      h->nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
      auto* g = reinterpret_cast<nfgenmsg*>(bytes.data() + NLMSG_HDRLEN);
      g->nfgen_family = AF_UNSPEC;
      g->version = NFNETLINK_V0;
      g->res_id = htons(queue);
    }
    void attribute(uint16_t type, const void* data, size_t n) {
      size_t at = bytes.size();
      bytes.resize(at + NLA_ALIGN(NLA_HDRLEN + n));
      auto* a = reinterpret_cast<nlattr*>(bytes.data() + at);
      a->nla_type = type;
      a->nla_len = static_cast<uint16_t>(NLA_HDRLEN + n);
      std::memcpy(bytes.data() + at + NLA_HDRLEN, data, n);
    }
    std::vector<uint8_t>& done() {
      reinterpret_cast<nlmsghdr*>(bytes.data())->nlmsg_len = static_cast<uint32_t>(bytes.size());
      return bytes;
    }
  };

  // Sends `m` with an ACK request and waits for the kernel's answer (0 = accepted).
  bool request(message m, const char* what) {
    auto& b = m.done();
    reinterpret_cast<nlmsghdr*>(b.data())->nlmsg_flags |= NLM_F_ACK;
    if (::send(fd_, b.data(), b.size(), 0) < 0) return fail(what);
    uint8_t buf[8192];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < static_cast<ssize_t>(NLMSG_HDRLEN + sizeof(nlmsgerr))) return fail(what);
    auto* h = reinterpret_cast<nlmsghdr*>(buf);
    if (h->nlmsg_type != NLMSG_ERROR) return true;
    int err = reinterpret_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
    if (err == 0) return true;
    errno = -err;
    return fail(what);
  }
  bool fail(const char* what) {
    error_ = std::string(what) + ": " + std::strerror(errno);
    return false;
  }

  bool open_in(const std::string& ns) {
    int nsfd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || ::setns(nsfd, CLONE_NEWNET) != 0) {
      if (nsfd >= 0) ::close(nsfd);
      return fail("entering the network namespace");
    }
    ::close(nsfd);
    fd_ = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (fd_ < 0) return fail("netlink socket");
    sockaddr_nl local{};
    local.nl_family = AF_NETLINK;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) return fail("netlink bind");
    int big = 4 << 20;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);

    message bind_queue(NFQNL_MSG_CONFIG, 0, queue_);
    nfqnl_msg_config_cmd cmd{NFQNL_CFG_CMD_BIND, 0, htons(AF_INET)};
    bind_queue.attribute(NFQA_CFG_CMD, &cmd, sizeof cmd);
    if (!request(std::move(bind_queue), "binding the queue")) return false;
    // Only the metadata (the packet id) comes up: the payload stays in the kernel.
    message params(NFQNL_MSG_CONFIG, 0, queue_);
    nfqnl_msg_config_params p{htonl(0), NFQNL_COPY_META};
    params.attribute(NFQA_CFG_PARAMS, &p, sizeof p);
    uint32_t maxlen = htonl(16384);  // 50 ms of a few hundred Mbit/s of 1,500 B packets
    params.attribute(NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
    return request(std::move(params), "configuring the queue");
  }

  void verdict_accept(uint32_t id) {
    message m(NFQNL_MSG_VERDICT, 0, queue_);
    nfqnl_msg_verdict_hdr v{htonl(NF_ACCEPT), htonl(id)};
    m.attribute(NFQA_VERDICT_HDR, &v, sizeof v);
    auto& b = m.done();
    ::send(fd_, b.data(), b.size(), 0);
    ++released_;
  }

  // Packet ids from one receive: each message is an NFQNL_MSG_PACKET with an NFQA_PACKET_HDR.
  void take(const uint8_t* buf, size_t n, clock::time_point now) {
    for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
      if ((h->nlmsg_type & 0xff) != NFQNL_MSG_PACKET) continue;
      size_t off = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg));
      while (off + NLA_HDRLEN <= h->nlmsg_len) {
        auto* a = reinterpret_cast<const nlattr*>(reinterpret_cast<const uint8_t*>(h) + off);
        if (a->nla_len < NLA_HDRLEN || off + a->nla_len > h->nlmsg_len) break;
        if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR && a->nla_len >= NLA_HDRLEN + sizeof(nfqnl_msg_packet_hdr)) {
          nfqnl_msg_packet_hdr ph;
          std::memcpy(&ph, reinterpret_cast<const uint8_t*>(a) + NLA_HDRLEN, sizeof ph);
          held_.push_back({ntohl(ph.packet_id), now + delay_});
        }
        off += NLA_ALIGN(a->nla_len);
      }
    }
  }

  void loop() {
    std::vector<uint8_t> buf(1 << 16);
    while (!stop_) {
      auto now = clock::now();
      while (!held_.empty() && held_.front().due <= now) {
        verdict_accept(held_.front().id);
        held_.pop_front();
      }
      int wait_ms = 20;
      if (!held_.empty()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(held_.front().due - now).count();
        wait_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(left, 20)));
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, wait_ms) <= 0) continue;
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n > 0) take(buf.data(), static_cast<size_t>(n), clock::now());
    }
  }

  uint16_t queue_;
  std::chrono::milliseconds delay_;
  int fd_ = -1;
  bool ok_ = false;
  std::string error_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> released_{0};
  std::deque<held> held_;
  std::thread thread_;
};

}  // namespace mesh::test
