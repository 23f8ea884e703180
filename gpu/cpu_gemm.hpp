#pragma once
/// The CPU executor's f32 matrix product: C = A x B over a batch, blocked for the caches (panels
/// of A and B packed into contiguous buffers, k in slices that stay in L1/L2) around a register
/// tile: 6 x 16 outputs in twelve AVX2 registers updated with FMA, or the same tile in plain C++
/// (which the compiler vectorises) on CPUs without AVX2. Pure on pointers and strides.
#include <cstdint>

#include "gpu/cpu_isa.hpp"

namespace mesh::gpu {

class thread_pool;

/// Operands of gemm_f32. Element (i, p) of A is a[i * a_row + p * a_col], (p, j) of B is
/// b[p * b_row + j * b_col], (i, j) of C is c[i * c_row + j]; batch t adds t * a_batch (b_batch,
/// c_batch): b_batch = 0 uses one B for every batch. Strides are in elements.
struct gemm_args {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t a_row = 0, a_col = 1;
  const float* b = nullptr;
  int64_t b_row = 0, b_col = 1;
  float* c = nullptr;
  int64_t c_row = 0;
  int64_t batch = 1, a_batch = 0, b_batch = 0, c_batch = 0;
};

/// C = A x B (C overwritten; zeros where k = 0), summed in f32 in order of k within each slice
/// of 256. NaN and infinity propagate as in the naive loop (each product is formed). Output
/// tiles are spread over `pool` when given and the product is large enough to be worth it.
/// Allocates only when a thread's packing buffers must grow (once, to their largest size).
void gemm_f32(const gemm_args& args, cpu_isa isa, thread_pool* pool);

}  // namespace mesh::gpu
