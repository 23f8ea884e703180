#include "actors/allreduce_codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "graph/dtype.hpp"

namespace mesh {
namespace {

bool block_format(wire_format f) { return f == wire_format::int8 || f == wire_format::fp4; }

size_t code_bytes(size_t values, wire_format f) { return f == wire_format::int8 ? values : (values + 1) / 2; }

/// The block's scale: its largest |x| (NaN when it holds a NaN or an infinity).
float block_max(const float* xs, size_t n) {
  float top = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(xs[i])) return std::numeric_limits<float>::quiet_NaN();
    top = std::max(top, std::abs(xs[i]));
  }
  return top;
}

/// The E3M0 code of x against `scale` (> 0): bit 3 the sign, bits 0-2 e (0: zero, else
/// scale * 2^(e - 7)), the nearest power of two in the log domain (midpoint 2^-0.5).
uint8_t fp4_code(float x, float scale) {
  const float a = std::abs(x) / scale;
  if (a == 0) return 0;
  int exp = 0;
  const float m = std::frexp(a, &exp);  // a = m 2^exp, m in [0.5, 1)
  const int k = m >= 0.70710678f ? exp : exp - 1;  // nearest power 2^k, k <= 0
  const int e = std::min(7, 7 + k);
  if (e < 1) return 0;
  return static_cast<uint8_t>((x < 0 ? 8 : 0) | e);
}

float fp4_value(uint8_t code, float scale) {
  const int e = code & 7;
  if (e == 0) return 0;
  const float v = std::ldexp(scale, e - 7);
  return code & 8 ? -v : v;
}

}  // namespace

size_t encoded_bytes(size_t count, wire_format f) {
  if (!block_format(f)) return count * (f == wire_format::f32 ? 4 : 2);
  const size_t full = count / codec_block, rest = count % codec_block;
  return (full + (rest ? 1 : 0)) * 4 + full * code_bytes(codec_block, f) + code_bytes(rest, f);
}

void encode(const float* xs, size_t count, wire_format f, std::vector<uint8_t>& out) {
  out.resize(encoded_bytes(count, f));
  encode_into(xs, count, f, out.data());
}

void encode_into(const float* xs, size_t count, wire_format f, uint8_t* o) {
  if (f == wire_format::fp4) std::memset(o, 0, encoded_bytes(count, f));  // codes are or-ed in by halves
  if (f == wire_format::f32) {
    if (count) std::memcpy(o, xs, count * 4);
    return;
  }
  if (!block_format(f)) {
    for (size_t i = 0; i < count; ++i) {
      const uint16_t h = f == wire_format::bf16 ? float_to_bf16(xs[i]) : float_to_half(xs[i]);
      std::memcpy(o + 2 * i, &h, 2);
    }
    return;
  }
  for (size_t b0 = 0; b0 < count; b0 += codec_block) {
    const size_t n = std::min(codec_block, count - b0);
    const float top = block_max(xs + b0, n);
    const float scale = f == wire_format::int8 ? top / 127.0f : top;
    std::memcpy(o, &scale, 4);
    o += 4;
    const bool zero = !(scale > 0);  // all zeros, or NaN (decoded from the scale alone)
    for (size_t i = 0; i < n; ++i) {
      if (f == wire_format::int8) {
        const long q = zero ? 0 : std::clamp(std::lrint(xs[b0 + i] / scale), -127L, 127L);
        o[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      } else {
        const uint8_t c = zero ? 0 : fp4_code(xs[b0 + i], scale);
        o[i / 2] = static_cast<uint8_t>(o[i / 2] | (i % 2 ? c << 4 : c));
      }
    }
    o += code_bytes(n, f);
  }
}

void decode(const uint8_t* in, size_t count, wire_format f, float* ys) {
  if (f == wire_format::f32) {
    if (count) std::memcpy(ys, in, count * 4);
    return;
  }
  if (!block_format(f)) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      ys[i] = f == wire_format::bf16 ? bf16_to_float(h) : half_to_float(h);
    }
    return;
  }
  for (size_t b0 = 0; b0 < count; b0 += codec_block) {
    const size_t n = std::min(codec_block, count - b0);
    float scale;
    std::memcpy(&scale, in, 4);
    in += 4;
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(scale)) ys[b0 + i] = scale;
      else if (f == wire_format::int8) ys[b0 + i] = static_cast<float>(static_cast<int8_t>(in[i])) * scale;
      else ys[b0 + i] = fp4_value(static_cast<uint8_t>(i % 2 ? in[i / 2] >> 4 : in[i / 2] & 15), scale);
    }
    in += code_bytes(n, f);
  }
}

}  // namespace mesh
