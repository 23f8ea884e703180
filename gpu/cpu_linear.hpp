#pragma once
/// The CPU executor's linear layer, y = x W^T, with W in its stored dtype (f32, f16, bf16 or one of
/// ggml's block quantizations, graph/quant.hpp) and x and y in f32.
///
/// Few rows of x (a decode step): each weight row is read once and dotted with every row of x.
/// On the AVX2 path, q8_0, q4_0, q4_k and q6_k weights take integer dots by default
/// (linear_x::int8): each row of x is quantized to 8 bits once per call and the weight blocks'
/// integers are multiplied with it in integers (cpu_quant_dot.hpp: the results differ from f32 x
/// by at most sum |w_i| * max|x| over i's block / 254). With linear_x::f32 (env MESH_CPU_LINEAR=f32
/// for the executor), and for f32, f16 and bf16 weights, rows are decoded to floats in registers
/// (integers widened, scales applied per block or sub-block) and dotted with f32 x: within float
/// rounding of dequantize_row() then a dot. The other dtypes, and every dtype on the portable
/// path, decode a row into a buffer and dot that with f32 x.
/// Many rows (a prompt): the integer dots too where they apply (4 rows of x per pass over a weight
/// row), so that a row's result is the same bit for bit whatever rows came with it (a prompt
/// replayed after a split model's failover continues the decoded stream exactly); otherwise blocks
/// of weight rows are decoded to f32 and multiplied by gemm_f32.
#include <cstdint>

#include "graph/dtype.hpp"
#include "gpu/cpu_isa.hpp"

namespace mesh::gpu {

class thread_pool;

/// What linear_f32 does with x where an integer dot exists (takes_int8_dots()).
enum class linear_x {
  f32,   ///< x stays f32; weights decoded to floats
  int8,  ///< x quantized to 8 bits once per call; integer dots for every number of rows
};

/// int8, or f32 when the environment variable MESH_CPU_LINEAR is "f32" (read once): the CPU
/// executor's choice.
linear_x default_linear_x();

struct linear_args {
  dtype type = dtype::f32;      ///< the weight's dtype
  const uint8_t* w = nullptr;   ///< n rows of row_bytes(type, k) bytes each
  int64_t n = 0, k = 0;         ///< weight rows, elements per row (a multiple of the block)
  const float* x = nullptr;     ///< rows x k, row-major
  int64_t rows = 0;
  float* y = nullptr;           ///< rows x n, row-major: y[r][j] = x[r] . W[j]
  linear_x x_mode = linear_x::f32;
};

/// Rows of x from which the weight is decoded to f32 blocks and multiplied with gemm_f32 (the
/// register-decoding dots re-decode each weight row for every 4 rows of x).
constexpr int64_t linear_gemm_rows = 8;

/// y = x W^T. Weight rows are spread over `pool` (when given and the product is worth it).
void linear_f32(const linear_args& args, cpu_isa isa, thread_pool* pool);

/// Whether linear_f32 decodes dtype `t` in registers on `isa` for f32 x (else through a row buffer).
bool decodes_in_registers(dtype t, cpu_isa isa);

/// Whether products of dtype `t` on `isa` round x to 8 bits under linear_x::int8, and few-row
/// ones take integer dots (q8_0, q4_0, q4_k and q6_k on the AVX2 path).
bool takes_int8_dots(dtype t, cpu_isa isa);

}  // namespace mesh::gpu
