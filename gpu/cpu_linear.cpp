#include "gpu/cpu_linear.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graph/quant.hpp"
#include "gpu/cpu_gemm.hpp"
#include "gpu/cpu_quant_dot.hpp"
#include "gpu/cpu_simd.hpp"
#include "gpu/cpu_thread_pool.hpp"

namespace mesh::gpu {
namespace {

/// x . w over n elements in 8 partial sums, which the compiler keeps in vector registers (one
/// running sum would be a chain of dependent scalar adds: floats are not reassociated).
float dot(const float* x, const float* w, int64_t n) {
  float part[8] = {};
  int64_t p = 0;
  for (; p + 8 <= n; p += 8)
    for (int i = 0; i < 8; ++i) part[i] += x[p + i] * w[p + i];
  float tail = 0;
  for (; p < n; ++p) tail += x[p] * w[p];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) + tail;
}

/// One thread's decode buffer, kept between calls.
std::vector<float>& decode_buffer(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf;
}

/// Weight rows [j0, j1) as f32 rows of k: where they are for f32, else decoded into `buf`.
const float* rows_as_f32(const linear_args& a, int64_t rb, int64_t j0, int64_t j1) {
  if (a.type == dtype::f32) return reinterpret_cast<const float*>(a.w) + j0 * a.k;
  std::vector<float>& buf = decode_buffer(static_cast<size_t>((j1 - j0) * a.k));
  for (int64_t j = j0; j < j1; ++j)
    (void)dequantize_row(a.type, {a.w + j * rb, static_cast<size_t>(rb)}, {buf.data() + (j - j0) * a.k, static_cast<size_t>(a.k)});
  return buf.data();
}

/// Few rows, any dtype: each weight row decoded once into a buffer, then dotted with every row of x.
void rows_by_buffer(const linear_args& a, int64_t rb, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* w = rows_as_f32(a, rb, j, j + 1);
    for (int64_t r = 0; r < a.rows; ++r) a.y[r * a.n + j] = dot(a.x + r * a.k, w, a.k);
  }
}

/// Many rows: weight rows decoded to f32 and multiplied with all of x by the blocked GEMM.
void rows_by_gemm(const linear_args& a, int64_t rb, int64_t j0, int64_t j1, cpu_isa isa) {
  gemm_args g;
  g.m = a.rows, g.n = j1 - j0, g.k = a.k;
  g.a = a.x, g.a_row = a.k, g.a_col = 1;
  g.b = rows_as_f32(a, rb, j0, j1), g.b_row = 1, g.b_col = a.k;  // B = W^T: element (p, j) is W[j][p]
  g.c = a.y + j0, g.c_row = a.n;
  gemm_f32(g, isa, nullptr);
}

#if defined(__x86_64__)
// ---- AVX2 dots that decode weight blocks in registers ----
// Each takes one weight row `w` of k elements and R (1..4) rows of x (`ldx` apart), and writes
// y[r * ldy] for r < R. `xs` (ldxs apart) holds each x row's 32-element slice sums (q4_k's
// minimum terms). Integer codes become floats (exactly) and are dotted with x; a block's or
// sub-block's scale multiplies its partial sum.
using namespace simd;

using dot_fn = void (*)(const uint8_t* w, int64_t k, const float* x, int64_t ldx, const float* xs, int64_t ldxs, float* y, int64_t ldy);

/// The low 8 bytes of v, signed (unsigned), as 8 floats.
MESH_AVX2 inline __m256 i8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
MESH_AVX2 inline __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
MESH_AVX2 inline __m128i high8(__m128i v) { return _mm_srli_si128(v, 8); }

/// 8 weights from element c on: kind 0 f32, 1 f16, 2 bf16 (its bits are a float's upper half).
template <int kind>
MESH_AVX2 inline __m256 load8(const uint8_t* w, int64_t c) {
  if constexpr (kind == 0) return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + c);
  else if constexpr (kind == 1) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * c)));
  else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * c))), 16));
}
template <int kind>
inline float load1(const uint8_t* w, int64_t c) {
  uint32_t bits = 0;
  if constexpr (kind == 0) {
    float f = 0;
    std::memcpy(&f, w + 4 * c, 4);
    return f;
  } else {
    uint16_t h = 0;
    std::memcpy(&h, w + 2 * c, 2);
    if constexpr (kind == 1) return half_to_float(h);
    bits = static_cast<uint32_t>(h) << 16;
    float f = 0;
    std::memcpy(&f, &bits, 4);
    return f;
  }
}

