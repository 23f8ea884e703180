#pragma once
/// AES-128-GCM on VAES and VPCLMULQDQ (256-bit vectors): the packet cipher of 1-RTT QUIC packets where
/// the CPU has those instructions.
///
/// Why it exists: loopback bulk transfers spent ~40% of each I/O thread in GnuTLS's AES-GCM
/// (6.8 GB/s per core here; OpenSSL 3.0 and libgcrypt 1.10 run at the same speed: none of Debian
/// 12's libraries use the vector AES instructions). This one encrypts 16 blocks per step (eight
/// 256-bit AES streams) and hashes them with one aggregated GHASH reduction.
///
/// How GHASH is done: through POLYVAL (RFC 8452, appendix A): GHASH(H, X) =
/// ByteReverse(POLYVAL(mulX(ByteReverse(H)), ByteReverse(X_i)...)). POLYVAL's field elements are
/// plain little-endian integers, so a carry-less multiply is the field product, and reduction is
/// two 64-bit Montgomery steps with the constant 0xC2 << 56.
///
/// Constant time: every secret-dependent step is an AES or carry-less-multiply instruction, no
/// table lookups, no branches on data; the tag is compared without early exit.
/// Checked against GnuTLS on every length 0..600 and random keys, nonces and AAD
/// (test_transport_aes_gcm) and by a fuzzer (fuzz_aes_gcm).
#include <cstddef>
#include <cstdint>

namespace mesh::transport {

class aes128_gcm {
public:
  static constexpr size_t key_size = 16, nonce_size = 12, tag_size = 16;

  /// True where the CPU (and the OS's saved register state) has AVX2, VAES, VPCLMULQDQ,
  /// AES-NI and PCLMULQDQ (Intel since Ice Lake, AMD since Zen 3). Nothing else in this class may be called otherwise.
  static bool supported();

  explicit aes128_gcm(const uint8_t key[key_size]);
  ~aes128_gcm();  ///< wipes the round keys
  aes128_gcm(const aes128_gcm&) = delete;
  aes128_gcm& operator=(const aes128_gcm&) = delete;

  /// Encrypts `len` bytes of `in` to `out` and appends the 16-byte tag: `out` receives len + 16
  /// bytes. `out` may be `in` (in place); any other overlap is not allowed.
  void seal(uint8_t* out, const uint8_t* in, size_t len, const uint8_t nonce[nonce_size], const uint8_t* aad,
            size_t aad_len) const;

  /// Decrypts `len` bytes of ciphertext followed by their tag (`len` + 16 bytes at `in`) to `out`
  /// (len bytes; may be `in`). False, and `out` unspecified, when the tag does not match.
  bool open(uint8_t* out, const uint8_t* in, size_t len, const uint8_t nonce[nonce_size], const uint8_t* aad,
            size_t aad_len) const;

private:
  alignas(64) uint8_t round_keys_[11][16];
  /// POLYVAL-domain powers of H: powers_[j] = H^(16 - j), so block j of a 16-block step is
  /// multiplied by powers_[j] and the eight 256-bit loads line up with the eight data vectors.
  alignas(64) uint8_t powers_[16][16];
};

}  // namespace mesh::transport
