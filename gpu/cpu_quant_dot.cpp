#include "gpu/cpu_quant_dot.hpp"

#include <cmath>
#include <cstring>

#include "gpu/cpu_simd.hpp"

namespace mesh::gpu {

int64_t int8_x_block(dtype t) {
  switch (t) {
    case dtype::q8_0:
    case dtype::q4_0: return 32;
    case dtype::q4_k:
    case dtype::q6_k: return 256;
    default: return 0;
  }
}

int64_t int8_x_row_bytes(dtype t, int64_t k) {
  const int64_t block = int8_x_block(t);
  if (block == 0) return 0;
  const int64_t bytes = k + 4 * (k / block) + (block == 256 ? 2 * (k / 16) : 0);
  return (bytes + 63) / 64 * 64;
}

#if defined(__x86_64__)
namespace {
using namespace simd;

MESH_AVX2 inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// One row of x into `out`: codes, scales, then (256-element blocks) the sums of 16 codes.
MESH_AVX2 void quantize_row(const float* x, int64_t k, int64_t block, uint8_t* out) {
  int8_t* q = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + k);
  const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i finite_max = _mm256_set1_epi32(0x7f7fffff);  // |x|'s bits above this: infinity or NaN
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / block; ++b) {
    const float* xb = x + b * block;
    int8_t* qb = q + b * block;
    __m256 mx = _mm256_setzero_ps();
    __m256i bad = _mm256_setzero_si256();
    for (int64_t i = 0; i < block; i += 8) {
      const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i));
      mx = _mm256_max_ps(mx, a);
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_castps_si256(a), finite_max));
    }
    const float db = hmax(mx) / 127.0f;
    const bool finite = _mm256_testz_si256(bad, bad) != 0;
    d[b] = finite ? db : NAN;
    if (!finite || db == 0.0f) {
      std::memset(qb, 0, static_cast<size_t>(block));
      continue;
    }
    const __m256 dv = _mm256_set1_ps(db);
    for (int64_t i = 0; i < block; i += 32) {
      __m256i v[4];
      for (int u = 0; u < 4; ++u) {
        const __m256 s = _mm256_div_ps(_mm256_loadu_ps(xb + i + 8 * u), dv);
        v[u] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(s, lo), hi));  // to nearest, ties to even
      }
      // The packs interleave 128-bit lanes: dwords come out as elements 0-3, 8-11, 16-19, 24-27,
      // 4-7, 12-15, 20-23, 28-31, which the permutation puts back in order.
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_store_si256(reinterpret_cast<__m256i*>(qb + i), _mm256_permutevar8x32_epi32(p, order));
    }
  }
  if (block == 256) {
    int16_t* sums = reinterpret_cast<int16_t*>(out + k + 4 * (k / block));
    for (int64_t g = 0; g < k / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += q[16 * g + i];
      sums[g] = static_cast<int16_t>(s);
    }
  }
}

/// The x codes of block element e of quantized row xr (32-byte aligned), and block b's scale.
MESH_AVX2 inline __m256i x_codes(const uint8_t* xr, int64_t e) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(xr + e)); }
inline float x_scale(const uint8_t* xr, int64_t k, int64_t b) {
  float d = 0;
  std::memcpy(&d, xr + k + 4 * b, 4);
  return d;
}
/// Block b's 16 sums of 16 codes (256-element blocks).
MESH_AVX2 inline __m256i x_sums(const uint8_t* xr, int64_t k, int64_t b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + k + 4 * (k / 256) + 32 * b));
}

/// Signed bytes w times signed bytes x, summed in groups of four as 8 int32 lanes. maddubs takes
/// an unsigned first operand: |w| against x with w's sign (a -128 in w reads as 128, which is its
/// magnitude). Pair sums stay below 2 * 128 * 127 < 2^15.
MESH_AVX2 inline __m256i dot_i8(__m256i aw, __m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

/// q8_0 (and q4_0 through `decode`): per 32-element block the 8 lanes of integer sums times
/// d_w * d_x into the row's float accumulator.
template <int R>
MESH_AVX2 inline void block32_int(__m256i q, float dw, int64_t b, int64_t k, const uint8_t* xq, int64_t ldxq, __m256 acc[R]) {
  const __m256i aq = _mm256_sign_epi8(q, q);
  for (int r = 0; r < R; ++r) {
    const uint8_t* xr = xq + r * ldxq;
    const __m256i s = dot_i8(aq, q, x_codes(xr, 32 * b));
    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x_scale(xr, k, b)), _mm256_cvtepi32_ps(s), acc[r]);
  }
}

/// q8_0: 34-byte blocks, f16 d then 32 int8 codes.
template <int R>
MESH_AVX2 void dot_q8_0(const uint8_t* w, int64_t k, const uint8_t* xq, int64_t ldxq, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b, w += 34) {
    if (b % 2 == 0) prefetch(w + prefetch_ahead, 2);
    block32_int<R>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2)), f16_at(w), b, k, xq, ldxq, acc);
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

