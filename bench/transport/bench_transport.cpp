// bench_transport: throughput, round trip, handshake and accept rate of the QUIC endpoint, each
// printed next to a reference (kernel TCP, plain UDP) measured in the same run on loopback.
//
//   bench_transport [--bulk-mib N] [--rounds N] [--rtt-count N] [--handshakes N] [--accept N]
//   bench_transport --exchange 1 [--bulk-mib N]  N MiB each way at once, BLAKE2b-checked
//   bench_transport --tbf 1 [--bulk-mib N]   (root) two network namespaces joined by a veth
//                                            link shaped to 1 Gbit/s with tbf, QUIC vs TCP
//
// Build Release (build-rel) to measure; never a timed test.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sodium.h>

#include "transport/endpoint.hpp"

using namespace mesh::transport;
using mesh::node_id;
using clk = std::chrono::steady_clock;

namespace {

struct waiter {
  std::mutex mu;
  std::condition_variable cv;
  size_t ups = 0, downs = 0, messages = 0, bytes = 0;
  std::atomic<endpoint*> recycle_to{nullptr};  // hands read messages back, as a node does
  template <class P>
  bool wait(P p, std::chrono::seconds t = std::chrono::seconds(120)) {
    std::unique_lock l(mu);
    return cv.wait_for(l, t, p);
  }
};

handlers counting(waiter& w, std::function<void(const node_id&, channel, std::vector<uint8_t>&)> echo = {}) {
  handlers h;
  h.on_peer_up = [&w](const node_id&, const peer_info&) {
    std::lock_guard l(w.mu);
    ++w.ups;
    w.cv.notify_all();
  };
  h.on_peer_down = [&w](const node_id&, const peer_down&) {
    std::lock_guard l(w.mu);
    ++w.downs;
    w.cv.notify_all();
  };
  h.on_message = [&w, echo](const node_id& from, channel ch, std::vector<uint8_t> b) {
    if (echo) echo(from, ch, b);
    std::lock_guard l(w.mu);
    ++w.messages;
    w.bytes += b.size();
    w.cv.notify_all();
    if (endpoint* e = w.recycle_to.load()) e->recycle(std::move(b));
  };
  return h;
}

std::unique_ptr<endpoint> start(handlers h, size_t udp_payload = 1452) {
  endpoint_config c;
  c.bind = "127.0.0.1";
  c.max_udp_payload = udp_payload;
  c.loopback_udp_payload = udp_payload;  // these endpoints talk over loopback: this size, nothing bigger
  auto e = endpoint::start(std::move(c), std::move(h));
  if (!e) {
    std::fprintf(stderr, "endpoint: %s\n", e.error().message.c_str());
    std::exit(1);
  }
  return std::move(*e);
}

std::string addr(const endpoint& e) { return "127.0.0.1:" + std::to_string(e.port()); }

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

// CPU seconds (user + system, all threads) this process has used: a load-independent cost.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// CPU seconds per GiB of the last bulk measurement.
double last_cpu_per_gib = 0;

// QUIC bulk: `mib` MiB as messages of `chunk_mib` MiB, one direction. `recycle`: the receiver
// hands each message back once read (endpoint::recycle), as meshnode does.
double quic_bulk(size_t mib, size_t chunk_mib, size_t udp_payload, bool recycle = true) {
  waiter wa, wb;
  auto a = start(counting(wa), udp_payload), b = start(counting(wb), udp_payload);
  if (recycle) wb.recycle_to = b.get();
  b->dial(a->id(), {addr(*a)});
  wa.wait([&] { return wa.ups == 1; });
  wb.wait([&] { return wb.ups == 1; });
  chunk_mib = std::min(chunk_mib, mib);
  size_t n = mib / chunk_mib;
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < n; ++i) payloads.emplace_back(chunk_mib << 20, static_cast<uint8_t>(i));
  auto t0 = clk::now();
  double c0 = cpu_seconds();
  // The sender's queue takes at most max_queued_bytes (2 GiB) of unacknowledged data: keep
  // half of that outstanding, so transfers of any size neither fail a send nor hang.
  const size_t window = std::max<size_t>(1, (endpoint_config{}.max_queued_bytes >> 20) / 2 / chunk_mib);
  for (size_t i = 0; i < n; ++i) {
    if (!wb.wait([&] { return wb.messages + window > i; }, std::chrono::seconds(600))) return 0;
    if (auto sent = a->send(b->id(), channel::bulk, std::move(payloads[i])); !sent) {
      std::fprintf(stderr, "send failed: %s\n", sent.error().message.c_str());
      return 0;
    }
  }
  if (!wb.wait([&] { return wb.messages == n; }, std::chrono::seconds(600))) return 0;
  double s = seconds_since(t0);
  last_cpu_per_gib = (cpu_seconds() - c0) / (static_cast<double>(n * chunk_mib) / 1024);
  return static_cast<double>(n * chunk_mib) / s;
}

