#include "graph/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace mesh {
namespace {

struct block_info {
  int64_t elements, bytes;
};

block_info info(dtype t) {
  switch (t) {
    case dtype::q8_0: return {32, 2 + 32};
    case dtype::q4_0: return {32, 2 + 16};
    case dtype::q4_k: return {256, 2 + 2 + 12 + 128};
    case dtype::q6_k: return {256, 128 + 64 + 16 + 2};
    case dtype::q4_1: return {32, 2 + 2 + 16};
    case dtype::q5_0: return {32, 2 + 4 + 16};
    case dtype::q5_1: return {32, 2 + 2 + 4 + 16};
    case dtype::q5_k: return {256, 2 + 2 + 12 + 32 + 128};
    default: return {1, static_cast<int64_t>(size_of(t))};
  }
}

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
float f16(const uint8_t* p) { return half_to_float(le16(p)); }

// A row of f16 values widened to floats: the CPU executor's half-precision weights go through
// this at every run. With F16C (every x86-64 CPU since 2013; checked at run time) eight at a
// time, exactly (the conversion is IEEE, subnormals included); otherwise one by one.
#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void f16_row_f16c(const uint8_t* s, float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i))));
  for (; i < n; ++i) y[i] = half_to_float(le16(s + 2 * i));
}
#endif
void f16_row(const uint8_t* s, float* y, size_t n) {
#if defined(__x86_64__)
  static const bool f16c = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;  // CPUID leaf 1: ECX bit 29 is F16C (clang has no "f16c" for __builtin_cpu_supports)
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  }();
  if (f16c) return f16_row_f16c(s, y, n);
#endif
  for (size_t i = 0; i < n; ++i) y[i] = half_to_float(le16(s + 2 * i));
}
uint32_t le32(const uint8_t* p) { return static_cast<uint32_t>(le16(p)) | static_cast<uint32_t>(le16(p + 2)) << 16; }

// The unsigned 4- or 5-bit values of a 32-element block (q4_0's order: byte j holds element j in
// its low nibble, j+16 in its high one); `qh`, when given, is a 4-byte little-endian mask whose
// bit i is element i's 5th bit (q5_0, q5_1).
void unpack32(const uint8_t* qs, const uint8_t* qh, int q[32]) {
  const uint32_t h = qh ? le32(qh) : 0;
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0f) | static_cast<int>((h >> j) & 1) << 4;
    q[j + 16] = (qs[j] >> 4) | static_cast<int>((h >> (j + 16)) & 1) << 4;
  }
}

// The inverse of unpack32 for values < 16 (qh null) or < 32.
void pack32(const int q[32], uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j | static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  if (qh) {
    put16(qh, static_cast<uint16_t>(h));
    put16(qh + 2, static_cast<uint16_t>(h >> 16));
  }
}

void row_q8_0(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 34, y += 32) {
    const float d = f16(b);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}

