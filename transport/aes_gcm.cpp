#include "transport/aes_gcm.hpp"

#include <cpuid.h>
#include <immintrin.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>

// Every function that touches a 256-bit AES or carry-less-multiply register carries this target; the rest of the program
// is built for the baseline x86-64, and aes128_gcm::supported() guards every call.
#define MESH_VAES __attribute__((target("aes,pclmul,avx2,vaes,vpclmulqdq")))
// The fixed-count loops below are unrolled by pragma: rolled, GCC keeps the eight AES streams in
// memory instead of registers (measured 2x slower).

namespace mesh::transport {
namespace {

MESH_VAES inline __m128i byte_reverse(__m128i x) {
  return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/// One AES-128 key-schedule step; `assist` is aeskeygenassist(previous, rcon).
MESH_VAES inline __m128i expand_step(__m128i key, __m128i assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  return _mm_xor_si128(key, assist);
}

MESH_VAES inline __m128i encrypt_block(const uint8_t (*rk)[16], __m128i b) {
  b = _mm_xor_si128(b, _mm_load_si128(reinterpret_cast<const __m128i*>(rk[0])));
  #pragma GCC unroll 16
  for (int r = 1; r < 10; ++r) b = _mm_aesenc_si128(b, _mm_load_si128(reinterpret_cast<const __m128i*>(rk[r])));
  return _mm_aesenclast_si128(b, _mm_load_si128(reinterpret_cast<const __m128i*>(rk[10])));
}

/// Montgomery reduction of a 256-bit carry-less product (hi:lo, with the cross terms `mid`
/// not yet folded in) to POLYVAL's a * b * x^-128 mod x^128 + x^127 + x^126 + x^121 + 1.
/// Each step clears the low 64 bits: lo + m * Q with m = lo's low half, then divides by x^64;
/// Q's middle terms are x^64 * (x^57 + x^62 + x^63) = x^64 * 0xC2 << 56.
MESH_VAES inline __m128i reduce(__m128i lo, __m128i mid, __m128i hi) {
  lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
  hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
  const __m128i poly = _mm_set_epi64x(static_cast<long long>(0xC200000000000000ULL), 1);
  #pragma GCC unroll 16
  for (int step = 0; step < 2; ++step)
    lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), _mm_clmulepi64_si128(lo, poly, 0x10));
  return _mm_xor_si128(hi, lo);
}

MESH_VAES inline void multiply_add(__m128i a, __m128i b, __m128i& lo, __m128i& mid, __m128i& hi) {
  lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(a, b, 0x00));
  mid = _mm_xor_si128(mid, _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10)));
  hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(a, b, 0x11));
}

MESH_VAES inline __m128i fold_lanes(__m256i x) {
  return _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

/// 256-bit vectors of 2 blocks, 8 per step: 16 blocks (256 bytes). Eight independent AES streams
/// keep the AES units busy through each round's latency, and one GHASH reduction per 16 blocks
/// keeps the hash's loop-carried chain (multiply, fold, reduce) short per byte. 256-bit rather
/// than 512-bit vectors: on this machine's Xeon, VAES on ymm registers runs 1.4x the block rate of
/// zmm (two ports against one), and 512-bit code lowers the core's clock for everything else
/// (memcpy and the kernel's copies got slower beside a zmm version).
constexpr int vectors = 8;
constexpr size_t step_bytes = 32 * vectors, step_blocks = 2 * vectors;

/// The 32 POLYVAL-domain blocks of `x` (4 per vector, in order) folded into the hash state:
/// state' = (state + X_1) H^32 + X_2 H^31 + ... + X_32 H, one reduction for all of them.
MESH_VAES inline __m128i hash_step(__m128i state, __m256i (&x)[vectors], const __m256i* pw) {
  x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(state));
  const __m256i* xs = x;
  __m256i lo = _mm256_setzero_si256(), mid = lo, hi = lo;
  #pragma GCC unroll 16
  for (int k = 0; k < vectors; ++k) {
    lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(xs[k], pw[k], 0x00));
    mid = _mm256_xor_si256(mid, _mm256_xor_si256(_mm256_clmulepi64_epi128(xs[k], pw[k], 0x01),
                                                 _mm256_clmulepi64_epi128(xs[k], pw[k], 0x10)));
    hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(xs[k], pw[k], 0x11));
  }
  return reduce(fold_lanes(lo), fold_lanes(mid), fold_lanes(hi));
}

