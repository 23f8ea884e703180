#pragma once
/// Element types of tensors, and conversions between them and float/double.
#include <cstdint>
#include <cstring>
#include <string>

#include "graph/ops.hpp"

namespace mesh {

/// The element types a graph can hold. Values are part of the wire format: never renumber.
///
/// q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k and q6_k are ggml's block quantizations, laid out
/// exactly as ggml writes them (graph/quant.hpp): a tensor of these is rows of whole blocks along its last axis. They
/// are storage only: a graph holds them in leaves (inputs, parameters) that `linear` reads as
/// its weight, and nowhere else (validate() refuses other uses).
enum class dtype : uint8_t {
  f32 = 0, f16 = 1, bf16 = 2, i32 = 3,
  q8_0 = 4, q4_0 = 5, q4_k = 6, q6_k = 7, q4_1 = 8, q5_0 = 9, q5_1 = 10, q5_k = 11
};

inline constexpr int dtype_count = 12;

/// True for the block-quantized dtypes (every value from q8_0 on).
inline constexpr bool is_quantized(dtype t) { return t >= dtype::q8_0; }

/// Bytes per element of an element type (f32, f16, bf16, i32). A quantized dtype has no size
/// per element: use byte_size() (graph/quant.hpp) for a tensor's bytes.
inline constexpr size_t size_of(dtype t) { return t == dtype::f16 || t == dtype::bf16 ? 2 : 4; }

/// True for f32, f16 and bf16 (not for the quantized dtypes: they are not computed with).
inline constexpr bool is_float(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

/// "f32", "f16", "bf16", "i32", "q8_0", "q4_0", "q4_k", "q6_k", "q4_1", "q5_0", "q5_1", "q5_k".
const char* to_string(dtype t);

/// f32 -> IEEE half, round to nearest even (overflow becomes inf, NaN stays NaN).
uint16_t float_to_half(float x);
float half_to_float(uint16_t h);

/// f32 -> bfloat16, round to nearest even.
inline uint16_t float_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

/// Rounds a value to what `t` can hold (the reference evaluator stores doubles between ops, and
/// rounds after each op so that it sees what a device storing `t` sees). Quantized dtypes are
/// never computed into: x comes back unchanged.
double round_to(dtype t, double x);

/// Whether an i32 result of `op` is integer arithmetic, which wraps (add, sub, mul, div, neg,
/// abs, reduce_sum, scatter_add); other i32 results (casts, an empty reduce_max's -inf) saturate.
inline bool wraps_i32(op_kind op) {
  return op == op_kind::add || op == op_kind::sub || op == op_kind::mul || op == op_kind::div || op == op_kind::neg ||
         op == op_kind::abs || op == op_kind::reduce_sum || op == op_kind::scatter_add;
}

/// An i32 result of integer arithmetic: `v` modulo 2^32, in two's complement (ops.hpp).
inline int32_t wrap_i32(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }

/// The same for an exact integer held in a double (|x| < 2^53, e.g. a sum of i32 values); NaN and
/// infinities give 0.
double wrap_i32_exact(double x);

}  // namespace mesh
