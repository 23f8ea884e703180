#include "transport/relay_sessions.hpp"

#include <sodium.h>

#include <cstring>

namespace mesh::transport {

namespace {
relay_nonce fresh_nonce() {
  relay_nonce n{};
  randombytes_buf(n.data(), n.size());
  return n;
}

/// The session id both sides derive from the two nonces.
relay_nonce session_id(const relay_nonce& opener, const relay_nonce& answerer) {
  relay_nonce id{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, id.size());
  crypto_generichash_update(&st, opener.data(), opener.size());
  crypto_generichash_update(&st, answerer.data(), answerer.size());
  crypto_generichash_final(&st, id.data(), id.size());
  return id;
}
}  // namespace

std::array<uint8_t, 32> relay_sessions::tag(const char* label, const node_id& from, const node_id& to, std::span<const uint8_t> nonces) const {
  std::array<uint8_t, 32> out{};
  crypto_generichash_state st;
  // BLAKE2b keyed by the mesh secret (at most 64 bytes are a key; a longer one is hashed first).
  std::array<uint8_t, 32> key{};
  crypto_generichash(key.data(), key.size(), secret_.data(), secret_.size(), nullptr, 0);
  crypto_generichash_init(&st, key.data(), key.size(), out.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(label), std::strlen(label));
  crypto_generichash_update(&st, from.key.data(), from.key.size());
  crypto_generichash_update(&st, to.key.data(), to.key.size());
  crypto_generichash_update(&st, nonces.data(), nonces.size());
  crypto_generichash_final(&st, out.data(), out.size());
  sodium_memzero(key.data(), key.size());
  return out;
}

relay_plain relay_sessions::hello(const node_id& peer) {
  session& s = sessions_[peer];
  s = {};
  s.sent_hello = fresh_nonce();
  relay_plain p;
  p.kind = relay_kind::hello;
  p.session = *s.sent_hello;
  const auto t = tag("mesh relay hello v1", self_, peer, p.session);
  p.payload.assign(t.begin(), t.end());
  return p;
}

expected<relay_plain> relay_sessions::on_hello(const node_id& peer, const relay_plain& hello) {
  const auto want = tag("mesh relay hello v1", peer, self_, hello.session);
  if (hello.payload.size() != want.size() || sodium_memcmp(hello.payload.data(), want.data(), want.size()) != 0)
    return make_error(error_code::invalid_argument, "relayed hello from " + peer.short_string() + " does not prove the mesh secret");
  session& s = sessions_[peer];
  const bool again = s.answered && s.opener == hello.session;  // replayed: the same answer, nothing reset
  const relay_nonce mine = again ? s.answer : fresh_nonce();
  if (!again) {
    s = {};
    s.id = session_id(hello.session, mine);
    s.opener = hello.session;
    s.answer = mine;
    s.answered = true;
  }
  relay_plain ack;
  ack.kind = relay_kind::hello_ack;
  ack.session = hello.session;
  std::array<uint8_t, 32> nonces{};
  std::memcpy(nonces.data(), hello.session.data(), 16);
  std::memcpy(nonces.data() + 16, mine.data(), 16);
  const auto t = tag("mesh relay answer v1", self_, peer, nonces);
  ack.payload.assign(mine.begin(), mine.end());
  ack.payload.insert(ack.payload.end(), t.begin(), t.end());
  return ack;
}

expected<void> relay_sessions::on_ack(const node_id& peer, const relay_plain& ack) {
  auto it = sessions_.find(peer);
  if (it == sessions_.end() || !it->second.sent_hello || ack.session != *it->second.sent_hello)
    return make_error(error_code::invalid_argument, "relayed answer from " + peer.short_string() + " is not for the hello this node sent");
  if (ack.payload.size() != 16 + 32) return make_error(error_code::decode_error, "relayed answer from " + peer.short_string() + " is malformed");
  relay_nonce theirs{};
  std::memcpy(theirs.data(), ack.payload.data(), 16);
  std::array<uint8_t, 32> nonces{};
  std::memcpy(nonces.data(), ack.session.data(), 16);
  std::memcpy(nonces.data() + 16, theirs.data(), 16);
  const auto want = tag("mesh relay answer v1", peer, self_, nonces);
  if (sodium_memcmp(ack.payload.data() + 16, want.data(), want.size()) != 0)
    return make_error(error_code::invalid_argument, "relayed answer from " + peer.short_string() + " does not prove the mesh secret");
  session& s = it->second;
  s = {};
  s.id = session_id(ack.session, theirs);
  return {};
}

std::optional<relay_plain> relay_sessions::seal(const node_id& peer, uint8_t channel, std::vector<uint8_t> payload) {
  auto it = sessions_.find(peer);
  if (it == sessions_.end() || !it->second.id) return std::nullopt;
  relay_plain p;
  p.kind = relay_kind::message;
  p.channel = channel;
  p.session = *it->second.id;
  p.seq = ++it->second.sent;
  p.payload = std::move(payload);
  return p;
}

expected<void> relay_sessions::accept(const node_id& peer, const relay_plain& m) {
  auto it = sessions_.find(peer);
  if (it == sessions_.end() || !it->second.id || m.session != *it->second.id)
    return make_error(error_code::invalid_argument, "relayed message from " + peer.short_string() + " is not of the open session (replayed?)");
  if (m.seq <= it->second.received)
    return make_error(error_code::invalid_argument, "relayed message from " + peer.short_string() + " repeats sequence number " + std::to_string(m.seq) + " (replayed)");
  it->second.received = m.seq;
  return {};
}

bool relay_sessions::open(const node_id& peer) const {
  auto it = sessions_.find(peer);
  return it != sessions_.end() && it->second.id.has_value();
}

}  // namespace mesh::transport