/// Hashes `len` bytes (zero-padded to whole blocks, as GCM pads the AAD and the ciphertext).
MESH_VAES __m128i hash_bytes(__m128i state, const uint8_t* p, size_t len, const uint8_t (*powers)[16]) {
  const __m256i rev = _mm256_broadcastsi128_si256(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m256i pw[vectors];
  #pragma GCC unroll 16
  for (int k = 0; k < vectors; ++k) pw[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(powers[2 * k]));
  for (; len >= step_bytes; len -= step_bytes, p += step_bytes) {
    __m256i x[vectors];
    #pragma GCC unroll 16
    for (int k = 0; k < vectors; ++k) x[k] = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * k)), rev);
    state = hash_step(state, x, pw);
  }
  if (len == 0) return state;
  // n < 32 blocks left: block i gets H^(n - i) = powers[32 - n + i].
  const size_t n = (len + 15) / 16;
  __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
  for (size_t i = 0; i < n; ++i) {
    alignas(16) uint8_t block[16] = {};
    std::memcpy(block, p + 16 * i, std::min<size_t>(16, len - 16 * i));
    __m128i x = byte_reverse(_mm_load_si128(reinterpret_cast<const __m128i*>(block)));
    if (i == 0) x = _mm_xor_si128(x, state);
    multiply_add(x, _mm_load_si128(reinterpret_cast<const __m128i*>(powers[step_blocks - n + i])), lo, mid, hi);
  }
  return reduce(lo, mid, hi);
}

/// 16 blocks of AES-CTR keystream (eight 256-bit streams interleaved round by round, so the AES
/// units always have independent work); advances `counter` by 16.
MESH_VAES inline void keystream(__m256i (&ks)[vectors], __m256i& counter, __m256i to_be, __m256i two, const __m256i* rk) {
  #pragma GCC unroll 16
  for (int k = 0; k < vectors; ++k) {
    ks[k] = _mm256_xor_si256(_mm256_shuffle_epi8(counter, to_be), rk[0]);
    counter = _mm256_add_epi32(counter, two);
  }
  #pragma GCC unroll 16
  for (int r = 1; r < 10; ++r)
    #pragma GCC unroll 16
    for (int k = 0; k < vectors; ++k) ks[k] = _mm256_aesenc_epi128(ks[k], rk[r]);
  #pragma GCC unroll 16
  for (int k = 0; k < vectors; ++k) ks[k] = _mm256_aesenclast_epi128(ks[k], rk[10]);
}

void store_be64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}

/// CPUID and XGETBV directly (GCC and clang accept different names in __builtin_cpu_supports):
/// AES-NI, PCLMULQDQ, AVX with the OS saving the ymm registers, AVX2, VAES and VPCLMULQDQ.
bool cpu_supported() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool aes = c & (1u << 25), pclmul = c & (1u << 1), osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!aes || !pclmul || !osxsave || !avx) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6) != 0x6) return false;  // the OS saves xmm and ymm state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx2 = b & (1u << 5), vaes = c & (1u << 9), vpclmulqdq = c & (1u << 10);
  return avx2 && vaes && vpclmulqdq;
}

