#pragma once
// Test helper: a handshake flood that speaks real QUIC. Each attempt is a fresh ngtcp2 client
// connection with a throwaway node key (from a pool), sent from one of many UDP sockets (several
// loopback source addresses, several ports each). It answers Retries and finishes TLS where the
// server lets it, then never sends the admission proof: every attempt the server accepts holds a
// half-open slot until the server's deadline. Runs on its own thread; bounded in time and memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/tls.hpp"

namespace mesh::transport::test {

struct flood_stats {
  uint64_t attempts = 0;        ///< new connections started (a first Initial sent)
  uint64_t retries = 0;         ///< Retry packets received and answered
  uint64_t handshakes = 0;      ///< TLS handshakes the server let finish
  uint64_t peak_live = 0;       ///< most client connections alive at once (flooder memory)
};

class flooder {
 public:
  /// Floods 127.0.0.1:`port` (the node `server`) at `per_second` attempts from `sources`
  /// ("127.0.0.x" each), `ports_per_source` sockets each, with `keys` throwaway identities.
  flooder(uint16_t port, node_id server, std::vector<std::string> sources, int ports_per_source, int keys)
      : server_id_(server) {
    server_addr_.sin_family = AF_INET;
    server_addr_.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &server_addr_.sin_addr);
    for (const auto& s : sources)
      for (int i = 0; i < ports_per_source; ++i) {
        sock so;
        so.fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        inet_pton(AF_INET, s.c_str(), &a.sin_addr);
        if (so.fd < 0 || ::bind(so.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) continue;
        socklen_t len = sizeof(so.local);
        getsockname(so.fd, reinterpret_cast<sockaddr*>(&so.local), &len);
        socks_.push_back(so);
      }
    for (int i = 0; i < keys; ++i)
      if (auto c = tls_context::create(identity::generate())) ctxs_.push_back(std::move(*c));
  }
  ~flooder() {
    stop();
    for (auto& s : socks_) ::close(s.fd);
  }
  bool ready() const { return !socks_.empty() && !ctxs_.empty(); }
  size_t sockets() const { return socks_.size(); }

  void start(double per_second, std::chrono::milliseconds duration) {
    thread_ = std::thread([this, per_second, duration] { run(per_second, duration); });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool running() const { return !done_; }
  flood_stats stats() const {
    return {attempts_.load(), retries_.load(), handshakes_.load(), peak_live_.load()};
  }

 private:
  struct sock {
    int fd = -1;
    sockaddr_in local{};
  };
  struct attempt {
    flooder* owner = nullptr;
    size_t sock = 0;
    ngtcp2_conn* conn = nullptr;
    gnutls_session_t tls = nullptr;
    ngtcp2_crypto_conn_ref ref{};
    tls_peer_check check;
    uint64_t last_rx = 0;
    uint64_t born = 0;
    std::vector<std::string> cids;  // by_cid_ keys of this attempt
    ~attempt() {
      if (conn) ngtcp2_conn_del(conn);
      free_tls_session(tls);
    }
  };

  static uint64_t now() {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
  }
  static std::string key(const uint8_t* d, size_t n) { return {reinterpret_cast<const char*>(d), n}; }

  ngtcp2_path path_of(const sock& s) {
    ngtcp2_path p{};
    p.local.addr = reinterpret_cast<sockaddr*>(const_cast<sockaddr_in*>(&s.local));
    p.local.addrlen = sizeof(sockaddr_in);
    p.remote.addr = reinterpret_cast<sockaddr*>(&server_addr_);
    p.remote.addrlen = sizeof(server_addr_);
    return p;
  }

  static ngtcp2_callbacks callbacks() {
    ngtcp2_callbacks cb{};
    cb.client_initial = ngtcp2_crypto_client_initial_cb;
    cb.recv_retry = [](ngtcp2_conn* c, const ngtcp2_pkt_hd* hd, void* ud) {
      ++static_cast<attempt*>(ud)->owner->retries_;
      return ngtcp2_crypto_recv_retry_cb(c, hd, ud);
    };
    cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
    cb.encrypt = ngtcp2_crypto_encrypt_cb;
    cb.decrypt = ngtcp2_crypto_decrypt_cb;
    cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
    cb.update_key = ngtcp2_crypto_update_key_cb;
    cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
    cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
    cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
    cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
    cb.rand = [](uint8_t* d, size_t n, const ngtcp2_rand_ctx*) { randombytes_buf(d, n); };
    cb.get_new_connection_id = [](ngtcp2_conn*, ngtcp2_cid* cid, uint8_t* token, size_t len, void* ud) {
      cid->datalen = len;
      randombytes_buf(cid->data, len);
      randombytes_buf(token, NGTCP2_STATELESS_RESET_TOKENLEN);
      auto* a = static_cast<attempt*>(ud);
      a->owner->by_cid_[key(cid->data, cid->datalen)] = a;
      a->cids.push_back(key(cid->data, cid->datalen));
      return 0;
    };
    cb.handshake_completed = [](ngtcp2_conn*, void* ud) {
      ++static_cast<attempt*>(ud)->owner->handshakes_;
      return 0;  // and then nothing: no admission proof, ever
    };
    return cb;
  }

  void new_attempt(uint64_t ts) {
    auto a = std::make_unique<attempt>();
    a->owner = this;
    a->sock = next_sock_++ % socks_.size();
    a->check.expected = server_id_;
    a->ref.get_conn = [](ngtcp2_crypto_conn_ref* r) { return static_cast<attempt*>(r->user_data)->conn; };
    a->ref.user_data = a.get();
    ngtcp2_cid dcid{}, scid{};
    dcid.datalen = scid.datalen = 18;
    randombytes_buf(dcid.data, 18);
    randombytes_buf(scid.data, 18);
    ngtcp2_settings settings;
    ngtcp2_settings_default(&settings);
    settings.initial_ts = ts;
    ngtcp2_transport_params params;
    ngtcp2_transport_params_default(&params);
    // Room for the server's control stream: a refused stream would end the attempt early,
    // freeing its slot; a real attacker keeps it open.
    params.initial_max_streams_uni = 3;
    params.initial_max_data = 1 << 20;
    params.initial_max_stream_data_uni = 1 << 16;
    auto path = path_of(socks_[a->sock]);
    auto cb = callbacks();
    if (ngtcp2_conn_client_new(&a->conn, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &cb, &settings, &params, nullptr,
                               a.get()) != 0)
      return;
    auto s = make_tls_session(*ctxs_[attempts_ % ctxs_.size()], false, &a->ref, &a->check);
    if (!s) return;
    a->tls = *s;
    ngtcp2_conn_set_tls_native_handle(a->conn, a->tls);
    a->last_rx = a->born = ts;
    by_cid_[key(scid.data, scid.datalen)] = a.get();
    a->cids.push_back(key(scid.data, scid.datalen));
    attempt* raw = a.get();
    live_.emplace(raw, std::move(a));
    ++attempts_;
    write(*raw, ts);
  }

  void write(attempt& a, uint64_t ts) {
    uint8_t buf[1500];
    auto path = path_of(socks_[a.sock]);
    for (int i = 0; i < 8; ++i) {
      ngtcp2_pkt_info pi{};
      auto n = ngtcp2_conn_write_pkt(a.conn, &path, &pi, buf, sizeof(buf), ts);
      if (n <= 0) return;
      ::sendto(socks_[a.sock].fd, buf, static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&server_addr_),
               sizeof(server_addr_));
    }
  }

