// bench_messages: remote messages per second between two nodes' transports, with references
// measured in the same run.
//
//   node messages   msg::heartbeat values encoded with msg::encode_message, sent with
//                   endpoint::send on the control channel (reliable, ordered: what every node
//                   message but heartbeats uses), decoded with msg::decode_message at the receiver,
//                   which counts them. Two endpoints in one process on loopback, each with its I/O
//                   thread, and one sending thread (a node's core actor); at most `window`
//                   messages sent and not yet decoded (the receiver's pace bounds the sender).
//   two processes   the same between two processes (a forked receiver); the receiver reports
//                   its count back every 1024 messages with a message of its own, which is
//                   what paces the sender and what the rate is computed from.
//   actor to actor  the two-process figure with CAF actors at both ends, as in meshnode: the
//                   sender is an actor that encodes and sends each message it is given; at the
//                   receiver the endpoint's callback posts the bytes to a bridge actor, which
//                   decodes and forwards the message to the actor that owns it (here: one that
//                   counts). Same CAF scheduler as meshnode (work sharing, 2 threads).
//   udp reference   the same number of bytes per message as plain UDP datagrams on loopback, one
//                   send() and one recv() per message, same window: the kernel's per-datagram
//                   floor on this machine.
//   codec           encode + decode of the same message in one thread (no I/O at all).
//
// Usage: bench_messages [seconds=3] [window=20000] [repeats=3]; prints the best and median of
// the repeats for each figure. Build Release (build-rel) to measure; never a timed test.
#include <arpa/inet.h>
#include <csignal>
#include <sys/wait.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "wire/messages.hpp"
#include "transport/endpoint.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<mesh::msg::message>)

using namespace mesh;
using clk = std::chrono::steady_clock;

namespace {

msg::heartbeat sample_heartbeat(uint64_t seq) { return {1700000000123456789ull, seq, 3}; }

/// Runs `send_one` (returns false to back off) while at most `window` messages are outstanding
/// (sent minus `received`), for `warmup` then `seconds`; returns messages received per second
/// over the measured part.
template <class Send>
double paced_rate(Send send_one, const std::atomic<uint64_t>& received, size_t window, double seconds) {
  uint64_t sent = 0;
  const auto warmup_end = clk::now() + std::chrono::milliseconds(300);
  while (clk::now() < warmup_end) {
    if (sent - received.load(std::memory_order_relaxed) < window && send_one(sent)) ++sent;
    else std::this_thread::yield();
  }
  const uint64_t r0 = received.load();
  const auto t0 = clk::now();
  const auto end = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(seconds));
  uint64_t checks = 0;
  for (;;) {
    if ((++checks & 255) == 0 && clk::now() >= end) break;
    if (sent - received.load(std::memory_order_relaxed) < window && send_one(sent)) ++sent;
    else std::this_thread::yield();
  }
  const uint64_t r1 = received.load();
  return static_cast<double>(r1 - r0) / std::chrono::duration<double>(clk::now() - t0).count();
}

/// One endpoint on loopback with `h`; exits the process on failure.
std::unique_ptr<transport::endpoint> loopback_endpoint(transport::handlers h) {
  transport::endpoint_config c;
  c.bind = "127.0.0.1";
  c.protocol_version = msg::protocol_version;
  auto e = transport::endpoint::start(std::move(c), std::move(h));
  if (!e) {
    std::fprintf(stderr, "bench_messages: %s\n", e.error().message.c_str());
    std::exit(1);
  }
  return std::move(*e);
}

/// Node messages over two QUIC endpoints. Returns messages per second, or < 0 on failure.
double node_messages(double seconds, size_t window, size_t* message_bytes) {
  std::atomic<uint64_t> received{0}, bad{0};
  std::mutex mu;
  std::condition_variable cv;
  int ups = 0;
  auto make_handlers = [&](bool receiver) {
    transport::handlers h;
    h.on_peer_up = [&](const node_id&, const transport::peer_info&) {
      std::lock_guard l(mu);
      ++ups;
      cv.notify_all();
    };
    if (receiver) {
      h.on_message = [&](const node_id&, transport::channel, std::vector<uint8_t> bytes) {
        auto m = msg::decode_message(bytes.data(), bytes.size());
        if (m && std::holds_alternative<msg::heartbeat>(*m)) received.fetch_add(1, std::memory_order_relaxed);
        else bad.fetch_add(1, std::memory_order_relaxed);
      };
    }
    return h;
  };
  auto a = loopback_endpoint(make_handlers(false)), b = loopback_endpoint(make_handlers(true));
  a->dial(b->id(), {"127.0.0.1:" + std::to_string(b->port())});
  {
    std::unique_lock l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return ups >= 2; })) {
      std::fprintf(stderr, "bench_messages: the endpoints did not connect\n");
      return -1;
    }
  }
  const auto to = b->id();
  *message_bytes = msg::encode_message(sample_heartbeat(1))->size();
  uint64_t refused = 0;
  const double rate = paced_rate(
      [&](uint64_t seq) {
        auto bytes = msg::encode_message(sample_heartbeat(seq));
        if (a->send(to, transport::channel::control, std::move(*bytes))) return true;
        ++refused;
        return false;
      },
      received, window, seconds);
  if (bad.load() || refused) std::fprintf(stderr, "bench_messages: %llu undecodable, %llu refused sends\n",
                                          static_cast<unsigned long long>(bad.load()), static_cast<unsigned long long>(refused));
  a->stop();
  b->stop();
  return rate;
}

