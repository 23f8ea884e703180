#pragma once
/// ggml's block quantizations as graph dtypes: their layout, byte counts and the CPU reference
/// that reads them (and a simple quantizer that writes them, for tests and tools).
///
/// A quantized tensor has a logical shape [..., k] (rank >= 1) with k a multiple of its block's
/// elements; its bytes are rows x row_bytes(k), each row a run of whole blocks, laid out exactly
/// as ggml's quantizers write them (ggml/src/ggml-common.h), so a GGUF tensor's bytes are the
/// tensor's bytes as they lie in the file:
///
/// | dtype | elements | bytes | block                                                           |
/// | ----- | -------- | ----- | --------------------------------------------------------------- |
/// | q8_0  | 32       | 34    | f16 d, 32 x int8 q;                   x = q * d                 |
/// | q4_0  | 32       | 18    | f16 d, 16 bytes of nibbles;           x = (q - 8) * d           |
/// | q4_1  | 32       | 20    | f16 d, f16 m, 16 bytes of nibbles;    x = q * d + m             |
/// | q5_0  | 32       | 22    | f16 d, 4 bytes qh, 16 bytes nibbles;  x = (q - 16) * d          |
/// | q5_1  | 32       | 24    | f16 d, f16 m, 4 bytes qh, 16 bytes;   x = q * d + m             |
/// | q4_k  | 256      | 144   | f16 d, f16 dmin, 12 bytes 6-bit scales/mins, 128 bytes nibbles  |
/// | q5_k  | 256      | 176   | f16 d, f16 dmin, 12 bytes scales/mins, 32 bytes qh, 128 bytes   |
/// | q6_k  | 256      | 210   | 128 bytes ql, 64 bytes qh, 16 x int8 scales, f16 d              |
///
/// Element i of a block (ggml/src/ggml-quants.c, dequantize_row_*):
/// - q8_0: x[i] = d * q[i], q int8.
/// - q4_0: byte j (0..15) holds element j in its low nibble and element j+16 in its high nibble;
///   x = (nibble - 8) * d.
/// - q4_1: the nibbles as q4_0's, unsigned; x = q * d + m (m is the block's minimum, signed).
/// - q5_0: q4_0's nibbles are q's low 4 bits; its 5th bit is bit i of qh (4 bytes, a
///   little-endian uint32) for element i; x = (q - 16) * d.
/// - q5_1: q5_0's 5-bit q, unsigned; x = q * d + m.
/// - q4_k: 8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed into 12 bytes
///   (sub-block j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
///   m = (s[j+4] >> 4) | (s[j] >> 6) << 4). The 128 nibble bytes come in 4 groups of 32: group g's
///   low nibbles are sub-block 2g, its high nibbles sub-block 2g+1; x = d*sc * q - dmin*m.
/// - q5_k: q4_k with a 5th bit per element: element l of sub-block j (0..7) takes bit j of qh[l]
///   (32 bytes after the scales; the nibbles follow them); x = d*sc * q - dmin*m, q < 32.
/// - q6_k: 16 sub-blocks of 16 with an int8 scale each; a 6-bit q = 4 low bits from ql, 2 high bits
///   from qh, minus 32; x = d * scale * q. Per half of 128 elements (ql advancing 64, qh 32): for
///   l in 0..31, element l: ql[l] low, qh[l] bits 0-1; l+32: ql[l+32] low, bits 2-3; l+64: ql[l]
///   high, bits 4-5; l+96: ql[l+32] high, bits 6-7.
///
/// The plain dtypes count as blocks of one element here, so every function takes any dtype.
#include <cstdint>
#include <span>
#include <string>

#include "base/error.hpp"
#include "graph/dtype.hpp"
#include "graph/shape.hpp"

namespace mesh {

/// Elements per block: 32 (q8_0, q4_0, q4_1, q5_0, q5_1), 256 (q4_k, q5_k, q6_k), 1 for the plain
/// dtypes.
int64_t block_elements(dtype t);

/// Bytes per block: the table above; size_of(t) for the plain dtypes.
int64_t block_bytes(dtype t);

/// Bytes of a row of `n` elements; an error (invalid_argument) when n is negative, not a multiple
/// of the block, or so large that the byte count overflows.
expected<int64_t> row_bytes(dtype t, int64_t n);

/// Bytes of a tensor of dtype `t` and shape `dims`: element count x size_of(t) for the plain
/// dtypes; rows x row_bytes(last dim) for the quantized ones. -1 when the shape cannot hold `t`
/// (a quantized tensor of rank 0, or a last dim not a multiple of the block), a dim is negative,
/// or the count passes `limit` bytes.
int64_t byte_size(dtype t, const shape& dims, int64_t limit = INT64_MAX / 4);

/// Why byte_size() gave -1, as a sentence naming dtype and shape (for error messages).
std::string byte_size_problem(dtype t, const shape& dims);

/// Decodes one row: `dst.size()` elements of dtype `t` from `src`, which must hold exactly
/// row_bytes(t, dst.size()) bytes. An error (invalid_argument) when the sizes do not fit. This
/// is the reference every kernel that reads quantized blocks is tested against (and it is
/// checked against a numpy implementation of ggml's definitions: tests/models/test_dequantize.cpp).
expected<void> dequantize_row(dtype t, std::span<const uint8_t> src, std::span<float> dst);

/// Element `c` of a row of dtype `t` (c < the row's elements), decoded alone.
float dequantize_element(dtype t, const uint8_t* row, int64_t c);

/// Encodes one row: `src.size()` values (a multiple of the block) into row_bytes(t, src.size())
/// bytes of `dst`, rounding to nearest. A simple quantizer (per-block absolute maximum or min/max
/// range, and for the k-quants the sub-block scales rounded to 6/8 bits), not ggml's
/// error-minimising search (nor its reference quantizers' exact rounding): good for tests and
/// tools, not for making checkpoints. Plain dtypes are stored rounded.
expected<void> quantize_row(dtype t, std::span<const float> src, std::span<uint8_t> dst);

}  // namespace mesh