/// AES-128 round keys, and the POLYVAL key's powers (see aes128_gcm::powers_).
MESH_VAES void expand_key(const uint8_t* key, uint8_t (*round_keys_)[16], uint8_t (*powers_)[16]) {
  __m128i k[11];
  k[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
  k[1] = expand_step(k[0], _mm_aeskeygenassist_si128(k[0], 0x01));
  k[2] = expand_step(k[1], _mm_aeskeygenassist_si128(k[1], 0x02));
  k[3] = expand_step(k[2], _mm_aeskeygenassist_si128(k[2], 0x04));
  k[4] = expand_step(k[3], _mm_aeskeygenassist_si128(k[3], 0x08));
  k[5] = expand_step(k[4], _mm_aeskeygenassist_si128(k[4], 0x10));
  k[6] = expand_step(k[5], _mm_aeskeygenassist_si128(k[5], 0x20));
  k[7] = expand_step(k[6], _mm_aeskeygenassist_si128(k[6], 0x40));
  k[8] = expand_step(k[7], _mm_aeskeygenassist_si128(k[7], 0x80));
  k[9] = expand_step(k[8], _mm_aeskeygenassist_si128(k[8], 0x1b));
  k[10] = expand_step(k[9], _mm_aeskeygenassist_si128(k[9], 0x36));
  #pragma GCC unroll 16
  for (int r = 0; r < 11; ++r) _mm_store_si128(reinterpret_cast<__m128i*>(round_keys_[r]), k[r]);

  // POLYVAL's key is mulX(ByteReverse(H)) with H = AES(0): a left shift by one bit, reduced
  // by x^128 = x^127 + x^126 + x^121 + 1.
  alignas(16) uint8_t hb[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(hb), byte_reverse(encrypt_block(round_keys_, _mm_setzero_si128())));
  uint64_t lo, hi;
  std::memcpy(&lo, hb, 8);
  std::memcpy(&hi, hb + 8, 8);
  const bool carry = hi >> 63;
  hi = (hi << 1) | (lo >> 63);
  lo <<= 1;
  if (carry) {
    hi ^= 0xC200000000000000ULL;
    lo ^= 1;
  }
  const __m128i h = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
  __m128i p = h;
  for (int j = static_cast<int>(step_blocks) - 1; j >= 0; --j) {  // powers_[15] = H, powers_[14] = H^2, ...
    _mm_store_si128(reinterpret_cast<__m128i*>(powers_[j]), p);
    __m128i l = _mm_setzero_si128(), m = l, u = l;
    multiply_add(p, h, l, m, u);
    p = reduce(l, m, u);
  }
}

/// GCM with the GHASH over the ciphertext: `out` = in XOR keystream, `tag` = the tag.
template <bool Encrypt>
MESH_VAES void crypt(const uint8_t (*round_keys_)[16], const uint8_t (*powers_)[16], uint8_t* out, const uint8_t* in,
                     size_t len, const uint8_t* nonce, const uint8_t* aad, size_t aad_len, uint8_t* tag) {
  __m256i rk[11];
  #pragma GCC unroll 16
  for (int r = 0; r < 11; ++r) rk[r] = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(round_keys_[r])));
  __m256i pw[vectors];
  #pragma GCC unroll 16
  for (int k = 0; k < vectors; ++k) pw[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(powers_[2 * k]));
  const __m256i rev = _mm256_broadcastsi128_si256(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));

  // Counter blocks are nonce || 32-bit big-endian counter, the first data block's counter 2
  // (1 is the tag's). `counter` keeps the counter little-endian in each lane's last word, and
  // `to_be` byte-swaps that word. A packet is far below 2^32 blocks, so the word never wraps.
  alignas(16) uint8_t base[16] = {};
  std::memcpy(base, nonce, 12);
  __m256i counter = _mm256_add_epi32(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(base))),
                                     _mm256_set_epi32(3, 0, 0, 0, 2, 0, 0, 0));
  const __m256i to_be = _mm256_broadcastsi128_si256(_mm_set_epi8(12, 13, 14, 15, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  const __m256i two = _mm256_set_epi32(2, 0, 0, 0, 2, 0, 0, 0);
  __m128i state = hash_bytes(_mm_setzero_si128(), aad, aad_len, powers_);
  size_t done = 0;
  for (; len - done >= step_bytes; done += step_bytes) {
    __m256i ks[vectors], x[vectors];
    keystream(ks, counter, to_be, two, rk);
    #pragma GCC unroll 16
    for (int k = 0; k < vectors; ++k) {
      const __m256i data = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + done + 32 * k)), result = _mm256_xor_si256(data, ks[k]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + done + 32 * k), result);
      x[k] = _mm256_shuffle_epi8(Encrypt ? result : data, rev);  // GHASH runs over the ciphertext
    }
    state = hash_step(state, x, pw);
  }
  if (const size_t rest = len - done; rest > 0) {
    alignas(64) uint8_t buf[step_bytes] = {};
    std::memcpy(buf, in + done, rest);
    if (!Encrypt) state = hash_bytes(state, buf, rest, powers_);
    __m256i ks[vectors];
    keystream(ks, counter, to_be, two, rk);
    #pragma GCC unroll 16
    for (int k = 0; k < vectors; ++k) {
      __m256i* v = reinterpret_cast<__m256i*>(buf + 32 * k);
      _mm256_store_si256(v, _mm256_xor_si256(_mm256_load_si256(v), ks[k]));
    }
    std::memset(buf + rest, 0, sizeof(buf) - rest);
    if (Encrypt) state = hash_bytes(state, buf, rest, powers_);
    std::memcpy(out + done, buf, rest);
  }
  alignas(16) uint8_t lengths[16];
  store_be64(lengths, static_cast<uint64_t>(aad_len) * 8);
  store_be64(lengths + 8, static_cast<uint64_t>(len) * 8);
  state = hash_bytes(state, lengths, 16, powers_);

  alignas(16) uint8_t j0[16] = {};
  std::memcpy(j0, nonce, 12);
  j0[15] = 1;
  const __m128i mask = encrypt_block(round_keys_, _mm_load_si128(reinterpret_cast<const __m128i*>(j0)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(tag), _mm_xor_si128(mask, byte_reverse(state)));
}

}  // namespace

bool aes128_gcm::supported() {
  static const bool yes = cpu_supported();
  return yes;
}

aes128_gcm::aes128_gcm(const uint8_t key[key_size]) { expand_key(key, round_keys_, powers_); }

aes128_gcm::~aes128_gcm() {
  sodium_memzero(round_keys_, sizeof(round_keys_));
  sodium_memzero(powers_, sizeof(powers_));
}

void aes128_gcm::seal(uint8_t* out, const uint8_t* in, size_t len, const uint8_t nonce[nonce_size], const uint8_t* aad,
                      size_t aad_len) const {
  crypt<true>(round_keys_, powers_, out, in, len, nonce, aad, aad_len, out + len);
}

bool aes128_gcm::open(uint8_t* out, const uint8_t* in, size_t len, const uint8_t nonce[nonce_size], const uint8_t* aad,
                      size_t aad_len) const {
  uint8_t received[tag_size], computed[tag_size];
  std::memcpy(received, in + len, tag_size);  // before an in-place decryption could touch it
  crypt<false>(round_keys_, powers_, out, in, len, nonce, aad, aad_len, computed);
  uint8_t diff = 0;
  for (size_t i = 0; i < tag_size; ++i) diff |= static_cast<uint8_t>(received[i] ^ computed[i]);
  return diff == 0;
}

}  // namespace mesh::transport
