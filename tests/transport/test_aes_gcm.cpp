// aes128_gcm (transport/aes_gcm.hpp) against GnuTLS's AES-128-GCM, and the packet cipher that
// carries 1-RTT packets after the first key update.
#include <gnutls/crypto.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "endpoint_harness.hpp"
#include "transport/aes_gcm.hpp"
#include "transport/packet_cipher.hpp"

using namespace mesh::transport;

namespace {

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

/// GnuTLS's ciphertext || tag for the same inputs: the reference.
std::vector<uint8_t> gnutls_seal(const std::vector<uint8_t>& key, const std::vector<uint8_t>& nonce,
                                 const std::vector<uint8_t>& aad, const std::vector<uint8_t>& plain) {
  gnutls_datum_t k{const_cast<unsigned char*>(key.data()), static_cast<unsigned>(key.size())};
  gnutls_aead_cipher_hd_t h;
  REQUIRE(gnutls_aead_cipher_init(&h, GNUTLS_CIPHER_AES_128_GCM, &k) == 0);
  std::vector<uint8_t> out(plain.size() + 16);
  size_t out_len = out.size();
  REQUIRE(gnutls_aead_cipher_encrypt(h, nonce.data(), nonce.size(), aad.data(), aad.size(), 16, plain.data(), plain.size(),
                                     out.data(), &out_len) == 0);
  gnutls_aead_cipher_deinit(h);
  out.resize(out_len);
  return out;
}

}  // namespace

TEST_CASE("aes128_gcm seals exactly what GnuTLS seals, for every length up to 600 bytes", "[transport][aes_gcm]") {
  if (!aes128_gcm::supported()) {
    WARN("this CPU has no VAES/VPCLMULQDQ: aes128_gcm is not used here and not tested");
    return;
  }
  std::mt19937 rng(42);
  const size_t lengths_extra[] = {4095, 4096, 4097, 1452, 65000, 65536};
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 600; ++n) lengths.push_back(n);
  lengths.insert(lengths.end(), std::begin(lengths_extra), std::end(lengths_extra));
  for (size_t len : lengths) {
    const size_t aad_len = len % 7 == 0 ? 0 : static_cast<size_t>(rng() % 300);
    auto key = random_bytes(rng, 16), nonce = random_bytes(rng, 12), aad = random_bytes(rng, aad_len),
         plain = random_bytes(rng, len);
    const aes128_gcm cipher(key.data());
    std::vector<uint8_t> sealed(len + 16);
    cipher.seal(sealed.data(), plain.data(), len, nonce.data(), aad.data(), aad.size());
    INFO("length " << len << ", aad " << aad_len);
    REQUIRE(sealed == gnutls_seal(key, nonce, aad, plain));

    std::vector<uint8_t> opened(len);
    REQUIRE(cipher.open(opened.data(), sealed.data(), len, nonce.data(), aad.data(), aad.size()));
    REQUIRE(opened == plain);

    // In place, as ngtcp2 seals.
    std::vector<uint8_t> in_place = plain;
    in_place.resize(len + 16);
    cipher.seal(in_place.data(), in_place.data(), len, nonce.data(), aad.data(), aad.size());
    REQUIRE(in_place == sealed);
    REQUIRE(cipher.open(in_place.data(), in_place.data(), len, nonce.data(), aad.data(), aad.size()));
    in_place.resize(len);
    REQUIRE(in_place == plain);
  }
}

TEST_CASE("aes128_gcm rejects a changed ciphertext, tag, AAD, nonce or key", "[transport][aes_gcm]") {
  if (!aes128_gcm::supported()) {
    WARN("this CPU has no VAES/VPCLMULQDQ: aes128_gcm is not used here and not tested");
    return;
  }
  std::mt19937 rng(7);
  for (size_t len : {0, 1, 15, 16, 17, 255, 256, 257, 1452, 65000}) {
    auto key = random_bytes(rng, 16), nonce = random_bytes(rng, 12), aad = random_bytes(rng, 21),
         plain = random_bytes(rng, len);
    const aes128_gcm cipher(key.data());
    std::vector<uint8_t> sealed(len + 16), out(len);
    cipher.seal(sealed.data(), plain.data(), len, nonce.data(), aad.data(), aad.size());
    INFO("length " << len);
    for (size_t bit = 0; bit < 8 * sealed.size(); bit += 1 + sealed.size() / 64) {  // bits all over, tag included
      auto bad = sealed;
      bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      CHECK_FALSE(cipher.open(out.data(), bad.data(), len, nonce.data(), aad.data(), aad.size()));
    }
    auto bad_aad = aad;
    bad_aad[3] ^= 0x40;
    CHECK_FALSE(cipher.open(out.data(), sealed.data(), len, nonce.data(), bad_aad.data(), bad_aad.size()));
    CHECK_FALSE(cipher.open(out.data(), sealed.data(), len, nonce.data(), aad.data(), aad.size() - 1));
    auto bad_nonce = nonce;
    bad_nonce[11] ^= 1;
    CHECK_FALSE(cipher.open(out.data(), sealed.data(), len, bad_nonce.data(), aad.data(), aad.size()));
    auto other_key = key;
    other_key[0] ^= 1;
    const aes128_gcm other(other_key.data());
    CHECK_FALSE(other.open(out.data(), sealed.data(), len, nonce.data(), aad.data(), aad.size()));
  }
}

TEST_CASE("1-RTT packets move to the fast cipher after the first key update", "[transport][aes_gcm][endpoint]") {
  using namespace mesh::transport::test;
  if (!packet_cipher::enabled()) {
    WARN("packet_cipher is off here (no VAES/VPCLMULQDQ, or MESH_VAES_GCM=0): GnuTLS seals every packet");
    return;
  }
  const uint64_t before = packet_cipher::keys_registered();
  node a(config_with_secret(3)), b(config_with_secret(3));
  REQUIRE(a.ep);
  REQUIRE(b.ep);
  connect(a, b);
  // Enough data both ways that the key update (one round trip after the handshake) happens
  // in the middle of it: the packets on either side of the switch must all arrive intact.
  REQUIRE(a.ep->send(b.ep->id(), channel::bulk, pattern(8 << 20, 5)));
  REQUIRE(b.ep->send(a.ep->id(), channel::bulk, pattern(8 << 20, 6)));
  for (int i = 0; i < 200; ++i) REQUIRE(a.ep->send(b.ep->id(), channel::control, {static_cast<uint8_t>(i)}));
  REQUIRE(b.log.wait([&] { return b.log.messages.size() == 201; }, std::chrono::seconds(30)));
  REQUIRE(a.log.wait([&] { return a.log.messages.size() == 1; }, std::chrono::seconds(30)));
  size_t control = 0;
  for (auto& m : b.log.messages) {
    if (m.ch == channel::bulk) CHECK(m.bytes == pattern(8 << 20, 5));
    else CHECK(m.bytes == std::vector<uint8_t>{static_cast<uint8_t>(control++)});
  }
  CHECK(control == 200);
  CHECK(a.log.messages[0].bytes == pattern(8 << 20, 6));
  // Each side's key update registers its next receive and send keys.
  CHECK(packet_cipher::keys_registered() >= before + 4);
  CHECK(a.log.down.empty());
  CHECK(b.log.down.empty());
}
