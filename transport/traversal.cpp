#include "transport/traversal.hpp"

#include <arpa/inet.h>
#include <sodium.h>

#include <cstring>

namespace mesh::transport {

namespace {
constexpr size_t relay_header_size = 2 + sizeof(relay_nonce) + 8;  // kind, channel, session, seq
}

std::vector<uint8_t> encode_address(const socket_address& addr) {
  // Sized up front and filled with memcpy: g++ 12 -O2 warns falsely on push_back + insert here.
  socket_address a = addr.unmapped();
  bool v4 = a.family() == AF_INET;
  size_t ip_len = v4 ? 4 : 16;
  std::vector<uint8_t> out(1 + ip_len + 2);
  out[0] = v4 ? 4 : 6;
  if (v4)
    std::memcpy(out.data() + 1, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, 4);
  else
    std::memcpy(out.data() + 1, reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr.s6_addr, 16);
  uint16_t port = a.port();
  out[1 + ip_len] = static_cast<uint8_t>(port >> 8);
  out[2 + ip_len] = static_cast<uint8_t>(port);
  return out;
}

expected<socket_address> decode_address(std::span<const uint8_t> b) {
  socket_address a;
  if (b.size() == 7 && b[0] == 4) {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.storage);
    s->sin_family = AF_INET;
    std::memcpy(&s->sin_addr, b.data() + 1, 4);
    s->sin_port = htons(static_cast<uint16_t>(b[5] << 8 | b[6]));
    a.len = sizeof(sockaddr_in);
    return a;
  }
  if (b.size() == 19 && b[0] == 6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.storage);
    s->sin6_family = AF_INET6;
    std::memcpy(s->sin6_addr.s6_addr, b.data() + 1, 16);
    s->sin6_port = htons(static_cast<uint16_t>(b[17] << 8 | b[18]));
    a.len = sizeof(sockaddr_in6);
    return a;
  }
  return make_error(error_code::decode_error, "malformed address in a traversal frame");
}

std::vector<uint8_t> encode_peer_address(const peer_address& p) {
  std::vector<uint8_t> out(p.id.key.begin(), p.id.key.end());
  auto a = encode_address(p.address);
  out.insert(out.end(), a.begin(), a.end());
  return out;
}

expected<node_id> decode_node_id(std::span<const uint8_t> b) {
  if (b.size() != 32) return make_error(error_code::decode_error, "malformed node id in a traversal frame");
  node_id id;
  std::memcpy(id.key.data(), b.data(), 32);
  return id;
}

expected<peer_address> decode_peer_address(std::span<const uint8_t> b) {
  if (b.size() < 32) return make_error(error_code::decode_error, "truncated punch frame");
  auto id = decode_node_id(b.first(32));
  auto a = decode_address(b.subspan(32));
  if (!a) return tl::unexpected(a.error());
  return peer_address{*id, *a};
}

std::vector<uint8_t> encode_relay(const relay_envelope& e) {
  std::vector<uint8_t> out(e.peer.key.begin(), e.peer.key.end());
  out.insert(out.end(), e.box.begin(), e.box.end());
  return out;
}

expected<relay_envelope> decode_relay(std::span<const uint8_t> b) {
  if (b.size() < 32 + crypto_box_NONCEBYTES + crypto_box_MACBYTES)
    return make_error(error_code::decode_error, "truncated relay frame");
  relay_envelope e;
  std::memcpy(e.peer.key.data(), b.data(), 32);
  e.box.assign(b.begin() + 32, b.end());
  return e;
}

namespace {

struct box_keys {
  std::array<uint8_t, crypto_box_PUBLICKEYBYTES> peer_pk{};
  std::array<uint8_t, crypto_box_SECRETKEYBYTES> own_sk{};
  bool ok = false;
  ~box_keys() { sodium_memzero(own_sk.data(), own_sk.size()); }
};

void derive(box_keys& k, const identity& self, const node_id& peer) {
  auto sk = self.secret_key();
  k.ok = crypto_sign_ed25519_pk_to_curve25519(k.peer_pk.data(), peer.key.data()) == 0 &&
         crypto_sign_ed25519_sk_to_curve25519(k.own_sk.data(), sk.data()) == 0;
  sodium_memzero(sk.data(), sk.size());
}

}  // namespace

std::vector<uint8_t> seal_for(const identity& from, const node_id& to, const relay_plain& plain) {
  if (sodium_init() < 0) return {};
  box_keys k;
  derive(k, from, to);
  if (!k.ok) return {};
  std::vector<uint8_t> msg(relay_header_size + plain.payload.size());
  msg[0] = static_cast<uint8_t>(plain.kind);
  msg[1] = plain.channel;
  std::memcpy(msg.data() + 2, plain.session.data(), plain.session.size());
  for (size_t i = 0; i < 8; ++i) msg[2 + plain.session.size() + i] = static_cast<uint8_t>(plain.seq >> (8 * i));
  if (!plain.payload.empty()) std::memcpy(msg.data() + relay_header_size, plain.payload.data(), plain.payload.size());
  std::vector<uint8_t> out(crypto_box_NONCEBYTES + crypto_box_MACBYTES + msg.size());
  randombytes_buf(out.data(), crypto_box_NONCEBYTES);
  if (crypto_box_easy(out.data() + crypto_box_NONCEBYTES, msg.data(), msg.size(), out.data(), k.peer_pk.data(),
                      k.own_sk.data()) != 0)
    return {};
  return out;
}

expected<relay_plain> open_from(const identity& to, const node_id& from, std::span<const uint8_t> box) {
  if (sodium_init() < 0) return make_error(error_code::internal, "libsodium failed to initialise");
  if (box.size() < crypto_box_NONCEBYTES + crypto_box_MACBYTES + relay_header_size)
    return make_error(error_code::decode_error, "sealed relay box too short");
  box_keys k;
  derive(k, to, from);
  if (!k.ok) return make_error(error_code::decode_error, "relay box names an invalid node key");
  size_t clen = box.size() - crypto_box_NONCEBYTES;
  std::vector<uint8_t> msg(clen - crypto_box_MACBYTES);
  if (crypto_box_open_easy(msg.data(), box.data() + crypto_box_NONCEBYTES, clen, box.data(), k.peer_pk.data(),
                           k.own_sk.data()) != 0)
    return make_error(error_code::invalid_argument, "relay box does not open: not sealed by node " +
                                                        from.short_string() + " for this node");
  relay_plain p;
  if (msg[0] < 1 || msg[0] > 3 || msg[1] > 2) return make_error(error_code::decode_error, "relay box: bad header");
  p.kind = static_cast<relay_kind>(msg[0]);
  p.channel = msg[1];
  std::memcpy(p.session.data(), msg.data() + 2, p.session.size());
  for (size_t i = 0; i < 8; ++i) p.seq |= static_cast<uint64_t>(msg[2 + p.session.size() + i]) << (8 * i);
  p.payload.assign(msg.begin() + relay_header_size, msg.end());
  return p;
}

}  // namespace mesh::transport
