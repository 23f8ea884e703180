#include "models/dequantize.hpp"

#include <cstring>
#include <string>

#include "graph/quant.hpp"

namespace mesh::models {
namespace {

float bits_to_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
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
  // The block decoding lives in graph/quant.cpp (the executors' reference); the error messages
  // here use ggml's names of the types, as the rest of this layer does.
  const auto n = static_cast<int64_t>(dst.size());
  auto bytes = row_bytes(t, n);
  if (!bytes) return forward_error(bytes);
  if (static_cast<uint64_t>(*bytes) != src.size())
    return make_error(error_code::invalid_argument, "a row of " + std::to_string(n) + " " + to_string(t) + " elements takes " +
                                                        std::to_string(*bytes) + " bytes, not " + std::to_string(src.size()));
  return mesh::dequantize_row(to_dtype(t), src, dst);
}

}  // namespace mesh::models
