#pragma once
/// Internal to the GLSL emitters: the emitter of each kernel kind, for emit() (glsl.cpp), and the
/// operand helpers that the f32 and the cooperative-matrix matmul emitters share.
#include <cstdint>
#include <optional>
#include <string>

#include "gpu/glsl.hpp"

namespace mesh::gpu::detail {

class emitter;   // glsl_emitter.hpp
struct mm_dims;  // matmul_schedule.hpp

/// kernel_kind::reduce: one-pass (`redg`, `redt`, `redc`) or one pass of a split reduction
/// (`reds1`/`reds2`, `redcs1`/`redcs2`). glsl_reduce.cpp.
kernel_source reduction(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

/// kernel_kind::rows: a workgroup per row runs every member kernel over it. glsl_reduce.cpp.
kernel_source rows_kernel(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

/// kernel_kind::matmul: the tiled cooperative-matrix kernel, the first cooperative-matrix kernel,
/// the warp-tiled f32 kernel or the classic one, the first that applies. glsl_matmul.cpp.
kernel_source matmul(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

/// kernel_kind::linear: the matrix-vector kernel for few rows of x (`lmv`), else the tiled
/// matmul kernels with the weight read transposed. glsl_linear.cpp.
kernel_source linear(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

/// kernel_kind::kv_write: one thread per element of the value, written into the cache's buffer
/// at the runtime position. glsl_linear.cpp.
kernel_source kv_write(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

/// kernel_kind::attention: pass 1 (`attn1`) a workgroup per query row, head and slice of the
/// keys, pass 2 (`attn2`) a workgroup per query row and head combining the slices.
/// glsl_attention.cpp.
kernel_source attention(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

/// The rows of x a linear may have and still take the matrix-vector kernel.
inline constexpr int64_t matvec_max_rows = 16;
/// The rows of a matmul's a that take the few-row kernel `mms` (glsl_matmul.cpp).
inline constexpr int64_t matmul_skinny_max_rows = 8;

/// The f16 matmuls on tensor cores (glsl_coopmat.cpp); nullopt when the kernel does not apply.
std::optional<kernel_source> matmul_coopmat_tiled(const graph& g, const plan& q, const kernel& k, const device_caps& caps);
std::optional<kernel_source> matmul_coopmat(const graph& g, const plan& q, const kernel& k, const device_caps& caps);
/// The shader header of the cooperative-matrix kernels (16-bit storage and arithmetic,
/// GL_NV_cooperative_matrix, subgroups), `threads` per workgroup. glsl_coopmat.cpp.
std::string coopmat_header(int64_t threads);
/// The first line of a tensor-core kernel whose SPIR-V is rewritten after compilation
/// (kernel_source::khr_matrices, bf16_matrices; "" for none): it keeps such a kernel's GLSL apart
/// from the NV kernel of the same text, in the shader cache and in the pipelines the executor
/// shares by source.
std::string rewrite_note(const kernel_source& s);
/// A linear of more than matvec_max_rows rows on tensor cores, x and the weight (f16, or
/// quantized and decoded in registers) rounded to f16 as they are staged (`mmctl`,
/// glsl_coopmat_linear.cpp); nullopt when the kernel does not apply.
std::optional<kernel_source> linear_coopmat(const graph& g, const plan& q, const kernel& k, const device_caps& caps);
/// Pass 2 of a linear split along k (`mmctls2`): each output's slices added in order, then the
/// epilogue. glsl_coopmat_linear.cpp.
kernel_source linear_split_sum(const graph& g, const plan& p, const kernel& k, const device_caps& caps);
/// Slices of k for linear kernel `k` (split_linears): 0 unless the weight is f16 or bf16, `mmctl`
/// applies and its tiles number
/// fewer than linear_split_max_groups; then the fewest of 2, 4, 8 that dividing the 32-deep k
/// tiles evenly, with at least linear_split_min_tiles each, reach linear_split_target_groups
/// workgroups (or the most that qualify). kernel_variants::linear "nosplit" never splits,
/// "split2" / "split4" / "split8" split every product that the count qualifies for.
int64_t linear_split_slices(const graph& g, const plan& p, const kernel& k, const device_caps& caps);
inline constexpr int64_t linear_split_max_groups = 512;
inline constexpr int64_t linear_split_target_groups = 1024;
inline constexpr int64_t linear_split_min_tiles = 8;

/// kernel_kind::weight_decode (`dqw`): the quantized weight k.root decoded to f16 into scratch
/// buffer k.scratch, a thread per 32-element chunk of a row. glsl_weight_decode.cpp.
kernel_source weight_decode(const graph& g, const plan& p, const kernel& k, const device_caps& caps);
/// Whether linear kernel `k` takes a weight_decode kernel before it (predecode_linears).
bool predecodes_weight(const graph& g, const plan& p, const kernel& k, const device_caps& caps);
/// By default (kernel_variants::linear_decode "") a quantized weight is decoded to f16 before
/// its product from this many rows of x, or with fewer rows when the product, decoded while
/// staged, has at most linear_predecode_max_tiles tiles: the decoded weight's product can then
/// be split along k, where the staged one leaves most of a GPU idle (docs/gpu.md has the
/// measurements: on the H200 a 2048 x 2048 q4_k product of 32 rows took 68 µs staged and 26
/// decoded first; a 16384 x 2048 one of 128 rows 143 µs staged and 218 decoded first).
inline constexpr int64_t linear_predecode_min_rows = 512;
inline constexpr int64_t linear_predecode_max_tiles = 64;
/// The largest weight decoded before its product, in bytes of f16 (the scratch buffer's bound).
inline constexpr int64_t linear_predecode_max_bytes = int64_t{256} << 20;

/// A matmul operand read straight from a buffer: the materialised node `id`, whose consecutive
/// batch matrices are `batch_stride` elements apart (0: one matrix broadcast over the batch, like
/// a weight in x[b, t, c] x w[c, d]).
struct operand_view {
  node_index id = 0;
  int64_t batch_stride = 0;
};


/// `float load_b(uint xi)` of a linear: element xi of the [k, n] operand b, read from the weight
/// [n, k] (transposed, through the emitter: any float or quantized dtype), or from the f16 copy a
/// weight_decode kernel made when k.weight is set. glsl_matmul.cpp.
std::string linear_b_loader(emitter& e, const mm_dims& d, const graph& g, const kernel& k);

/// `x` with the reshapes in front of it skipped while it is not materialised: the materialised
/// node it views at the same flat index, when it is one (the callers check). glsl_matmul.cpp.
node_index behind_reshapes(const graph& g, const plan& q, node_index x);

/// The buffer behind matmul operand `x` when it is materialised, or a broadcast of a
/// materialised matrix over batch axes only; nullopt when it needs index arithmetic.
std::optional<operand_view> direct_operand(const graph& g, const plan& q, node_index x);

/// Whether `operand` is read by the kernel's epilogue or by the inline expression of `other`:
/// such an operand cannot be bound as a vector array (the other readers index it as scalars).
bool read_elsewhere(const graph& g, const plan& q, const kernel& k, node_index operand, node_index other);

/// The tile loops of the tiled matmuls (grid-stride over batch, tile rows, tile columns), ending
/// with `m0` and `n0`, the tile's first row and column. With `swizzle` = G > 1 the (tile row,
/// tile column) pair the hardware enumerates row-major is remapped, as a bijection of the tile
/// grid, to walk G tile rows down a column before the next column (the last group has the
/// remaining rows), so workgroups running at the same time share A and B tiles in L2.
std::string tile_loops(int64_t batch, int64_t m, int64_t n, int64_t bm, int64_t bn, uint32_t swizzle);

}  // namespace mesh::gpu::detail
