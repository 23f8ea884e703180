#include "transport/packet_cipher.hpp"

#include <gnutls/crypto.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "transport/aes_gcm.hpp"

namespace mesh::transport::packet_cipher {
namespace {

/// GnuTLS handle -> fast cipher for the same key. Written on key updates and context deletions
/// (a few per connection), read for every packet: each thread keeps a small cache that is
/// dropped whenever the registry changes (`generation`), so a packet costs one relaxed atomic
/// load and a scan of four entries, not a lock.
struct registry {
  std::mutex mutex;
  std::unordered_map<const void*, std::unique_ptr<const aes128_gcm>> ciphers;
  std::atomic<uint64_t> generation{1};
  std::atomic<uint64_t> registered{0};
};

registry& the_registry() {
  static registry r;
  return r;
}

struct cache_entry {
  const void* handle = nullptr;
  const aes128_gcm* cipher = nullptr;  ///< nullptr: the handle is GnuTLS's alone
};
thread_local uint64_t cache_generation = 0;
thread_local cache_entry cache[4];
thread_local unsigned cache_next = 0;

/// The fast cipher for a context's handle, or nullptr. A cached pointer is never used after its
/// context is deleted: a context is only used by its connection's I/O thread, never while
/// ngtcp2 deletes it, and every deletion bumps the generation before the handle can come back
/// from GnuTLS for a new context.
const aes128_gcm* find(const void* handle) {
  registry& r = the_registry();
  if (const uint64_t g = r.generation.load(std::memory_order_acquire); g != cache_generation) {
    for (auto& e : cache) e = {};
    cache_generation = g;
  }
  for (const auto& e : cache)
    if (e.handle == handle) return e.cipher;
  const aes128_gcm* found = nullptr;
  {
    std::lock_guard lock(r.mutex);
    if (auto it = r.ciphers.find(handle); it != r.ciphers.end()) found = it->second.get();
  }
  cache[cache_next++ % 4] = {handle, found};
  return found;
}

bool is_aes_128_gcm(const ngtcp2_crypto_aead& aead) {
  // ngtcp2_crypto_gnutls stores the GnuTLS cipher id as the AEAD's native handle.
  return aead.native_handle == reinterpret_cast<void*>(static_cast<intptr_t>(GNUTLS_CIPHER_AES_128_GCM));
}

void add(const void* handle, const uint8_t* key) {
  auto cipher = std::make_unique<const aes128_gcm>(key);
  registry& r = the_registry();
  std::lock_guard lock(r.mutex);
  r.ciphers[handle] = std::move(cipher);
  r.generation.fetch_add(1, std::memory_order_acq_rel);
  r.registered.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MESH_VAES_GCM");
    return aes128_gcm::supported() && !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
}

int encrypt(uint8_t* dest, const ngtcp2_crypto_aead* aead, const ngtcp2_crypto_aead_ctx* aead_ctx,
            const uint8_t* plaintext, size_t plaintextlen, const uint8_t* nonce, size_t noncelen, const uint8_t* aad,
            size_t aadlen) {
  if (noncelen == aes128_gcm::nonce_size)
    if (const aes128_gcm* c = find(aead_ctx->native_handle)) {
      c->seal(dest, plaintext, plaintextlen, nonce, aad, aadlen);
      return 0;
    }
  return ngtcp2_crypto_encrypt_cb(dest, aead, aead_ctx, plaintext, plaintextlen, nonce, noncelen, aad, aadlen);
}

int decrypt(uint8_t* dest, const ngtcp2_crypto_aead* aead, const ngtcp2_crypto_aead_ctx* aead_ctx,
            const uint8_t* ciphertext, size_t ciphertextlen, const uint8_t* nonce, size_t noncelen, const uint8_t* aad,
            size_t aadlen) {
  if (noncelen == aes128_gcm::nonce_size)
    if (const aes128_gcm* c = find(aead_ctx->native_handle)) {
      if (ciphertextlen < aes128_gcm::tag_size) return NGTCP2_ERR_DECRYPT;
      const size_t len = ciphertextlen - aes128_gcm::tag_size;
      return c->open(dest, ciphertext, len, nonce, aad, aadlen) ? 0 : NGTCP2_ERR_DECRYPT;
    }
  return ngtcp2_crypto_decrypt_cb(dest, aead, aead_ctx, ciphertext, ciphertextlen, nonce, noncelen, aad, aadlen);
}

int update_key(ngtcp2_conn* conn, uint8_t* rx_secret, uint8_t* tx_secret, ngtcp2_crypto_aead_ctx* rx_aead_ctx,
               uint8_t* rx_iv, ngtcp2_crypto_aead_ctx* tx_aead_ctx, uint8_t* tx_iv, const uint8_t* current_rx_secret,
               const uint8_t* current_tx_secret, size_t secretlen, bool fast) {
  uint8_t rx_key[64], tx_key[64];
  if (ngtcp2_crypto_update_key(conn, rx_secret, tx_secret, rx_aead_ctx, rx_key, rx_iv, tx_aead_ctx, tx_key, tx_iv,
                               current_rx_secret, current_tx_secret, secretlen) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  const ngtcp2_crypto_ctx* ctx = ngtcp2_conn_get_crypto_ctx(conn);
  if (fast && enabled() && is_aes_128_gcm(ctx->aead) && ngtcp2_crypto_aead_keylen(&ctx->aead) == aes128_gcm::key_size) {
    try {
      add(rx_aead_ctx->native_handle, rx_key);
      add(tx_aead_ctx->native_handle, tx_key);
    } catch (const std::bad_alloc&) {
      // Without memory for the fast cipher the GnuTLS contexts just made still work.
    }
  }
  std::memset(rx_key, 0, sizeof(rx_key));
  std::memset(tx_key, 0, sizeof(tx_key));
  return 0;
}

void delete_aead_ctx(ngtcp2_conn* conn, ngtcp2_crypto_aead_ctx* aead_ctx, void* user_data) {
  registry& r = the_registry();
  {
    std::lock_guard lock(r.mutex);
    r.ciphers.erase(aead_ctx->native_handle);
    r.generation.fetch_add(1, std::memory_order_acq_rel);
  }
  ngtcp2_crypto_delete_crypto_aead_ctx_cb(conn, aead_ctx, user_data);
}

uint64_t keys_registered() { return the_registry().registered.load(std::memory_order_relaxed); }

}  // namespace mesh::transport::packet_cipher