/// q4_0: 18-byte blocks, f16 d then 16 bytes whose low nibbles are elements 0-15 and high
/// nibbles 16-31, each minus 8.
template <int R>
MESH_AVX2 void dot_q4_0(const uint8_t* w, int64_t k, const uint8_t* xq, int64_t ldxq, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < k / 32; ++b, w += 18) {
    if (b % 4 == 0) prefetch(w + prefetch_ahead, 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4);
    block32_int<R>(_mm256_sub_epi8(nibbles, eight), f16_at(w), b, k, xq, ldxq, acc);
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

/// The int16 lanes of v (16-bit values in both 128-bit lanes) that pick value j of each lane.
MESH_AVX2 inline __m256i pick16(int j) { return _mm256_set1_epi16(static_cast<short>(((2 * j + 1) << 8) | (2 * j))); }

/// q4_k: 144-byte blocks of 256: x = d*sc * q - dmin*m per sub-block of 32. A block adds
/// d*d_x * sum_j sc_j (q . x_q)_j - dmin*d_x * sum_j m_j sum(x_q)_j, both sums in integers
/// (q unsigned 0..15 against signed x codes: pair sums below 2 * 15 * 127). Group g's 32 bytes
/// hold sub-block 2g in their low nibbles and 2g+1 in their high nibbles.
template <int R>
MESH_AVX2 void dot_q4_k(const uint8_t* w, int64_t k, const uint8_t* xq, int64_t ldxq, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < k / 256; ++b, w += 144) {
    prefetch(w + prefetch_ahead, 3);
    uint32_t u[4];
    q4_k_scales_mins(w + 4, u);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // sc_0..7 as int16, in both lanes
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));        // m_0 m_0 m_1 m_1 ... m_7 m_7
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * g));
      const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      const __m256i sc_lo = _mm256_shuffle_epi8(scales, pick16(2 * g)), sc_hi = _mm256_shuffle_epi8(scales, pick16(2 * g + 1));
      for (int r = 0; r < R; ++r) {
        const uint8_t* xr = xq + r * ldxq + 256 * b + 64 * g;
        const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x_codes(xr, 0)), sc_lo);
        const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x_codes(xr, 32)), sc_hi);
        sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(plo, phi));
      }
    }
    const float d = f16_at(w), dmin = f16_at(w + 2);
    for (int r = 0; r < R; ++r) {
      const uint8_t* xr = xq + r * ldxq;
      const float dx = x_scale(xr, k, b);
      // Lane j of the madd: m_j times the sum of sub-block j's 32 codes (two sums of 16).
      const __m256i msum = _mm256_madd_epi16(x_sums(xr, k, b), mins);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sum[r]), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(msum), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

/// q6_k: 210-byte blocks of 256 (128 bytes ql, 64 qh, 16 int8 scales, f16 d); per half of 128,
/// four runs of 32 six-bit codes u from ql's nibbles and qh's bit pairs; x = d * scale * (u - 32)
/// with a scale per 16. A block adds d*d_x * (sum_s scale_s (u . x_q)_s - 32 sum_s scale_s
/// sum(x_q)_s): u unsigned 0..63 against signed x codes (pair sums below 2 * 63 * 127).
template <int R>
MESH_AVX2 void dot_q6_k(const uint8_t* w, int64_t k, const uint8_t* xq, int64_t ldxq, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
  // Run j of a half covers scales 2j (its first 16 elements, the low lane) and 2j+1 (the high lane).
  __m256i pick[4];
  for (int j = 0; j < 4; ++j) pick[j] = _mm256_set_m128i(_mm256_castsi256_si128(pick16(2 * j + 1)), _mm256_castsi256_si128(pick16(2 * j)));
  for (int64_t b = 0; b < k / 256; ++b, w += 210) {
    prefetch(w + prefetch_ahead, 4);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(half == 0 ? sc8 : _mm_srli_si128(sc8, 8)));
      const uint8_t* ql = w + 64 * half;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * half));
      // (bits & 3) << 4 stays inside its byte, so 16-bit shifts serve for bytes.
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4)),
      };
      for (int j = 0; j < 4; ++j) {
        const __m256i s = _mm256_shuffle_epi8(sc, pick[j]);
        for (int r = 0; r < R; ++r) {
          const __m256i x = x_codes(xq + r * ldxq, 256 * b + 128 * half + 32 * j);
          sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], x), s));
        }
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const float d = f16_at(w + 208);
    for (int r = 0; r < R; ++r) {
      const uint8_t* xr = xq + r * ldxq;
      const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(x_sums(xr, k, b), sc16), 5);  // 32 * scale_s * sum(x_q)_s
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * x_scale(xr, k, b)), _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[r], bias)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

template <int R>
int8_dot_fn dot_for(dtype t) {
  switch (t) {
    case dtype::q8_0: return dot_q8_0<R>;
    case dtype::q4_0: return dot_q4_0<R>;
    case dtype::q4_k: return dot_q4_k<R>;
    case dtype::q6_k: return dot_q6_k<R>;
    default: return nullptr;
  }
}

}  // namespace

void quantize_x_int8(dtype t, const float* x, int64_t rows, int64_t k, int64_t ldx, uint8_t* out) {
  const int64_t block = int8_x_block(t), rb = int8_x_row_bytes(t, k);
  if (block == 0) return;
  for (int64_t r = 0; r < rows; ++r) quantize_row(x + r * ldx, k, block, out + r * rb);
}

int8_dot_fn int8_dot(dtype t, int64_t R) {
  switch (R) {
    case 1: return dot_for<1>(t);
    case 2: return dot_for<2>(t);
    case 3: return dot_for<3>(t);
    default: return dot_for<4>(t);
  }
}

#else
void quantize_x_int8(dtype, const float*, int64_t, int64_t, int64_t, uint8_t*) {}
int8_dot_fn int8_dot(dtype, int64_t) { return nullptr; }
#endif

}  // namespace mesh::gpu