void row_q4_0(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 18, y += 32) {
    const float d = f16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

// q4_1 (bits 4, no qh) and q5_1 (bits 5): x = q * d + m.
void row_offset32(const uint8_t* b, float* y, size_t blocks, int bits) {
  const size_t bytes = bits == 4 ? 20 : 24;
  for (size_t i = 0; i < blocks; ++i, b += bytes, y += 32) {
    const float d = f16(b), m = f16(b + 2);
    int q[32];
    unpack32(b + (bits == 4 ? 4 : 8), bits == 4 ? nullptr : b + 4, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
}

void row_q5_0(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 22, y += 32) {
    const float d = f16(b);
    int q[32];
    unpack32(b + 6, b + 2, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
  }
}

// The 6-bit scale and min of q4_k sub-block j (0..7) from the 12 packed bytes: the first four
// sub-blocks keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); the last four
// split theirs into a low nibble in bytes 8-11 and the two spare high bits of bytes 0-7.
void q4_k_scale_min(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
    min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// Q4_K, and Q5_K: Q4_K's layout with a 5th bit per element, bit j of qh[l] for element l of
// sub-block j (its nibbles then start at 48).
template <bool five>
void row_q4_k_or_q5_k(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += five ? 176 : 144, y += 256) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (five ? 48 : 16);
    for (int g = 0; g < 4; ++g) {
      int sc_lo, m_lo, sc_hi, m_hi;
      q4_k_scale_min(2 * g, scales, sc_lo, m_lo);
      q4_k_scale_min(2 * g + 1, scales, sc_hi, m_hi);
      // Multiplied in the order ggml does (d*sc first), so results match it bit for bit.
      const float d_lo = d * static_cast<float>(sc_lo), min_lo = dmin * static_cast<float>(m_lo);
      const float d_hi = d * static_cast<float>(sc_hi), min_hi = dmin * static_cast<float>(m_hi);
      const uint8_t* q = qs + 32 * g;
      float* out = y + 64 * g;
      for (int l = 0; l < 32; ++l) {
        int lo = q[l] & 0x0f, hi = q[l] >> 4;
        if constexpr (five) {
          lo |= ((qh[l] >> (2 * g)) & 1) << 4;
          hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
        }
        out[l] = d_lo * static_cast<float>(lo) - min_lo;
        out[l + 32] = d_hi * static_cast<float>(hi) - min_hi;
      }
    }
  }
}

void row_q6_k(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 210, y += 256) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8) {
      float* out = y + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;  // 16 elements per scale
        const int q0 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q1 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        out[l] = d * static_cast<float>(sc[s]) * static_cast<float>(q0);
        out[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(q1);
        out[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(q2);
        out[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(q3);
      }
    }
  }
}

int nearest(float x) { return static_cast<int>(std::lround(x)); }

void quantize_q8_0(const float* x, uint8_t* b, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, x += 32, b += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put16(b, float_to_half(d));
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(nearest(x[j] * id), -127, 127)));
  }
}

void quantize_q4_0(const float* x, uint8_t* b, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, x += 32, b += 18) {
    // As ggml: the value of largest magnitude maps to -8, keeping its sign in d.
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::abs(x[j]) > amax) amax = std::abs(x[j]), max = x[j];
    const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put16(b, float_to_half(d));
    for (int j = 0; j < 16; ++j) {
      const int lo = std::clamp(nearest(x[j] * id) + 8, 0, 15), hi = std::clamp(nearest(x[j + 16] * id) + 8, 0, 15);
      b[2 + j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

// q4_1 (bits 4) and q5_1 (bits 5): the block's minimum m and range / (2^bits - 1) as d.
void quantize_offset32(const float* x, uint8_t* b, size_t blocks, int bits) {
  const int top = (1 << bits) - 1;
  const size_t bytes = bits == 4 ? 20 : 24;
  for (size_t i = 0; i < blocks; ++i, x += 32, b += bytes) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const uint16_t dh = float_to_half((hi - lo) / static_cast<float>(top)), mh = float_to_half(lo);
    const float d = half_to_float(dh), m = half_to_float(mh);  // rounded as stored, then used
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = d > 0 ? std::clamp(nearest((x[j] - m) / d), 0, top) : 0;
    put16(b, dh);
    put16(b + 2, mh);
    pack32(q, b + (bits == 4 ? 4 : 8), bits == 4 ? nullptr : b + 4);
  }
}

void quantize_q5_0(const float* x, uint8_t* b, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, x += 32, b += 22) {
    float amax = 0, max = 0;  // as q4_0: the largest magnitude maps to -16
    for (int j = 0; j < 32; ++j)
      if (std::abs(x[j]) > amax) amax = std::abs(x[j]), max = x[j];
    const float d = max / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put16(b, float_to_half(d));
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::clamp(nearest(x[j] * id) + 16, 0, 31);
    pack32(q, b + 6, b + 2);
  }
}