/// f32, f16, bf16: two running sums per row of x (one FMA chain would wait on its latency).
template <int kind, int R>
MESH_AVX2 void dot_plain(const uint8_t* w, int64_t k, const float* x, int64_t ldx, const float*, int64_t, float* y, int64_t ldy) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    const __m256 w0 = load8<kind>(w, c), w1 = load8<kind>(w, c + 8);
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a0[r]);
      a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + c + 8), a1[r]);
    }
  }
  for (; c + 8 <= k; c += 8) {
    const __m256 w0 = load8<kind>(w, c);
    for (int r = 0; r < R; ++r) a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + c), a0[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(a0[r], a1[r]));
    for (int64_t t = c; t < k; ++t) s += load1<kind>(w, t) * x[r * ldx + t];
    y[r * ldy] = s;
  }
}

/// The 32 codes f[0..3] (8 each, in element order) dotted with 32 elements of each x row, scaled
/// by d into acc.
template <int R>
MESH_AVX2 inline void block32(const __m256 f[4], __m256 d, const float* x, int64_t ldx, __m256 acc[R]) {
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * ldx;
    __m256 s = _mm256_mul_ps(f[0], _mm256_loadu_ps(xr));
    s = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(xr + 8), s);
    s = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(xr + 16), s);
    s = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(xr + 24), s);
    acc[r] = _mm256_fmadd_ps(d, s, acc[r]);
  }
}

/// q8_0: 34-byte blocks, f16 d then 32 int8 codes.
template <int R>
MESH_AVX2 void dot_q8_0(const uint8_t* w, int64_t k, const float* x, int64_t ldx, const float*, int64_t, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b, w += 34) {
    if (b % 2 == 0) prefetch(w + prefetch_ahead, 2);
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 18));
    const __m256 f[4] = {i8_ps(q0), i8_ps(high8(q0)), i8_ps(q1), i8_ps(high8(q1))};
    block32<R>(f, _mm256_set1_ps(f16_at(w)), x + 32 * b, ldx, acc);
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

/// q4_0: 18-byte blocks, f16 d then 16 bytes whose low nibbles are elements 0-15 and high
/// nibbles 16-31, each minus 8.
template <int R>
MESH_AVX2 void dot_q4_0(const uint8_t* w, int64_t k, const float* x, int64_t ldx, const float*, int64_t, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  for (int64_t b = 0; b < k / 32; ++b, w += 18) {
    if (b % 4 == 0) prefetch(w + prefetch_ahead, 2);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight);
    const __m256 f[4] = {i8_ps(lo), i8_ps(high8(lo)), i8_ps(hi), i8_ps(high8(hi))};
    block32<R>(f, _mm256_set1_ps(f16_at(w)), x + 32 * b, ldx, acc);
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

/// q4_k: 144-byte blocks of 256: x = d*sc * q - dmin*m per sub-block of 32, so a sub-block adds
/// d*sc * (q . x) - dmin*m * sum(x), the sums of x coming from `xs`. Each 8 bytes of nibbles
/// widen to 8 dwords, whose low and high nibbles are 8 elements of two sub-blocks.
template <int R>
MESH_AVX2 void dot_q4_k(const uint8_t* w, int64_t k, const float* x, int64_t ldx, const float* xs, int64_t ldxs, float* y, int64_t ldy) {
  __m256 acc[R], macc[R];
  for (int r = 0; r < R; ++r) acc[r] = macc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi32(0x0f);
  alignas(32) float dsc[8];
  for (int64_t b = 0; b < k / 256; ++b, w += 144) {
    prefetch(w + prefetch_ahead, 3);
    uint32_t u[4];
    q4_k_scales_mins(w + 4, u);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    // d*sc and dmin*m as dequantize_row rounds them.
    _mm256_store_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(f16_at(w)), u8_ps(sm)));
    const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(f16_at(w + 2)), u8_ps(high8(sm)));
    for (int r = 0; r < R; ++r) macc[r] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(xs + r * ldxs + 8 * b), macc[r]);
    for (int g = 0; g < 4; ++g) {
      __m256 lo[4], hi[4];
      for (int i = 0; i < 4; ++i) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 16 + 32 * g + 8 * i)));
        lo[i] = _mm256_cvtepi32_ps(_mm256_and_si256(v, m4));
        hi[i] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
      }
      const int64_t e = 256 * b + 64 * g;  // the first element of sub-block 2g
      block32<R>(lo, _mm256_broadcast_ss(dsc + 2 * g), x + e, ldx, acc);
      block32<R>(hi, _mm256_broadcast_ss(dsc + 2 * g + 1), x + e + 32, ldx, acc);
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]) - hsum(macc[r]);
}

