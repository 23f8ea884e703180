#pragma once
/// Kernel variants a caller may choose instead of the defaults, for comparing kernels (the
/// benchmark times them side by side; docs/gpu.md has the figures). The defaults are the kernels
/// the library uses; the library never reads these from the environment.
#include <cstdint>
#include <string>

namespace mesh::gpu {

struct kernel_variants {
  /// f32 matmul: "" the warp-tiled double-buffered kernel (`mmw*`); "warp16" (tiles 16 deep),
  /// "wide" (128x256) and "narrow" (128x64) are its other shapes, "classic" the single-buffered
  /// kernel (`mm128`/`mm64`, which also takes what the warp-tiled one cannot). Whatever the
  /// choice, a matmul of at most 8 rows takes the few-row kernel `mms` unless this is "noskinny".
  std::string gemm;
  /// f16 matmul on tensor cores: "" the tiled 128-bit-load kernel (`mmct*`); "s8" (8 subgroups
  /// of 64x32) and "wide" (128x256) are its other shapes, "64" the first kernel (`mmcoop`),
  /// "g<sgm>x<sgn>f<fm>x<fn>k<bk>" any block shape (subgroups, fragments per subgroup, tile
  /// depth). "0" creates the device without cooperative matrices: f16 matmuls then compute in
  /// f32 on the f32 kernels.
  std::string coopmat;
  /// bf16 matmul on tensor cores: "" where the device offers KHR cooperative matrices of bf16
  /// (VK_KHR_cooperative_matrix, VK_KHR_shader_bfloat16), a matmul of two bf16 operands takes
  /// `mmct` and a prompt's linear of bf16 x and a bf16 weight `mmctl`, on bf16 fragments with f32
  /// accumulation (the f16 kernels rewritten: spirv_coopmat.hpp); "0" creates the device without
  /// them: bf16 products then compute in f32 on the f32 kernels.
  std::string coopmat_bf16;
  /// f16 tensor-core kernels `mmct` and `mmctl`: "" as KHR cooperative matrices where the device
  /// offers them (the NV kernels rewritten, spirv_coopmat.hpp); "0" keeps NV matrices.
  std::string coopmat_khr;
  /// Workgroup-tile rasterisation of the tiled matmuls (`mmw*`, `mmct*`): G > 1 walks G tile rows
  /// down a column before the next column so that concurrent workgroups share A and B tiles in
  /// L2; 0 or 1 keeps row-major tile order. Off by default: G = 4, 8, 16 changed no GEMM rate on
  /// the H100 beyond run-to-run noise.
  uint32_t gemm_swizzle = 0;
  /// linear's matrix-vector kernel (few rows of x): "" sums each weight row's partials with
  /// subgroupAdd where the device has subgroup arithmetic (`lmv`; for q8_0, q4_0, q5_0, q4_k and
  /// q6_k weights `lmvc`, whose lanes read adjacent words of the row; both decode 2 steps of a
  /// row before multiplying, "lanes1" and "lanes4" 1 or 4), "chunk" keeps `lmv` as it reads one
  /// chunk at a time (a lane per 32-element chunk for those dtypes too, x element by element),
  /// "shared" always sums through a shared-memory tree in a 64-thread workgroup (`lmvs`, what
  /// devices without subgroup arithmetic run), "rows1", "rows2" and "rows4" give each subgroup
  /// of `lmvc` 1, 2 or 4 weight rows whatever the rows of x (by default 2 from 8 rows of x on, so
  /// that every x load serves both: `lmvc2r`; else 1; docs/gpu.md), "xglobal" keeps x in memory
  /// where `lmvc` would copy it to shared memory (q4_k weights).
  std::string matvec;
  /// x of the matrix-vector kernel for q8_0, q4_k and q6_k weights: "" quantizes it to 8 bits
  /// (blocks of 32, as the CPU's integer dots do) and dots the weight's quants with its codes in
  /// integers (`lmvi`) on devices whose packed 8-bit dot product is accelerated, else keeps it in
  /// f32; "f32" always keeps f32; "int8" takes `lmvi` wherever the device has an integer dot
  /// product (lavapipe's, emulated: for tests). The matvec variants that name another kernel
  /// ("chunk", "shared") or another x ("xglobal") keep theirs.
  std::string matvec_x;
  /// linear with more than 16 rows of x (a prompt): "" on devices with cooperative matrices
  /// takes `mmctl` for f16 and quantized weights (x and the decoded weight rounded to f16 as they
  /// are staged, f32 accumulation: about 3 decimal digits, and values past 65504 overflow), else
  /// the f32 matmul kernels reading the weight transposed; "f32" always takes the f32 kernels.
  /// `mmctl` products in too few tiles are split along k (split_linears): "nosplit" keeps them
  /// whole, "split2" / "split4" / "split8" force that many slices where k allows.
  std::string linear;
  /// A quantized weight of a prompt's linear on `mmctl`: "" decodes it to f16 once, in a kernel of
  /// its own (`dqw`) writing a scratch buffer the product then reads as an f16 weight, from
  /// linear_predecode_min_rows (512) rows of x on, or for a product in at most
  /// linear_predecode_max_tiles (64) tiles (which can then be split along k); otherwise each
  /// weight chunk is decoded while it is staged, once per tile row of x. "staged" always decodes
  /// while staging; "first" decodes first from 17 rows on, also where the f32 matmul kernels
  /// take the product (no cooperative matrices: they then read the decoded f16 weight). A weight
  /// larger than linear_predecode_max_bytes in f16 is decoded while staged whatever the choice.
  std::string linear_decode;
  /// attention: "" takes, for many query rows (a prompt), `attnc` on devices with cooperative
  /// matrices (q, k, v and the softmax weights rounded to f16, f32 accumulation; d a multiple of
  /// 16), else `attnt` in f32, and for few rows (decode) the grouped pass 1 `attn1g` (every query
  /// head of a key/value head in one workgroup) where it fits; "f32" always takes `attnt` for
  /// prompts, "ungrouped" `attn1` (a workgroup per query head) for decode.
  std::string attention;
};

}  // namespace mesh::gpu