// The header of a q4_k or q5_k block (levels 15 or 31): d, dmin and the 8 sub-blocks' 6-bit
// scales and mins, packed as q4_k_scale_min reads them; the values come back in sc, m.
void quantize_k_header(const float* x, int levels, uint8_t* b, int sc[8], int m[8], float& d, float& dmin) {
  float scale[8], min[8], max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; ++s) {
    float lo = 0, hi = 0;  // the min is stored as a subtracted non-negative value: lo <= 0
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * s + l]), hi = std::max(hi, x[32 * s + l]);
    scale[s] = (hi - lo) / static_cast<float>(levels);
    min[s] = -lo;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, min[s]);
  }
  const uint16_t dh = float_to_half(max_scale / 63.0f), mh = float_to_half(max_min / 63.0f);
  d = half_to_float(dh), dmin = half_to_float(mh);
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0 ? std::clamp(nearest(scale[s] / d), 0, 63) : 0;
    m[s] = dmin > 0 ? std::clamp(nearest(min[s] / dmin), 0, 63) : 0;
  }
  put16(b, dh);
  put16(b + 2, mh);
  uint8_t* p = b + 4;
  std::memset(p, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      p[j] = static_cast<uint8_t>(sc[j]);
      p[j + 4] = static_cast<uint8_t>(m[j]);
    } else {
      p[j + 4] = static_cast<uint8_t>((sc[j] & 15) | (m[j] & 15) << 4);
      p[j - 4] = static_cast<uint8_t>(p[j - 4] | (sc[j] >> 4) << 6);
      p[j] = static_cast<uint8_t>(p[j] | (m[j] >> 4) << 6);
    }
  }
}

// Element values 0..levels of a q4_k / q5_k block, sub-block by sub-block.
void quantize_k_values(const float* x, int levels, const int sc[8], const int m[8], float d, float dmin, int q[256]) {
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]), ms = dmin * static_cast<float>(m[s]);
    for (int l = 0; l < 32; ++l) q[32 * s + l] = ds > 0 ? std::clamp(nearest((x[32 * s + l] + ms) / ds), 0, levels) : 0;
  }
}

void quantize_q4_k(const float* x, uint8_t* b, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, x += 256, b += 144) {
    int sc[8], m[8], q[256];
    float d, dmin;
    quantize_k_header(x, 15, b, sc, m, d, dmin);
    quantize_k_values(x, 15, sc, m, d, dmin, q);
    uint8_t* qs = b + 16;
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) qs[32 * g + l] = static_cast<uint8_t>(q[64 * g + l] | q[64 * g + 32 + l] << 4);
  }
}

void quantize_q5_k(const float* x, uint8_t* b, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, x += 256, b += 176) {
    int sc[8], m[8], q[256];
    float d, dmin;
    quantize_k_header(x, 31, b, sc, m, d, dmin);
    quantize_k_values(x, 31, sc, m, d, dmin, q);
    uint8_t* qh = b + 16;
    uint8_t* qs = b + 48;
    std::memset(qh, 0, 32);
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * g + l], hi = q[64 * g + 32 + l];
        qs[32 * g + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
        qh[l] = static_cast<uint8_t>(qh[l] | (lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1));
      }
  }
}