/// q6_k: 210-byte blocks of 256 (128 bytes ql, 64 qh, 16 int8 scales, f16 d); per half of 128,
/// four runs of 32 codes built from ql's nibbles and qh's bit pairs, minus 32; a scale per 16.
template <int R>
MESH_AVX2 void dot_q6_k(const uint8_t* w, int64_t k, const float* x, int64_t ldx, const float*, int64_t, float* y, int64_t ldy) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
  alignas(32) float dsc[16];
  for (int64_t b = 0; b < k / 256; ++b, w += 210) {
    prefetch(w + prefetch_ahead, 4);
    const __m256 d = _mm256_set1_ps(f16_at(w + 208));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
    _mm256_store_ps(dsc, _mm256_mul_ps(d, i8_ps(sc)));  // d * scale, as dequantize_row rounds it
    _mm256_store_ps(dsc + 8, _mm256_mul_ps(d, i8_ps(high8(sc))));
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w + 64 * half;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * half));
      // (bits & 3) << 4 stays inside its byte, so 16-bit shifts serve for bytes.
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4)),
      };
      for (int j = 0; j < 4; ++j) {
        const __m256i qs = _mm256_sub_epi8(q[j], bias);
        const __m128i q0 = _mm256_castsi256_si128(qs), q1 = _mm256_extracti128_si256(qs, 1);
        const __m256 f0 = i8_ps(q0), f1 = i8_ps(high8(q0)), f2 = i8_ps(q1), f3 = i8_ps(high8(q1));
        const __m256 d0 = _mm256_broadcast_ss(dsc + 8 * half + 2 * j), d1 = _mm256_broadcast_ss(dsc + 8 * half + 2 * j + 1);
        const int64_t e = 256 * b + 128 * half + 32 * j;
        for (int r = 0; r < R; ++r) {
          const float* xr = x + r * ldx + e;
          const __m256 s0 = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xr + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(xr)));
          const __m256 s1 = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xr + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(xr + 16)));
          acc[r] = _mm256_fmadd_ps(d1, s1, _mm256_fmadd_ps(d0, s0, acc[r]));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum(acc[r]);
}

template <int R>
dot_fn dot_for(dtype t) {
  switch (t) {
    case dtype::f32: return dot_plain<0, R>;
    case dtype::f16: return dot_plain<1, R>;
    case dtype::bf16: return dot_plain<2, R>;
    case dtype::q8_0: return dot_q8_0<R>;
    case dtype::q4_0: return dot_q4_0<R>;
    case dtype::q4_k: return dot_q4_k<R>;
    case dtype::q6_k: return dot_q6_k<R>;
    default: return nullptr;
  }
}

/// The dot for dtype t and R (1..4) rows of x, or null where t has none.
dot_fn register_dot(dtype t, int64_t R) {
  switch (R) {
    case 1: return dot_for<1>(t);
    case 2: return dot_for<2>(t);
    case 3: return dot_for<3>(t);
    default: return dot_for<4>(t);
  }
}

/// Few rows, a dtype with register dots: each weight row dotted with up to 4 rows of x at a time.
void rows_in_registers(const linear_args& a, int64_t rb, int64_t j0, int64_t j1, const float* xs) {
  const int64_t ldxs = a.k / 32;
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t r0 = 0; r0 < a.rows; r0 += 4) {
      const int64_t R = std::min<int64_t>(4, a.rows - r0);
      register_dot(a.type, R)(a.w + j * rb, a.k, a.x + r0 * a.k, a.k, xs ? xs + r0 * ldxs : nullptr, ldxs, a.y + r0 * a.n + j, a.n);
    }
}

/// Few rows, x quantized to 8 bits (`xq`, rows `ldxq` bytes apart): integer dots of weight rows
/// [j0, j1) with up to 4 rows of x at a time.
void rows_int8(const linear_args& a, int64_t rb, int64_t j0, int64_t j1, const uint8_t* xq, int64_t ldxq) {
  for (int64_t r0 = 0; r0 < a.rows; r0 += 4) {
    const int64_t R = std::min<int64_t>(4, a.rows - r0);
    const int8_dot_fn dot = int8_dot(a.type, R);
    for (int64_t j = j0; j < j1; ++j) dot(a.w + j * rb, a.k, xq + r0 * ldxq, ldxq, a.y + r0 * a.n + j, a.n);
  }
}
#endif

}  // namespace

