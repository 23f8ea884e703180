#pragma once
/// The CPU linear's integer dot products (few rows of x, the AVX2 path): each row of x is
/// quantized to 8 bits once per linear call, then dotted with q8_0, q4_0, q4_k or q6_k weight
/// rows in integers (AVX2 maddubs/madd), each weight block's scales applied to its integer
/// partial sums and one float multiply-add per block.
///
/// x's blocks (as ggml's q8_0 and q8_K): B = 32 elements for q8_0 and q4_0 weights, 256 for q4_k
/// and q6_k. Per block, with m = max |x_i| over it (f32):
///   d = m / 127 (f32 division),  q_i = round-to-nearest-even(x_i / d) (f32 division),
///   clamped to [-127, 127]; d = 0 gives q = 0; a block holding NaN or infinity gets d = NaN, so
///   the products it enters are NaN.
/// The 256-element blocks also keep the sums of q over each 16 (q4_k's minimum terms, q6_k's -32).
/// The weights stay exact and the integer sums are exact; the block scales combine in f32.
///
/// Error: |x_i - d q_i| <= d/2 while d is a normal float (m >= 127 * 2^-126), so against f32 x
///   |y_int8 - x . w| <= sum_i |w_i| * m(block of i) / 254   (plus f32 rounding of the scales),
/// w the weight as dequantize_row() gives it. One large element in a block coarsens the block's
/// other elements (their d grows with it).
#include <cstdint>

#include "graph/dtype.hpp"

namespace mesh::gpu {

/// Elements per quantized block of x for weight dtype t: 32 (q8_0, q4_0), 256 (q4_k, q6_k), 0
/// for the dtypes without an integer dot.
int64_t int8_x_block(dtype t);

/// Bytes of one quantized row of x of k elements (a multiple of int8_x_block(t)) for weight dtype
/// t: k codes, then k / B f32 scales, then (B = 256) k / 16 int16 sums; a multiple of 64.
int64_t int8_x_row_bytes(dtype t, int64_t k);

/// Quantizes `rows` rows of x (k elements each, `ldx` floats apart) for weight dtype t into `out`
/// (rows x int8_x_row_bytes(t, k) bytes, 32-byte aligned). AVX2: call only where the CPU has it.
void quantize_x_int8(dtype t, const float* x, int64_t rows, int64_t k, int64_t ldx, uint8_t* out);

/// Dots one weight row `w` (k elements of the dtype) with R quantized rows of x (`ldxq` bytes
/// apart) and writes y[r * ldy] for r < R.
using int8_dot_fn = void (*)(const uint8_t* w, int64_t k, const uint8_t* xq, int64_t ldxq, float* y, int64_t ldy);

/// The integer dot of weight dtype t for R (1..4) rows of x, or null where t has none (or off
/// x86-64). Each row's result is the same whatever R. AVX2: call only where the CPU has it.
int8_dot_fn int8_dot(dtype t, int64_t R);

}  // namespace mesh::gpu
