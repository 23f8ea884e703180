#include "graph/dtype.hpp"

#include <cmath>
#include <limits>

namespace mesh {

const char* to_string(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
    case dtype::q8_0: return "q8_0";
    case dtype::q4_0: return "q4_0";
    case dtype::q4_k: return "q4_k";
    case dtype::q6_k: return "q6_k";
    case dtype::q4_1: return "q4_1";
    case dtype::q5_0: return "q5_0";
    case dtype::q5_1: return "q5_1";
    case dtype::q5_k: return "q5_k";
  }
  return "?";
}

uint16_t float_to_half(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x47800000u) {                                             // >= 65536: inf
    // Values that round below 65520 still fit; 65520 and above round to inf.
    if (abs < 0x477ff000u) return static_cast<uint16_t>(sign | 0x7bffu);
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Let the FPU do the rounding: add a magic number that aligns the half's lsb.
    float f;
    std::memcpy(&f, &abs, 4);
    f += 0.5f;  // 2^-1: the half subnormal lsb (2^-24) becomes the float lsb
    uint32_t r;
    std::memcpy(&r, &f, 4);
    return static_cast<uint16_t>(sign | (r - 0x3f000000u));
  }
  // Normal: rebias exponent (127 -> 15) and round the mantissa to 10 bits, nearest even.
  uint32_t m = abs + ((15u - 127u) << 23) + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | (m >> 13));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(man), -24);
    uint32_t u;
    std::memcpy(&u, &out, 4);
    u |= sign;
    std::memcpy(&out, &u, 4);
    return out;
  }
  uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 127u - 15u) << 23) | (man << 13);
  std::memcpy(&out, &u, 4);
  return out;
}

double round_to(dtype t, double x) {
  switch (t) {
    case dtype::f32: return static_cast<double>(static_cast<float>(x));
    case dtype::f16: return half_to_float(float_to_half(static_cast<float>(x)));
    case dtype::bf16: return bf16_to_float(float_to_bf16(static_cast<float>(x)));
    case dtype::i32: {
      if (std::isnan(x)) return 0;
      const double lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      return std::trunc(x < lo ? lo : (x > hi ? hi : x));
    }
    case dtype::q8_0:
    case dtype::q4_0:
    case dtype::q4_k:
    case dtype::q6_k:
    case dtype::q4_1:
    case dtype::q5_0:
    case dtype::q5_1:
    case dtype::q5_k: return x;
  }
  return x;
}

double wrap_i32_exact(double x) {
  if (!std::isfinite(x)) return 0;
  return wrap_i32(static_cast<int64_t>(std::fmod(std::trunc(x), 4294967296.0)));
}

}  // namespace mesh