linear_x default_linear_x() {
  static const linear_x mode = [] {
    const char* v = std::getenv("MESH_CPU_LINEAR");
    return v && std::strcmp(v, "f32") == 0 ? linear_x::f32 : linear_x::int8;
  }();
  return mode;
}

bool takes_int8_dots(dtype t, cpu_isa isa) { return isa == cpu_isa::avx2 && int8_dot(t, 1) != nullptr; }

bool decodes_in_registers(dtype t, cpu_isa isa) {
#if defined(__x86_64__)
  return isa == cpu_isa::avx2 && register_dot(t, 1) != nullptr;
#else
  (void)t, (void)isa;
  return false;
#endif
}

void linear_f32(const linear_args& a, cpu_isa isa, thread_pool* pool) {
  if (a.rows <= 0 || a.n <= 0) return;
  if (a.k == 0) {
    std::fill(a.y, a.y + a.rows * a.n, 0.0f);
    return;
  }
  const int64_t rb = *row_bytes(a.type, a.k);
  // With x in 8 bits the integer dots take every number of rows: a row's result is then the
  // same bit for bit whether it came alone (a decode step) or with others (a prompt, or the
  // tokens a split model replays on its survivors after a stage node died), which the f32 GEMM
  // on the same rounded x is not (its sums round differently, and a greedy stream can diverge).
  const bool int8 = a.x_mode == linear_x::int8 && takes_int8_dots(a.type, isa);
  const bool by_gemm = !int8 && a.rows >= linear_gemm_rows;
  const bool in_registers = !by_gemm && !int8 && decodes_in_registers(a.type, isa);
  // x quantized to 8 bits once for every weight row (a buffer of the calling thread, which the
  // workers only read; 64-byte aligned).
  const uint8_t* xq = nullptr;
  const int64_t ldxq = int8 ? int8_x_row_bytes(a.type, a.k) : 0;
  if (int8) {
    thread_local std::vector<uint8_t> buf;
    const size_t need = static_cast<size_t>(a.rows * ldxq) + 64;
    if (buf.size() < need) buf.resize(need);
    uint8_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
    quantize_x_int8(a.type, a.x, a.rows, a.k, a.k, base);
    xq = base;
  }
  // q4_k's minimum terms need each x row's 32-element slice sums: computed once here, for every
  // weight row (a buffer of the calling thread, which the workers only read).
  const float* xs = nullptr;
  if (in_registers && a.type == dtype::q4_k) {
    thread_local std::vector<float> sums;
    const int64_t slices = a.k / 32;
    if (sums.size() < static_cast<size_t>(a.rows * slices)) sums.resize(static_cast<size_t>(a.rows * slices));
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t s = 0; s < slices; ++s) {
        const float* p = a.x + r * a.k + 32 * s;
        float part[8] = {};
        for (int i = 0; i < 32; ++i) part[i % 8] += p[i];
        sums[static_cast<size_t>(r * slices + s)] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      }
    xs = sums.data();
  }
  // Weight rows in chunks handed to the threads one at a time: 64 rows for the GEMM (its B panel),
  // 16 otherwise (fine enough that uneven thread speeds balance).
  const int64_t chunk = by_gemm ? 64 : 16;
  const int64_t chunks = (a.n + chunk - 1) / chunk;
  auto part = [&](int64_t q) {
    const int64_t j0 = q * chunk, j1 = std::min(a.n, j0 + chunk);
    if (by_gemm) return rows_by_gemm(a, rb, j0, j1, isa);
#if defined(__x86_64__)
    if (int8) return rows_int8(a, rb, j0, j1, xq, ldxq);
    if (in_registers) return rows_in_registers(a, rb, j0, j1, xs);
#endif
    rows_by_buffer(a, rb, j0, j1);
  };
  const bool worth_threads = pool && static_cast<double>(a.rows) * static_cast<double>(a.n) * static_cast<double>(a.k) >= (1 << 16);
  if (worth_threads) pool->run(chunks, part);
  else
    for (int64_t q = 0; q < chunks; ++q) part(q);
}

}  // namespace mesh::gpu
