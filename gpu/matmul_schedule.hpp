#pragma once
/// The schedule of the matmul kernels (pure: no GLSL here): the problem one matmul kernel solves
/// and the block shape each tiled kernel runs, chosen from the problem size, the device's caps and
/// the caller's kernel_variants. glsl_matmul.cpp and glsl_coopmat.cpp write the code for the
/// shape chosen here.
#include <cstdint>
#include <optional>
#include <string>

#include "gpu/glsl.hpp"

namespace mesh::gpu::detail {

/// The problem of one matmul kernel: c[batch][m][n] = a[batch][m][kd] x b[batch][kd][n].
struct mm_dims {
  node_index a = 0, b = 0;
  int64_t m = 0, kd = 0, n = 0, batch = 0;
  double flops() const {
    return 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(kd);
  }
};

/// The matmul that kernel `k` computes (its anchor node): a matmul, or a linear as one batch of
/// [rows, k] x [k, n] whose b is the weight [n, k] read transposed (linear_b_loader).
mm_dims dims_of(const graph& g, const kernel& k);

/// Whether the problem has enough 128x128 output tiles (128) to fill a GPU: the tiled kernels
/// then take their big tiles.
bool many_big_tiles(const mm_dims& d);

/// Block shape of the warp-tiled f32 matmul. 256 threads form 8 "warps" of 32 (NVIDIA's
/// subgroups; elsewhere only a numbering of threads, so any subgroup size is correct) in a 4 x 2
/// grid. A warp's lanes form a 4 x 8 grid and each lane owns rm x rn blocks of 4x4 outputs,
/// the blocks of a warp interleaved: a warp's vec4 reads of one shared row are then 4 (A) and 8
/// (B) consecutive vec4s, conflict-free, and its stores cover whole 128-byte rows.
struct warp_tile {
  int64_t rm = 2, rn = 2, bk = 8;  ///< 4x4 blocks per lane along m and n; depth of a shared tile
  int64_t wtm() const { return 4 * 4 * rm; }  ///< warp tile: 4 lanes along m
  int64_t wtn() const { return 8 * 4 * rn; }  ///< 8 lanes along n
  int64_t bm() const { return 4 * wtm(); }     ///< 4 warps along m
  int64_t bn() const { return 2 * wtn(); }     ///< 2 warps along n
  bool b_padded = false;  ///< B rows padded by one vec4 (B stored by k-walking threads)
  int64_t b_row() const { return bn() / 4 + (b_padded ? 1 : 0); }  ///< vec4 per shared B row
  /// Two stages of A (transposed, rows padded by one vec4) and B tiles.
  int64_t shared_bytes() const { return 2 * bk * (bm() / 4 + 1) * 16 + 2 * bk * b_row() * 16; }
};

/// Picks the warp tile: 128x128 (8x8 per thread) when there are enough such tiles to fill a GPU,
/// else 64x64 (4x4 per thread); kernel_variants::gemm "warp16" doubles the tile depth, "wide"
/// uses 128x256 (8x16 per thread), "narrow" 128x64 (8x4 per thread, fewer registers). nullopt
/// when the device's shared memory is too small.
std::optional<warp_tile> pick_warp_tile(const mm_dims& d, const device_caps& caps);

/// Block shape of the tiled cooperative-matrix f16 matmul: sgm x sgn subgroups of 32, each owning
/// fm x fn fragments of 16x16 f32 accumulators. Shared tiles are bk deep, two stages, stored as
/// uvec4 (8 halves) with every row padded by one uvec4, so that the 8 rows of a fragment load
/// (16 bytes each) fall in distinct banks (coopMatLoadNV takes one row stride, so an XOR swizzle
/// of rows cannot be expressed).
struct coop_tile {
  int64_t sgm = 2, sgn = 2, fm = 4, fn = 4, bk = 32;
  int64_t bm() const { return sgm * fm * 16; }
  int64_t bn() const { return sgn * fn * 16; }
  int64_t threads() const { return 32 * sgm * sgn; }
  /// Tiles (workgroups) of an m x n output.
  int64_t tiles(int64_t m, int64_t n) const { return ((m + bm() - 1) / bm()) * ((n + bn() - 1) / bn()); }
  int64_t a_stride() const { return bk / 8 + 1; }    ///< uvec4 per shared A row
  int64_t b_stride() const { return bn() / 8 + 1; }  ///< uvec4 per shared B row
  /// Two stages of A and B, plus a 16x16 f32 staging fragment per subgroup for the epilogue.
  int64_t shared_bytes() const { return 16 * 2 * (bm() * a_stride() + bk * b_stride()) + sgm * sgn * 256 * 4; }
};

/// Parses an explicit block shape, kernel_variants::coopmat "g<sgm>x<sgn>f<fm>x<fn>k<bk>"
/// ("g2x2f4x4k32" is the default big tile), for tuning on a new device. nullopt when `spec` is not
/// of that form or out of range.
std::optional<coop_tile> parse_coop_tile(const std::string& spec);

/// 128x128 tiles of 4 subgroups (64x64 each) when there are enough of them to fill a GPU, else
/// 64x64 of 4 subgroups (32x32 each). kernel_variants::coopmat "s8" (8 subgroups of 64x32) and
/// "wide" (128x256, tiles 16 deep) are kept for comparison: both measured slower on the H100
/// (docs/gpu.md); an explicit shape (parse_coop_tile) applies to every problem size. nullopt when
/// the device's shared memory is too small.
std::optional<coop_tile> pick_coop_tile(const mm_dims& d, const device_caps& caps);

}  // namespace mesh::gpu::detail
