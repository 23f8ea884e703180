#pragma once
/// SPIR-V the project rewrites itself (pure: words in, words out): the tensor-core kernels are
/// written in GLSL for GL_NV_cooperative_matrix, the only cooperative matrices Debian 12's shaderc
/// compiles, and NV cooperative matrices have no bf16. A bf16 kernel is the f16 kernel compiled by
/// shaderc, then rewritten here into a VK_KHR_cooperative_matrix module whose 16-bit floats are
/// bfloat16 (SPV_KHR_bfloat16). The kernels only load 16-bit values (raw bits, from shared
/// memory), multiply them in cooperative matrices with f32 accumulators and store f32, so
/// retyping the 16-bit float makes the same kernel on bf16 data; a module that computes with
/// 16-bit floats otherwise is refused, never retyped.
///
/// NV and KHR cooperative matrices differ in one thing that needs analysis: a KHR matrix type
/// carries its use (A, B or accumulator), an NV one does not, and the f16 A and B fragments of
/// a 16x16x16 product share one NV type. Each value, variable and access chain of a matrix type
/// gets its use from the products it reaches (union-find over loads, stores, access chains, phis,
/// copies, selects, conversions and arithmetic); the NV type and every array and pointer type
/// built on it are then declared once per use. Loads and stores take the KHR layout operand
/// (RowMajorKHR / ColumnMajorKHR) in place of NV's column-major boolean; strides keep their
/// meaning (elements of the pointer's type between rows or columns).
#include <cstdint>
#include <vector>

#include "base/error.hpp"

namespace mesh::gpu {

/// `words` (a module using SPV_NV_cooperative_matrix) with its cooperative matrices made
/// SPV_KHR_cooperative_matrix ones and, when `bf16`, its 16-bit float type bfloat16 (its
/// constants re-encoded). Fails (unsupported) naming the instruction it cannot carry over: a
/// matrix value used as two different operands of products, a 16-bit float in arithmetic (with
/// `bf16`), NV matrix lengths, matrices in structs, function parameters or decorations.
expected<std::vector<uint32_t>> khr_cooperative_matrices(const std::vector<uint32_t>& words, bool bf16);

}  // namespace mesh::gpu
