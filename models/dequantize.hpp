#pragma once
/// Reading tensor bytes as floats: every tensor_type, one row at a time. The block decoding is
/// graph/quant.hpp's (the reference the executors' kernels are tested against; graph/ cannot
/// depend on this layer); this layer's tests check it against a numpy implementation of ggml's
/// definitions (tests/models/test_dequantize.cpp).
///
/// The blocks, as ggml's quantizers write them (ggml/src/ggml-quants.c), element i of a block:
/// - Q8_0: x[i] = d * q[i], q int8.
/// - Q4_0: byte j (0..15) holds element j in its low nibble and element j+16 in its high nibble;
///   x = (nibble - 8) * d.
/// - Q4_1: the nibbles as Q4_0's, unsigned; x = q * d + m (m is the block's minimum, signed).
/// - Q5_0: Q4_0's nibbles are q's low 4 bits; its 5th bit is bit i of qh (4 bytes, a
///   little-endian uint32) for element i; x = (q - 16) * d.
/// - Q5_1: Q5_0's 5-bit q, unsigned; x = q * d + m.
/// - Q4_K: 8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed into 12 bytes
///   (sub-block j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
///   m = (s[j+4] >> 4) | (s[j] >> 6) << 4). The 128 nibble bytes come in 4 groups of 32: group g's
///   low nibbles are sub-block 2g, its high nibbles sub-block 2g+1; x = d*sc * q - dmin*m.
/// - Q5_K: Q4_K with a 5th bit per element: element l of sub-block j (0..7) takes bit j of qh[l]
///   (32 bytes after the scales; the nibbles follow them); x = d*sc * q - dmin*m, q < 32.
/// - Q6_K: 16 sub-blocks of 16 with an int8 scale each; a 6-bit q = 4 low bits from ql, 2 high bits
///   from qh, minus 32; x = d * scale * q. Per half of 128 elements (ql advancing 64, qh 32): for
///   l in 0..31, element l: ql[l] low, qh[l] bits 0-1; l+32: ql[l+32] low, bits 2-3; l+64: ql[l]
///   high, bits 4-5; l+96: ql[l+32] high, bits 6-7.
#include <cstdint>
#include <span>

#include "base/error.hpp"
#include "models/tensor_type.hpp"

namespace mesh::models {

/// IEEE half -> single, exact for every input (subnormals, infinities, NaN).
float f16_to_f32(uint16_t h);
/// Single -> IEEE half, rounding to nearest even; too large becomes infinity, NaN stays NaN.
uint16_t f32_to_f16(float x);
/// bfloat16 -> single (exact).
float bf16_to_f32(uint16_t b);
/// Single -> bfloat16, rounding to nearest even; NaN stays NaN.
uint16_t f32_to_bf16(float x);

/// Decodes one row: `dst.size()` elements of type `t` from `src`, which must hold exactly
/// row_bytes(t, dst.size()) bytes. An error (invalid_argument) when the sizes do not fit.
expected<void> dequantize_row(tensor_type t, std::span<const uint8_t> src, std::span<float> dst);

}  // namespace mesh::models