void quantize_q6_k(const float* x, uint8_t* b, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, x += 256, b += 210) {
    float scale[16], max_scale = 0, max_abs = 0;
    for (int s = 0; s < 16; ++s) {
      float amax = 0, max = 0;
      for (int l = 0; l < 16; ++l)
        if (std::abs(x[16 * s + l]) > amax) amax = std::abs(x[16 * s + l]), max = x[16 * s + l];
      scale[s] = max / -32.0f;  // the largest magnitude maps to -32, as in ggml
      if (std::abs(scale[s]) > max_abs) max_abs = std::abs(scale[s]), max_scale = scale[s];
    }
    const float iscale = max_scale != 0 ? -128.0f / max_scale : 0.0f;
    const uint16_t dh = float_to_half(iscale != 0 ? 1.0f / iscale : 0.0f);
    const float d = half_to_float(dh);
    auto* sc = reinterpret_cast<int8_t*>(b + 192);
    int q[256];
    for (int s = 0; s < 16; ++s) {
      sc[s] = static_cast<int8_t>(std::clamp(nearest(iscale * scale[s]), -128, 127));
      const float ds = d * static_cast<float>(sc[s]);
      for (int l = 0; l < 16; ++l) q[16 * s + l] = (ds != 0 ? std::clamp(nearest(x[16 * s + l] / ds), -32, 31) : 0) + 32;
    }
    uint8_t* ql = b;
    uint8_t* qh = b + 128;
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const int* e = q + 128 * h + l;
        ql[64 * h + l] = static_cast<uint8_t>((e[0] & 15) | (e[64] & 15) << 4);
        ql[64 * h + l + 32] = static_cast<uint8_t>((e[32] & 15) | (e[96] & 15) << 4);
        qh[32 * h + l] = static_cast<uint8_t>((e[0] >> 4) | (e[32] >> 4) << 2 | (e[64] >> 4) << 4 | (e[96] >> 4) << 6);
      }
    put16(b + 208, dh);
  }
}

}  // namespace

int64_t block_elements(dtype t) { return info(t).elements; }
int64_t block_bytes(dtype t) { return info(t).bytes; }

expected<int64_t> row_bytes(dtype t, int64_t n) {
  const auto i = info(t);
  if (n < 0) return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " elements is negative");
  if (n % i.elements != 0)
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + to_string(t) +
                                                        " elements is not a whole number of " + std::to_string(i.elements) +
                                                        "-element blocks");
  const int64_t blocks = n / i.elements;
  if (blocks > std::numeric_limits<int64_t>::max() / i.bytes)
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + to_string(t) + " elements has more bytes than int64 holds");
  return blocks * i.bytes;
}

int64_t byte_size(dtype t, const shape& dims, int64_t limit) {
  if (static_cast<int>(t) >= dtype_count) return -1;
  const int64_t count = bounded_element_count(dims, limit);
  if (count < 0) return -1;
  if (!is_quantized(t)) return count > limit / static_cast<int64_t>(size_of(t)) ? -1 : count * static_cast<int64_t>(size_of(t));
  if (dims.empty() || dims.back() % block_elements(t) != 0) return -1;
  // count elements in blocks of `elements`, each `bytes` long: fewer bytes than 4-byte floats.
  return count / block_elements(t) * block_bytes(t);
}

std::string byte_size_problem(dtype t, const shape& dims) {
  if (static_cast<int>(t) >= dtype_count) return "unknown dtype " + std::to_string(static_cast<int>(t));
  if (is_quantized(t) && dims.empty()) return std::string("a ") + to_string(t) + " tensor needs rank >= 1 (rows of blocks)";
  if (is_quantized(t) && bounded_element_count(dims, INT64_MAX / 4) >= 0 && dims.back() % block_elements(t) != 0)
    return std::string(to_string(t)) + " tensor " + to_string(dims) + ": its last dimension is not a multiple of the " +
           std::to_string(block_elements(t)) + "-element block";
  return "tensor " + to_string(dims) + " of " + to_string(t) + " is negative or too large";
}

