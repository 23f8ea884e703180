#pragma once
/// The AEAD of 1-RTT packets: aes128_gcm (VAES, aes_gcm.hpp) where the CPU has it, GnuTLS through
/// ngtcp2_crypto for everything else. These are ngtcp2 callbacks with the signatures of the
/// ngtcp2_crypto_*_cb functions they wrap.
///
/// ngtcp2_crypto keeps the key bytes of the keys it installs to itself, with one exception: a key
/// update (`update_key`) hands over the new keys with the contexts made for them. So the fast
/// cipher is registered there, keyed by the GnuTLS handle in the context, and every connection
/// updates its keys once, right after the handshake is confirmed (connection::write): from then
/// on both directions use keys made here. Packets sealed before that (the handshake and the first
/// 1-RTT round trips) go through GnuTLS, as do all packets where enabled() is false. The
/// encrypt/decrypt callbacks get no connection, so the registry is process-wide.
#include <ngtcp2/ngtcp2_crypto.h>

#include <cstdint>

namespace mesh::transport::packet_cipher {

/// True when keys made by update_key get the fast cipher: aes128_gcm::supported() and the
/// environment variable MESH_VAES_GCM is not "0" (read once).
bool enabled();

int encrypt(uint8_t* dest, const ngtcp2_crypto_aead* aead, const ngtcp2_crypto_aead_ctx* aead_ctx,
            const uint8_t* plaintext, size_t plaintextlen, const uint8_t* nonce, size_t noncelen, const uint8_t* aad,
            size_t aadlen);
int decrypt(uint8_t* dest, const ngtcp2_crypto_aead* aead, const ngtcp2_crypto_aead_ctx* aead_ctx,
            const uint8_t* ciphertext, size_t ciphertextlen, const uint8_t* nonce, size_t noncelen, const uint8_t* aad,
            size_t aadlen);
/// ngtcp2_crypto_update_key_cb, and the new keys get the fast cipher when `fast` and enabled().
int update_key(ngtcp2_conn* conn, uint8_t* rx_secret, uint8_t* tx_secret, ngtcp2_crypto_aead_ctx* rx_aead_ctx,
               uint8_t* rx_iv, ngtcp2_crypto_aead_ctx* tx_aead_ctx, uint8_t* tx_iv, const uint8_t* current_rx_secret,
               const uint8_t* current_tx_secret, size_t secretlen, bool fast);
void delete_aead_ctx(ngtcp2_conn* conn, ngtcp2_crypto_aead_ctx* aead_ctx, void* user_data);

/// Keys given the fast cipher so far in this process (for tests and the bench).
uint64_t keys_registered();

}  // namespace mesh::transport::packet_cipher