using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using send_atom = caf::atom_constant<caf::atom("send")>;

/// meshnode's actor scheduler (actors/node.cpp): work sharing, two threads.
caf::actor_system_config node_like_config() {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  return cfg;
}

/// Counts received heartbeats and acknowledges every 1024th (a heartbeat whose seq is the count).
struct counter {
  transport::endpoint* ep = nullptr;
  uint64_t count = 0;
  void on(const node_id& from, const msg::message& m) {
    if (!std::holds_alternative<msg::heartbeat>(m) || (++count & 1023) != 0) return;
    if (auto ack = msg::encode_message(msg::heartbeat{0, count, 0, 0})) (void)ep->send(from, transport::channel::control, std::move(*ack));
  }
};

/// The receiving node of the two-process figures: counts decoded messages and reports the count
/// every 1024; exits when the sender goes away. With `actors`, messages take meshnode's path:
/// endpoint callback -> bridge actor (decode) -> owning actor (count).
[[noreturn]] void receiver_process(int report_fd, bool actors) {
  std::mutex mu;
  std::condition_variable cv;
  bool gone = false;
  counter c;
  std::optional<caf::actor_system_config> sys_cfg;
  std::optional<caf::actor_system> sys;
  caf::actor bridge;
  if (actors) {
    sys_cfg.emplace(node_like_config());
    sys.emplace(*sys_cfg);
    auto owner = sys->spawn([&c](caf::event_based_actor*) -> caf::behavior {
      return {[&c](inbound_atom, std::string from, std::shared_ptr<msg::message> m) { c.on(*node_id::parse(from), *m); }};
    });
    bridge = sys->spawn([owner](caf::event_based_actor* self) -> caf::behavior {
      return {[self, owner](inbound_atom, std::string from, std::vector<uint8_t> bytes) {
        auto m = msg::decode_message(bytes.data(), bytes.size());
        if (m) self->send(owner, inbound_atom::value, std::move(from), std::make_shared<msg::message>(std::move(*m)));
      }};
    });
  }
  transport::handlers h;
  h.on_peer_down = [&](const node_id&, const transport::peer_down&) {
    std::lock_guard l(mu);
    gone = true;
    cv.notify_all();
  };
  h.on_message = [&](const node_id& from, transport::channel, std::vector<uint8_t> bytes) {
    if (actors) {
      caf::anon_send(bridge, inbound_atom::value, from.to_string(), std::move(bytes));
      return;
    }
    if (auto m = msg::decode_message(bytes.data(), bytes.size())) c.on(from, *m);
  };
  auto ep = loopback_endpoint(std::move(h));
  c.ep = ep.get();
  const std::string line = ep->id().to_string() + "@127.0.0.1:" + std::to_string(ep->port()) + "\n";
  if (::write(report_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(1);
  ::close(report_fd);
  std::unique_lock l(mu);
  cv.wait_for(l, std::chrono::minutes(5), [&] { return gone; });
  l.unlock();
  ep->stop();
  std::_Exit(0);
}

/// Node messages between two processes (see the file comment), from a sending thread or, with
/// `actors`, from actor to actor. Returns messages per second.
double node_messages_two_processes(double seconds, size_t window, bool actors) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    receiver_process(fds[1], actors);
  }
  ::close(fds[1]);
  std::string line;
  char c;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(fds[0]);
  const auto at = line.find('@');
  auto peer = node_id::parse(line.substr(0, at == std::string::npos ? 0 : at));
  if (!peer) {
    std::fprintf(stderr, "bench_messages: the receiver process did not start\n");
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    return -1;
  }
  std::atomic<uint64_t> acked{0};
  std::mutex mu;
  std::condition_variable cv;
  bool up = false;
  transport::handlers h;
  h.on_peer_up = [&](const node_id&, const transport::peer_info&) {
    std::lock_guard l(mu);
    up = true;
    cv.notify_all();
  };
  h.on_message = [&](const node_id&, transport::channel, std::vector<uint8_t> bytes) {
    auto m = msg::decode_message(bytes.data(), bytes.size());
    if (m && std::holds_alternative<msg::heartbeat>(*m)) acked.store(std::get<msg::heartbeat>(*m).seq);
  };
  auto ep = loopback_endpoint(std::move(h));
  ep->dial(*peer, {line.substr(at + 1)});
  double rate = -1;
  {
    std::unique_lock l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(10), [&] { return up; })) std::fprintf(stderr, "bench_messages: no connection to the receiver process\n");
  }
  if (up && !actors) {
    rate = paced_rate(
        [&](uint64_t seq) {
          auto bytes = msg::encode_message(sample_heartbeat(seq));
          return ep->send(*peer, transport::channel::control, std::move(*bytes)).has_value();
        },
        acked, window, seconds);
  } else if (up) {
    // The sending actor encodes and sends what it is told to; this thread only paces it.
    caf::actor_system_config cfg = node_like_config();
    caf::actor_system sys{cfg};
    transport::endpoint* e = ep.get();
    const node_id to = *peer;
    auto sender = sys.spawn([e, to](caf::event_based_actor*) -> caf::behavior {
      return {[e, to](send_atom, uint64_t seq) {
        if (auto bytes = msg::encode_message(sample_heartbeat(seq))) (void)e->send(to, transport::channel::control, std::move(*bytes));
      }};
    });
    rate = paced_rate(
        [&](uint64_t seq) {
          caf::anon_send(sender, send_atom::value, seq);
          return true;
        },
        acked, window, seconds);
    caf::anon_send_exit(sender, caf::exit_reason::user_shutdown);
  }
  ep->stop();  // the receiver sees us leave and exits
  int status = 0;
  ::waitpid(child, &status, 0);
  return rate;
}

