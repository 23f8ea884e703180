#pragma once
/// The CPU executor's linear layer, y = x W^T, with W in its stored dtype (f32, f16, bf16 or one of
/// ggml's block quantizations, graph/quant.hpp) and x and y in f32.
///
/// Few rows of x (a decode step): each weight row is read once and dotted with every row of x.
/// On the AVX2 path f32, f16, bf16, q8_0, q4_0, q4_k and q6_k rows are decoded in registers (the
/// block's integers widened to floats, its scales applied per block or sub-block); the other
/// dtypes, and every dtype on the portable path, decode a row into a buffer and dot that. x is
/// never quantized: the sums are f32, within float rounding of dequantize_row() then a dot.
/// Many rows (a prompt): blocks of weight rows are decoded to f32 and multiplied by gemm_f32.
#include <cstdint>

#include "graph/dtype.hpp"
#include "gpu/cpu_isa.hpp"

namespace mesh::gpu {

class thread_pool;

struct linear_args {
  dtype type = dtype::f32;      ///< the weight's dtype
  const uint8_t* w = nullptr;   ///< n rows of row_bytes(type, k) bytes each
  int64_t n = 0, k = 0;         ///< weight rows, elements per row (a multiple of the block)
  const float* x = nullptr;     ///< rows x k, row-major
  int64_t rows = 0;
  float* y = nullptr;           ///< rows x n, row-major: y[r][j] = x[r] . W[j]
};

/// Rows of x from which the weight is decoded to f32 blocks and multiplied with gemm_f32 (the
/// register-decoding dots re-decode each weight row for every 4 rows of x).
constexpr int64_t linear_gemm_rows = 8;

/// y = x W^T. Weight rows are spread over `pool` (when given and the product is worth it).
void linear_f32(const linear_args& args, cpu_isa isa, thread_pool* pool);

/// Whether linear_f32 decodes dtype `t` in registers on `isa` (else through a row buffer).
bool decodes_in_registers(dtype t, cpu_isa isa);

}  // namespace mesh::gpu