/// A TCP socket listening on 127.0.0.1 (an ephemeral port, written to `sa`).
int listen_loopback(sockaddr_in& sa) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&sa), &len);
  ::listen(ls, 1);
  return ls;
}

double tcp_bulk(size_t mib) {
  sockaddr_in sa{};
  const int ls = listen_loopback(sa);
  size_t total = mib << 20;
  std::thread reader([&] {
    int s = ::accept(ls, nullptr, nullptr);
    std::vector<uint8_t> buf(1 << 20);
    size_t got = 0;
    while (got < total) {
      ssize_t n = ::read(s, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(s);
  });
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  ::connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  std::vector<uint8_t> buf(1 << 20, 1);
  auto t0 = clk::now();
  double c0 = cpu_seconds();
  size_t sent = 0;
  while (sent < total) {
    ssize_t n = ::write(c, buf.data(), std::min(buf.size(), total - sent));
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  reader.join();
  double s = seconds_since(t0);
  last_cpu_per_gib = (cpu_seconds() - c0) / (static_cast<double>(mib) / 1024);
  ::close(c);
  ::close(ls);
  return static_cast<double>(mib) / s;
}

// TCP moving the same messages as quic_bulk: `mib` MiB as messages of `chunk_mib` MiB sent from
// their own buffers (made before the clock starts, as quic_bulk's are), each read into a whole
// message buffer; two message buffers take turns on the receiver, as recycled ones do there.
// tcp_bulk's single hot 1 MiB buffer on each side never leaves the cache; these do, as a node's
// tensors do.
double tcp_messages(size_t mib, size_t chunk_mib, size_t io_piece = size_t{1} << 20) {
  chunk_mib = std::min(chunk_mib, mib);
  const size_t n = mib / chunk_mib, chunk = chunk_mib << 20;
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < n; ++i) payloads.emplace_back(chunk, static_cast<uint8_t>(i));
  sockaddr_in sa{};
  const int ls = listen_loopback(sa);
  std::thread reader([&] {
    int s = ::accept(ls, nullptr, nullptr);
    std::vector<uint8_t> messages[2] = {std::vector<uint8_t>(chunk), std::vector<uint8_t>(chunk)};
    for (size_t m = 0; m < n; ++m) {
      auto& buf = messages[m % 2];
      size_t got = 0;
      while (got < chunk) {
        ssize_t r = ::read(s, buf.data() + got, std::min<size_t>(chunk - got, io_piece));
        if (r <= 0) break;
        got += static_cast<size_t>(r);
      }
    }
    ::close(s);
  });
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  ::connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  auto t0 = clk::now();
  double c0 = cpu_seconds();
  for (auto& p : payloads) {
    size_t sent = 0;
    while (sent < p.size()) {
      ssize_t w = ::write(c, p.data() + sent, std::min<size_t>(p.size() - sent, io_piece));
      if (w <= 0) break;
      sent += static_cast<size_t>(w);
    }
  }
  reader.join();
  double s = seconds_since(t0);
  last_cpu_per_gib = (cpu_seconds() - c0) / (static_cast<double>(n * chunk_mib) / 1024);
  ::close(c);
  ::close(ls);
  return static_cast<double>(n * chunk_mib) / s;
}

struct percentiles {
  double median_us, p99_us;
};

percentiles summarize(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

percentiles quic_rtt(size_t count) {
  waiter wa, wb;
  std::unique_ptr<endpoint> b;
  auto a = start(counting(wa));
  b = start(counting(wb, [&b](const node_id& from, channel ch, std::vector<uint8_t>& m) {
    (void)b->send(from, ch, m);  // echo from the I/O thread: send only queues
  }));
  b->dial(a->id(), {addr(*a)});
  wa.wait([&] { return wa.ups == 1; });
  wb.wait([&] { return wb.ups == 1; });
  std::vector<double> us;
  for (size_t i = 0; i < count + 100; ++i) {
    auto t0 = clk::now();
    (void)a->send(b->id(), channel::control, std::vector<uint8_t>(32, 1));
    wa.wait([&] { return wa.messages == i + 1; });
    if (i >= 100) us.push_back(seconds_since(t0) * 1e6);  // first 100 warm up
  }
  return summarize(us);
}

percentiles udp_rtt(size_t count) {
  int s1 = ::socket(AF_INET, SOCK_DGRAM, 0), s2 = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sockaddr_in b = a;
  ::bind(s1, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::bind(s2, reinterpret_cast<sockaddr*>(&b), sizeof(b));
  socklen_t l = sizeof(a);
  ::getsockname(s1, reinterpret_cast<sockaddr*>(&a), &l);
  ::getsockname(s2, reinterpret_cast<sockaddr*>(&b), &l);
  std::thread echo([&] {
    uint8_t buf[64];
    for (size_t i = 0; i < count + 100; ++i) {
      sockaddr_in from{};
      socklen_t fl = sizeof(from);
      ssize_t n = ::recvfrom(s2, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &fl);
      ::sendto(s2, buf, static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), fl);
    }
  });
  std::vector<double> us;
  uint8_t msg[32] = {1}, buf[64];
  for (size_t i = 0; i < count + 100; ++i) {
    auto t0 = clk::now();
    ::sendto(s1, msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&b), sizeof(b));
    ::recv(s1, buf, sizeof(buf), 0);
    if (i >= 100) us.push_back(seconds_since(t0) * 1e6);
  }
  echo.join();
  ::close(s1);
  ::close(s2);
  return summarize(us);
}

// Ping-pong driven from the I/O threads themselves (both callbacks answer at once): the
// transport's own round trip, like the UDP reference, without application-thread hand-offs.
percentiles quic_rtt_io(size_t count) {
  waiter wa, wb;
  std::unique_ptr<endpoint> a, b;
  std::vector<double> us;
  us.reserve(count + 100);
  clk::time_point t0;
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  a = start(counting(wa, [&](const node_id& from, channel ch, std::vector<uint8_t>& m) {
    us.push_back(seconds_since(t0) * 1e6);
    if (us.size() < count + 100) {
      t0 = clk::now();
      (void)a->send(from, ch, m);
    } else {
      std::lock_guard l(done_mu);
      done = true;
      done_cv.notify_all();
    }
  }));
  b = start(counting(wb, [&b](const node_id& from, channel ch, std::vector<uint8_t>& m) { (void)b->send(from, ch, m); }));
  b->dial(a->id(), {addr(*a)});
  wa.wait([&] { return wa.ups == 1; });
  wb.wait([&] { return wb.ups == 1; });
  t0 = clk::now();
  (void)a->send(b->id(), channel::control, std::vector<uint8_t>(32, 1));
  std::unique_lock l(done_mu);
  done_cv.wait_for(l, std::chrono::seconds(120), [&] { return done; });
  l.unlock();
  a->stop();
  b->stop();
  us.erase(us.begin(), us.begin() + 100);  // warm-up
  return summarize(us);
}

// Dial -> both sides admitted, repeated with a fresh client endpoint each time.
percentiles handshakes(size_t count) {
  waiter ws;
  auto server = start(counting(ws));
  std::vector<double> us;
  for (size_t i = 0; i < count; ++i) {
    waiter wc;
    auto client = start(counting(wc));
    auto t0 = clk::now();
    client->dial(server->id(), {addr(*server)});
    wc.wait([&] { return wc.ups == 1; });
    us.push_back(seconds_since(t0) * 1e6);
    client->stop();
  }
  return summarize(us);
}

// `count` client endpoints dial one server at once; connections admitted per second.
double accept_rate(size_t count) {
  waiter ws;
  auto server = start(counting(ws));
  std::vector<std::unique_ptr<waiter>> waiters;  // declared first: outlives the clients calling into it
  std::vector<std::unique_ptr<endpoint>> clients;
  for (size_t i = 0; i < count; ++i) {
    waiters.push_back(std::make_unique<waiter>());
    clients.push_back(start(counting(*waiters.back())));
  }
  // Waves of 32, below the endpoint's bound on half-open connections (64): beyond it Initials
  // are dropped on purpose and the clients' retransmission timer, not the server, sets the pace.
  auto t0 = clk::now();
  for (size_t i = 0; i < count; i += 32) {
    size_t end = std::min(count, i + 32);
    for (size_t j = i; j < end; ++j) clients[j]->dial(server->id(), {addr(*server)});
    if (!ws.wait([&] { return ws.ups == end; }, std::chrono::seconds(60))) {
      std::printf("accept: only %zu of %zu admitted in 60 s\n", ws.ups, count);
      break;
    }
  }
  double s = seconds_since(t0);
  return static_cast<double>(ws.ups) / s;
}

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Runs `fn` on a thread inside network namespace `ns` (sockets and threads made there stay there).
template <class F>
void in_netns(const std::string& ns, F fn) {
  std::thread t([&] {
    int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
      std::fprintf(stderr, "cannot enter %s\n", ns.c_str());
      std::exit(1);
    }
    ::close(fd);
    fn();
  });
  t.join();
}

// 192.168.77.1 (ns a) <-> 192.168.77.2 (ns b), both directions shaped to 1 Gbit/s.
int tbf_bench(size_t mib) {
  std::string a = "mnt-bench-" + std::to_string(::getpid()) + "-a", b = "mnt-bench-" + std::to_string(::getpid()) + "-b";
  bool ok = sh("ip netns add " + a) && sh("ip netns add " + b) &&
            sh("ip -n " + a + " link add va type veth peer name vb netns " + b) &&
            sh("ip -n " + a + " addr add 192.168.77.1/24 dev va") && sh("ip -n " + b + " addr add 192.168.77.2/24 dev vb") &&
            sh("ip -n " + a + " link set va up") && sh("ip -n " + b + " link set vb up") &&
            sh("ip -n " + a + " link set lo up") && sh("ip -n " + b + " link set lo up") &&
            sh("ip netns exec " + a + " tc qdisc add dev va root tbf rate 1gbit burst 512kb latency 20ms") &&
            sh("ip netns exec " + b + " tc qdisc add dev vb root tbf rate 1gbit burst 512kb latency 20ms");
  struct cleanup {
    std::string a, b;
    ~cleanup() {
      sh("ip netns del " + a);
      sh("ip netns del " + b);
    }
  } guard{a, b};
  if (!ok) {
    std::printf("tbf: network namespace set-up failed (needs root, iproute2, tc tbf)\n");
    return 1;
  }
  const double link_mib = 1e9 / 8 / (1 << 20);

  // TCP reference over the same link.
  double tcp = 0;
  {
    int ls = -1;
    in_netns(b, [&] {
      ls = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(47001);
      inet_pton(AF_INET, "192.168.77.2", &sa.sin_addr);
      ::bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
      ::listen(ls, 1);
    });
    size_t total = mib << 20;
    std::thread reader([&] {
      int s = ::accept(ls, nullptr, nullptr);
      std::vector<uint8_t> buf(1 << 20);
      size_t got = 0;
      while (got < total) {
        ssize_t n = ::read(s, buf.data(), buf.size());
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      ::close(s);
    });
    int c = -1;
    in_netns(a, [&] { c = ::socket(AF_INET, SOCK_STREAM, 0); });
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(47001);
    inet_pton(AF_INET, "192.168.77.2", &sa.sin_addr);
    ::connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    std::vector<uint8_t> buf(1 << 20, 1);
    auto t0 = clk::now();
    size_t sent = 0;
    while (sent < total) {
      ssize_t n = ::write(c, buf.data(), std::min(buf.size(), total - sent));
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    reader.join();
    tcp = static_cast<double>(mib) / seconds_since(t0);
    ::close(c);
    ::close(ls);
  }

  waiter wa, wb;
  std::unique_ptr<endpoint> ea, eb;
  in_netns(a, [&] {
    endpoint_config c;
    c.bind = "192.168.77.1";
    ea = std::move(*endpoint::start(c, counting(wa)));
  });
  in_netns(b, [&] {
    endpoint_config c;
    c.bind = "192.168.77.2";
    eb = std::move(*endpoint::start(c, counting(wb)));
  });
  ea->dial(eb->id(), {"192.168.77.2:" + std::to_string(eb->port())});
  wa.wait([&] { return wa.ups == 1; });
  wb.wait([&] { return wb.ups == 1; });
  size_t n = std::max<size_t>(1, mib / 64);
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < n; ++i) payloads.emplace_back(std::min<size_t>(64, mib) << 20, static_cast<uint8_t>(i));
  auto t0 = clk::now();
  for (auto& p : payloads) (void)ea->send(eb->id(), channel::bulk, std::move(p));
  wb.wait([&] { return wb.messages == n; }, std::chrono::seconds(600));
  double quic = static_cast<double>(n * std::min<size_t>(64, mib)) / seconds_since(t0);
  std::printf("veth shaped to 1 Gbit/s (tbf, %.1f MiB/s), %zu MiB one way:\n", link_mib, mib);
  std::printf("  kernel TCP  %6.1f MiB/s  (%.0f%% of the link)\n", tcp, 100 * tcp / link_mib);
  std::printf("  QUIC        %6.1f MiB/s  (%.0f%% of the link, %.0f%% of TCP)\n", quic, 100 * quic / link_mib,
              100 * quic / tcp);
  ea.reset();
  eb.reset();
  return 0;
}

// The full-size check (the ASan test moves 96 MiB): `mib` MiB each way at once, as one
// message per direction, verified by BLAKE2b on both ends.
int exchange(size_t mib) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t> got_a, got_b;
  handlers ha, hb;
  waiter wa, wb;
  ha = counting(wa, [&](const node_id&, channel, std::vector<uint8_t>& m) {
    std::lock_guard l(mu);
    got_a = std::move(m);
    cv.notify_all();
  });
  hb = counting(wb, [&](const node_id&, channel, std::vector<uint8_t>& m) {
    std::lock_guard l(mu);
    got_b = std::move(m);
    cv.notify_all();
  });
  auto a = start(std::move(ha)), b = start(std::move(hb));
  b->dial(a->id(), {addr(*a)});
  wa.wait([&] { return wa.ups == 1; });
  wb.wait([&] { return wb.ups == 1; });
  auto fill = [](size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < n; i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
    }
    return v;
  };
  auto sum = [](const std::vector<uint8_t>& v) {
    std::array<uint8_t, 32> h{};
    crypto_generichash(h.data(), h.size(), v.data(), v.size(), nullptr, 0);
    return h;
  };
  auto to_b = fill(mib << 20, 1), to_a = fill(mib << 20, 2);
  auto sum_b = sum(to_b), sum_a = sum(to_a);
  auto t0 = clk::now();
  (void)a->send(b->id(), channel::bulk, std::move(to_b));
  (void)b->send(a->id(), channel::bulk, std::move(to_a));
  std::unique_lock l(mu);
  bool done = cv.wait_for(l, std::chrono::seconds(600), [&] { return !got_a.empty() && !got_b.empty(); });
  double s = seconds_since(t0);
  bool ok = done && sum(got_b) == sum_b && sum(got_a) == sum_a;
  std::printf("exchange %zu MiB each way at once: %.1f s (%.0f MiB/s total), checksums %s\n", mib, s,
              2.0 * static_cast<double>(mib) / s, ok ? "match" : "DIFFER");
  l.unlock();
  a->stop();
  b->stop();
  return ok ? 0 : 1;
}