/// Plain UDP datagrams of `bytes` on loopback, one syscall per datagram on each side.
double udp_reference(double seconds, size_t window, size_t bytes) {
  int rx = ::socket(AF_INET, SOCK_DGRAM, 0), tx = ::socket(AF_INET, SOCK_DGRAM, 0);
  int buf = 8 << 20;
  ::setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(rx, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(rx, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::connect(tx, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("bench_messages: udp");
    return -1;
  }
  timeval tv{0, 100000};
  ::setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::atomic<uint64_t> received{0};
  std::atomic<bool> done{false};
  std::thread receiver([&] {
    std::vector<uint8_t> in(2048);
    while (!done.load(std::memory_order_relaxed))
      if (::recv(rx, in.data(), in.size(), 0) > 0) received.fetch_add(1, std::memory_order_relaxed);
  });
  std::vector<uint8_t> out(bytes, 0x5a);
  const double rate = paced_rate([&](uint64_t) { return ::send(tx, out.data(), out.size(), 0) > 0; }, received, window, seconds);
  done = true;
  receiver.join();
  ::close(rx);
  ::close(tx);
  return rate;
}

/// encode_message + decode_message of one heartbeat, back to back in one thread.
double codec_rate(double seconds) {
  uint64_t n = 0;
  const auto t0 = clk::now();
  const auto end = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(seconds));
  while (clk::now() < end) {
    for (int i = 0; i < 1000; ++i, ++n) {
      auto bytes = msg::encode_message(sample_heartbeat(n));
      auto m = msg::decode_message(bytes->data(), bytes->size());
      if (!m) std::abort();
    }
  }
  return static_cast<double>(n) / std::chrono::duration<double>(clk::now() - t0).count();
}

void report(const char* what, std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  std::printf("%-52s best %9.0f /s   median %9.0f /s\n", what, xs.back(), xs[xs.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  const size_t window = argc > 2 ? static_cast<size_t>(std::atol(argv[2])) : 20000;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  std::vector<double> node, node2, actors, udp, codec;
  size_t bytes = 0;
  // Interleaved, so that a noisy neighbour on the machine hits all figures alike.
  for (int r = 0; r < repeats; ++r) {
    const double n = node_messages(seconds, window, &bytes);
    if (n < 0) return 1;
    node.push_back(n);
    const double n2 = node_messages_two_processes(seconds, window, false);
    if (n2 < 0) return 1;
    node2.push_back(n2);
    const double na = node_messages_two_processes(seconds, window, true);
    if (na < 0) return 1;
    actors.push_back(na);
    udp.push_back(udp_reference(seconds, window, bytes));
    codec.push_back(codec_rate(seconds / 3));
  }
  std::printf("message: msg::heartbeat, %zu bytes encoded; window %zu; %d x %.1f s\n", bytes, window, repeats, seconds);
  report("node messages, QUIC control channel, decoded", node);
  report("  the same, two processes", node2);
  report("  the same, two processes, actor to actor", actors);
  report("reference: plain UDP datagrams, same size", udp);
  report("reference: encode + decode only, one thread", codec);
  std::sort(node.begin(), node.end());
  std::sort(udp.begin(), udp.end());
  std::sort(actors.begin(), actors.end());
  std::printf("ratio node messages / UDP datagrams (median): %.2f; target 200000 /s actor to actor: %s\n",
              node[node.size() / 2] / udp[udp.size() / 2], actors[actors.size() / 2] >= 200000 ? "met" : "NOT met");
  return 0;
}