expected<void> dequantize_row(dtype t, std::span<const uint8_t> src, std::span<float> dst) {
  const auto n = static_cast<int64_t>(dst.size());
  auto bytes = row_bytes(t, n);
  if (!bytes) return forward_error(bytes);
  if (static_cast<uint64_t>(*bytes) != src.size())
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + to_string(t) + " elements takes " +
                                                        std::to_string(*bytes) + " bytes, not " + std::to_string(src.size()));
  const uint8_t* s = src.data();
  float* y = dst.data();
  const auto blocks = static_cast<size_t>(n / block_elements(t));
  switch (t) {
    case dtype::f32: std::memcpy(y, s, dst.size() * 4); break;  // little-endian hosts only (as tensor)
    case dtype::i32:
      for (size_t i = 0; i < dst.size(); ++i) {
        int32_t v;
        std::memcpy(&v, s + 4 * i, 4);
        y[i] = static_cast<float>(v);
      }
      break;
    case dtype::f16: f16_row(s, y, dst.size()); break;
    case dtype::bf16:
      for (size_t i = 0; i < dst.size(); ++i) y[i] = bf16_to_float(le16(s + 2 * i));
      break;
    case dtype::q8_0: row_q8_0(s, y, blocks); break;
    case dtype::q4_0: row_q4_0(s, y, blocks); break;
    case dtype::q4_k: row_q4_k_or_q5_k<false>(s, y, blocks); break;
    case dtype::q6_k: row_q6_k(s, y, blocks); break;
    case dtype::q4_1: row_offset32(s, y, blocks, 4); break;
    case dtype::q5_0: row_q5_0(s, y, blocks); break;
    case dtype::q5_1: row_offset32(s, y, blocks, 5); break;
    case dtype::q5_k: row_q4_k_or_q5_k<true>(s, y, blocks); break;
  }
  return {};
}

float dequantize_element(dtype t, const uint8_t* row, int64_t c) {
  if (!is_quantized(t)) {
    float v = 0;
    (void)dequantize_row(t, {row + c * block_bytes(t), static_cast<size_t>(block_bytes(t))}, {&v, 1});
    return v;
  }
  float block[256];
  const int64_t be = block_elements(t);
  const uint8_t* b = row + c / be * block_bytes(t);
  (void)dequantize_row(t, {b, static_cast<size_t>(block_bytes(t))}, {block, static_cast<size_t>(be)});
  return block[c % be];
}

expected<void> quantize_row(dtype t, std::span<const float> src, std::span<uint8_t> dst) {
  const auto n = static_cast<int64_t>(src.size());
  auto bytes = row_bytes(t, n);
  if (!bytes) return forward_error(bytes);
  if (static_cast<uint64_t>(*bytes) != dst.size())
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + to_string(t) + " elements takes " +
                                                        std::to_string(*bytes) + " bytes, not " + std::to_string(dst.size()));
  const auto blocks = static_cast<size_t>(n / block_elements(t));
  uint8_t* b = dst.data();
  const float* x = src.data();
  switch (t) {
    case dtype::f32: std::memcpy(b, x, src.size() * 4); break;
    case dtype::i32:
      for (size_t i = 0; i < src.size(); ++i) {
        const auto v = static_cast<int32_t>(round_to(dtype::i32, x[i]));
        std::memcpy(b + 4 * i, &v, 4);
      }
      break;
    case dtype::f16:
      for (size_t i = 0; i < src.size(); ++i) put16(b + 2 * i, float_to_half(x[i]));
      break;
    case dtype::bf16:
      for (size_t i = 0; i < src.size(); ++i) put16(b + 2 * i, float_to_bf16(x[i]));
      break;
    case dtype::q8_0: quantize_q8_0(x, b, blocks); break;
    case dtype::q4_0: quantize_q4_0(x, b, blocks); break;
    case dtype::q4_k: quantize_q4_k(x, b, blocks); break;
    case dtype::q6_k: quantize_q6_k(x, b, blocks); break;
    case dtype::q4_1: quantize_offset32(x, b, blocks, 4); break;
    case dtype::q5_0: quantize_q5_0(x, b, blocks); break;
    case dtype::q5_1: quantize_offset32(x, b, blocks, 5); break;
    case dtype::q5_k: quantize_q5_k(x, b, blocks); break;
  }
  return {};
}

}  // namespace mesh