  void receive(uint64_t ts) {
    uint8_t buf[65536];
    for (size_t i = 0; i < socks_.size(); ++i) {
      for (int k = 0; k < 64; ++k) {
        auto n = ::recv(socks_[i].fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        ngtcp2_version_cid vc{};
        if (ngtcp2_pkt_decode_version_cid(&vc, buf, static_cast<size_t>(n), 18) != 0) continue;
        auto it = by_cid_.find(key(vc.dcid, vc.dcidlen));
        if (it == by_cid_.end() || !live_.count(it->second)) continue;
        attempt& a = *it->second;
        auto path = path_of(socks_[i]);
        ngtcp2_pkt_info pi{};
        a.last_rx = ts;
        if (ngtcp2_conn_read_pkt(a.conn, &path, &pi, buf, static_cast<size_t>(n), ts) != 0) {
          forget(&a);
          continue;
        }
        write(a, ts);
      }
    }
  }

  void forget(attempt* a) {
    for (const auto& c : a->cids) by_cid_.erase(c);
    live_.erase(a);
  }

  void run(double per_second, std::chrono::milliseconds duration) {
    const uint64_t t0 = now();
    const uint64_t end = t0 + static_cast<uint64_t>(duration.count()) * 1'000'000u;
    std::vector<pollfd> fds;
    for (auto& s : socks_) fds.push_back({s.fd, POLLIN, 0});
    while (!stop_) {
      uint64_t ts = now();
      if (ts >= end) break;
      const auto due = static_cast<uint64_t>(static_cast<double>(ts - t0) / 1e9 * per_second);
      while (attempts_ < due) new_attempt(ts);
      ::poll(fds.data(), fds.size(), 1);
      ts = now();
      receive(ts);
      // An attempt is forgotten after 300 ms of silence from the server (refused, or holding a
      // slot there that it no longer needs to serve) or 3 s: the flooder's memory stays bounded.
      std::vector<attempt*> old;
      for (auto& [p, a] : live_)
        if (ts - a->last_rx > 300'000'000u || ts - a->born > 3'000'000'000u) old.push_back(p);
      for (auto* p : old) forget(p);
      peak_live_ = std::max<uint64_t>(peak_live_, live_.size());
    }
    by_cid_.clear();
    live_.clear();
    done_ = true;
  }

  node_id server_id_;
  sockaddr_in server_addr_{};
  std::vector<sock> socks_;
  std::vector<std::unique_ptr<tls_context>> ctxs_;
  std::unordered_map<attempt*, std::unique_ptr<attempt>> live_;
  std::unordered_map<std::string, attempt*> by_cid_;
  size_t next_sock_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false}, done_{false};
  std::atomic<uint64_t> attempts_{0}, retries_{0}, handshakes_{0}, peak_live_{0};
};

}  // namespace mesh::transport::test
