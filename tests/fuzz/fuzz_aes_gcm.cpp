// libFuzzer target: aes128_gcm against GnuTLS on arbitrary inputs. A peer's 1-RTT packets are
// opened by aes128_gcm, so its open() is a decoder of peer input: whatever the bytes, it must
// accept exactly what GnuTLS accepts, and seal() must produce GnuTLS's bytes.
// Input: key (16) || nonce (12) || aad length (1) || aad || payload.
#include <gnutls/crypto.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "transport/aes_gcm.hpp"

using mesh::transport::aes128_gcm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!aes128_gcm::supported() || size < 29) return 0;
  const uint8_t* key = data;
  const uint8_t* nonce = data + 16;
  size_t aad_len = data[28];
  data += 29;
  size -= 29;
  if (aad_len > size) aad_len = size;
  const uint8_t* aad = data;
  const uint8_t* payload = data + aad_len;
  const size_t len = size - aad_len;

  gnutls_datum_t k{const_cast<uint8_t*>(key), 16};
  gnutls_aead_cipher_hd_t h;
  if (gnutls_aead_cipher_init(&h, GNUTLS_CIPHER_AES_128_GCM, &k) != 0) abort();
  const aes128_gcm cipher(key);

  // Seal: the same bytes as GnuTLS.
  std::vector<uint8_t> ours(len + 16), theirs(len + 16);
  cipher.seal(ours.data(), payload, len, nonce, aad, aad_len);
  size_t theirs_len = theirs.size();
  if (gnutls_aead_cipher_encrypt(h, nonce, 12, aad, aad_len, 16, payload, len, theirs.data(), &theirs_len) != 0 ||
      theirs_len != ours.size() || ours != theirs)
    abort();

  // Open the payload as if it were ciphertext || tag: accepted exactly when GnuTLS accepts it,
  // with the same plaintext. (Random bytes almost never carry a valid tag; the sealed ones do.)
  const std::pair<const uint8_t*, size_t> inputs[] = {{theirs.data(), theirs.size()}, {payload, len}};
  for (auto [in, in_len] : inputs) {
    if (in_len < 16) continue;
    std::vector<uint8_t> a(in_len - 16), b(in_len);
    const bool ok_ours = cipher.open(a.data(), in, in_len - 16, nonce, aad, aad_len);
    size_t b_len = b.size();
    const bool ok_theirs = gnutls_aead_cipher_decrypt(h, nonce, 12, aad, aad_len, 16, in, in_len, b.data(), &b_len) == 0;
    if (ok_ours != ok_theirs) abort();
    if (ok_ours && (b_len != a.size() || std::memcmp(a.data(), b.data(), a.size()) != 0)) abort();
  }
  gnutls_aead_cipher_deinit(h);
  return 0;
}
