#pragma once
/// How the all-reduce puts floats on the wire (pure, no I/O): wire_format's element formats
/// (f32, bf16, f16) and its block formats, which carry blocks of `codec_block` values as one f32
/// scale and a code per value:
/// - int8: the scale is the block's largest |x| / 127, each value round(x / scale) in -127..127
///   (36 bytes per 32 values: 3.6x fewer than f32);
/// - fp4: 4-bit floats with no mantissa (sign + 3 exponent bits, E3M0, as in the streaming
///   DiLoCo paper): the scale is the block's largest |x|, a value is 0 or +-scale * 2^-j for
///   j = 0..6, the power of two nearest |x| / scale in the log domain, 0 below 2^-6.5
///   (20 bytes per 32 values: 6.4x fewer than f32).
/// A block holding a NaN or an infinity decodes to NaN throughout, so a diverged gradient is not
/// hidden by the compression.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/states.hpp"

namespace mesh {

/// Values per block of the block formats.
inline constexpr size_t codec_block = 32;

/// Bytes `count` values take in format `f`.
size_t encoded_bytes(size_t count, wire_format f);

/// `count` values in format `f` into `out` (resized to encoded_bytes).
void encode(const float* xs, size_t count, wire_format f, std::vector<uint8_t>& out);
/// The same into `out`, which has room for encoded_bytes(count, f) (a shared region's place).
void encode_into(const float* xs, size_t count, wire_format f, uint8_t* out);

/// Decodes `count` values of `in` (encoded_bytes(count, f) long: the caller checks) into `ys`.
void decode(const uint8_t* in, size_t count, wire_format f, float* ys);

}  // namespace mesh