size_t arg(int argc, char** argv, const char* name, size_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::stoul(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = arg(argc, argv, "--bulk-mib", 1024);
  size_t rtts = arg(argc, argv, "--rtt-count", 10000);
  size_t hs = arg(argc, argv, "--handshakes", 200);
  size_t acc = arg(argc, argv, "--accept", 100);
  if (arg(argc, argv, "--tbf", 0)) return tbf_bench(arg(argc, argv, "--bulk-mib", 256));
  if (arg(argc, argv, "--exchange", 0)) return exchange(mib);
  if (arg(argc, argv, "--only-rtt", 0)) {
    auto u = udp_rtt(rtts);
    auto qi = quic_rtt_io(rtts);
    std::printf("UDP %.1f/%.1f us, QUIC io %.1f/%.1f us\n", u.median_us, u.p99_us, qi.median_us, qi.p99_us);
    return 0;
  }
  if (arg(argc, argv, "--only-tcp", 0)) {
    for (size_t piece : {size_t{64} << 20, size_t{1} << 20, size_t{256} << 10}) {
      double m = tcp_messages(mib, 64, piece);
      std::printf("TCP 64 MiB messages, %zu KiB reads/writes: %.0f MiB/s, CPU %.2f s/GiB\n", piece >> 10, m, last_cpu_per_gib);
    }
    double t = tcp_bulk(mib);
    std::printf("TCP hot 1 MiB buffer: %.0f MiB/s, CPU %.2f s/GiB\n", t, last_cpu_per_gib);
    return 0;
  }
  if (arg(argc, argv, "--only-bulk", 0)) {
    double mbs = quic_bulk(mib, arg(argc, argv, "--chunk-mib", 64), arg(argc, argv, "--payload", 65000),
                           arg(argc, argv, "--recycle", 1) != 0);
    std::printf("QUIC bulk %zu MiB: %.0f MiB/s, CPU %.2f s/GiB\n", mib, mbs, last_cpu_per_gib);
    return 0;
  }

  // Rounds of TCP and the QUIC rows back to back: each QUIC figure is compared with the TCP
  // figure of its own round (this VM's speed drifts with its neighbours), and the medians of
  // those per-round shares are the result.
  const size_t rounds = std::max<size_t>(1, arg(argc, argv, "--rounds", 3));
  const size_t loopback = endpoint_config{}.loopback_udp_payload;  // what a node uses to a peer on this host
  struct row_def {
    const char* what;
    std::function<double()> measure;
    std::vector<double> share{}, share_msgs{}, cpu_ratio{}, mbs{}, cpu{};
  };
  std::vector<row_def> rows;
  rows.push_back({"QUIC as configured (64 KB packets), 64 MiB msgs", [&] { return quic_bulk(mib, 64, loopback); }});
  rows.push_back({"same, buffers not recycled (fresh pages)", [&] { return quic_bulk(mib, 64, loopback, false); }});
  rows.push_back({"QUIC as configured, one message", [&] { return quic_bulk(mib, mib, loopback); }});
  rows.push_back({"QUIC 1452 B packets (LAN size), 64 MiB msgs", [&] { return quic_bulk(mib, 64, 1452); }});
  std::vector<double> tcp_mbs, tcp_cpu, tcpm_mbs, tcpm_cpu;
  std::printf("bulk %zu MiB, loopback, one connection (CPU = user+system seconds per GiB, both ends), %zu rounds:\n", mib,
              rounds);
  for (size_t r = 0; r < rounds; ++r) {
    double t = tcp_bulk(mib), tc = last_cpu_per_gib;
    tcp_mbs.push_back(t);
    tcp_cpu.push_back(tc);
    double tm = tcp_messages(mib, 64);
    tcpm_mbs.push_back(tm);
    tcpm_cpu.push_back(last_cpu_per_gib);
    std::printf("  round %zu: TCP %.0f MiB/s (CPU %.2f s/GiB), TCP 64 MiB messages %.0f, QUIC rows:", r + 1, t, tc, tm);
    for (auto& row : rows) {
      double q = row.measure();
      row.mbs.push_back(q);
      row.cpu.push_back(last_cpu_per_gib);
      row.share.push_back(q / t);
      row.share_msgs.push_back(q / tm);
      row.cpu_ratio.push_back(last_cpu_per_gib / tc);
      std::printf(" %.0f (%.0f%%)", q, 100 * q / t);
    }
    std::printf("\n");
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("  %-48s %6.0f MiB/s                CPU %.2f s/GiB (medians)\n", "kernel TCP, one hot 1 MiB buffer each side",
              median(tcp_mbs), median(tcp_cpu));
  std::printf("  %-48s %6.0f MiB/s                CPU %.2f s/GiB\n", "kernel TCP, the same 64 MiB messages as QUIC",
              median(tcpm_mbs), median(tcpm_cpu));
  for (const auto& row : rows)
    std::printf("  %-48s %6.0f MiB/s  (%3.0f%% of TCP, %3.0f%% of TCP messages)  CPU %.2f s/GiB (%.1fx TCP)\n", row.what,
                median(row.mbs), 100 * median(row.share), 100 * median(row.share_msgs), median(row.cpu),
                median(row.cpu_ratio));

  auto u = udp_rtt(rtts);
  auto q = quic_rtt(rtts);
  std::printf("small-message round trip, 32 B, %zu samples (median / p99):\n", rtts);
  std::printf("  plain UDP, thread ping-pong          %7.1f / %7.1f us\n", u.median_us, u.p99_us);
  auto qi = quic_rtt_io(rtts);
  std::printf("  QUIC control, I/O-thread ping-pong   %7.1f / %7.1f us  (median %.2fx UDP)\n", qi.median_us,
              qi.p99_us, qi.median_us / u.median_us);
  std::printf("  QUIC control, from the main thread   %7.1f / %7.1f us  (median %.2fx UDP; adds two thread hand-offs)\n",
              q.median_us, q.p99_us, q.median_us / u.median_us);

  auto h = handshakes(hs);
  std::printf("handshake + admission, dial to peer up, %zu fresh clients: median %.0f us, p99 %.0f us\n", hs,
              h.median_us, h.p99_us);
  std::printf("accept rate: %zu clients dialing at once: %.0f connections/s admitted\n", acc, accept_rate(acc));
  return 0;
}
