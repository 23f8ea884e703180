#include "models/dequantize.hpp"

#include <cstring>
#include <string>

namespace mesh::models {
namespace {

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

float bits_to_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

void row_f32(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = src + 4 * i;
    dst[i] = bits_to_float(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
                           static_cast<uint32_t>(p[3]) << 24);
  }
}

void row_q8_0(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 34, y += 32) {
    const float d = f16_to_f32(le16(b));
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}

void row_q4_0(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 18, y += 32) {
    const float d = f16_to_f32(le16(b));
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

// The 6-bit scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes: the first four
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

void row_q4_k(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 144, y += 256) {
    const float d = f16_to_f32(le16(b));
    const float dmin = f16_to_f32(le16(b + 2));
    const uint8_t* scales = b + 4;
    const uint8_t* qs = b + 16;
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
        out[l] = d_lo * static_cast<float>(q[l] & 0x0f) - min_lo;
        out[l + 32] = d_hi * static_cast<float>(q[l] >> 4) - min_hi;
      }
    }
  }
}

void row_q6_k(const uint8_t* b, float* y, size_t blocks) {
  for (size_t i = 0; i < blocks; ++i, b += 210, y += 256) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16_to_f32(le16(b + 208));
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

}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | mantissa << 13);  // inf, NaN
  if (exponent != 0) return bits_to_float(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
  if (mantissa == 0) return bits_to_float(sign);
  // Subnormal half: normalize into the single's wider exponent range.
  int e = 127 - 15 + 1;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return bits_to_float(sign | static_cast<uint32_t>(e) << 23 | (mantissa & 0x3ffu) << 13);
}

uint16_t f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN stays NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal, in units of 2^-24, rounded to even.
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24 for exponents -25..-15
    const uint32_t value = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    const uint32_t rounded = value + (rest > halfway || (rest == halfway && (value & 1)) ? 1 : 0);
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent and round the 23-bit mantissa to 10 bits (carry may bump it).
  const uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t rounded = rebased + 0x0fffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

float bf16_to_f32(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

expected<void> dequantize_row(tensor_type t, std::span<const uint8_t> src, std::span<float> dst) {
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
    case tensor_type::f32: row_f32(s, y, dst.size()); break;
    case tensor_type::f16:
      for (size_t i = 0; i < dst.size(); ++i) y[i] = f16_to_f32(le16(s + 2 * i));
      break;
    case tensor_type::bf16:
      for (size_t i = 0; i < dst.size(); ++i) y[i] = bf16_to_f32(le16(s + 2 * i));
      break;
    case tensor_type::q8_0: row_q8_0(s, y, blocks); break;
    case tensor_type::q4_0: row_q4_0(s, y, blocks); break;
    case tensor_type::q4_k: row_q4_k(s, y, blocks); break;
    case tensor_type::q6_k: row_q6_k(s, y, blocks); break;
  }
  return {};
}

}  // namespace mesh::models
