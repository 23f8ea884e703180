#pragma once
/// GLSL emission for the kernels of a plan (pure: text in, text out; no device).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "gpu/kernel_variants.hpp"
#include "gpu/plan.hpp"

namespace mesh::gpu {

/// What the emitter needs to know about the device (it picks kernels from these), and the
/// kernel variants the caller asked for.
struct device_caps {
  uint32_t subgroup_size = 32;
  uint32_t shared_memory_bytes = 32768;
  std::array<uint32_t, 3> max_groups{65535, 65535, 65535};
  bool subgroup_arithmetic = false;  ///< subgroupAdd/Max in compute shaders
  bool storage16 = false;            ///< 16-bit storage buffers (f16/bf16 tensors)
  /// Ask for unrolled matmul loops so the accumulator tile stays in registers (GPUs: a dynamically
  /// indexed tile spills to local memory). CPU drivers (lavapipe) JIT the unrolled code slowly.
  bool unroll_loops = true;
  /// The kernels the caller chose where there is a choice (default: the library's own).
  kernel_variants variants;
  /// VK_NV_cooperative_matrix with a 16x16x16 f16 x f16 + f32 subgroup configuration (and
  /// shaderFloat16) is enabled on the device: f16 matmuls use tensor cores.
  bool coopmat_f16 = false;
  /// VK_KHR_cooperative_matrix with a 16x16x16 bf16 x bf16 + f32 subgroup configuration and
  /// shaderBFloat16CooperativeMatrix are enabled too: bf16 matmuls use tensor cores, through the
  /// f16 kernels rewritten to KHR matrices on bf16 (kernel_source::bf16_matrices).
  bool coopmat_bf16 = false;
  /// VK_KHR_cooperative_matrix with a 16x16x16 f16 x f16 + f32 subgroup configuration is enabled:
  /// the `mmct` and `mmctl` kernels on f16 fragments are rewritten to KHR matrices as well
  /// (kernel_source::khr_matrices), which the NVIDIA driver compiles to faster code than NV ones.
  bool coopmat_khr = false;
  /// VK_KHR_shader_integer_dot_product is enabled: kernels may dot packed 8-bit integers
  /// (OpSDot through GL_EXT_spirv_intrinsics).
  bool integer_dot = false;
  /// The device says its packed signed 8-bit dot product is accelerated (a dp4a-like instruction;
  /// NVIDIA: yes, lavapipe: no): the decode matrix-vector kernels take x in 8 bits by default.
  bool integer_dot_fast = false;
  /// Loop iterations one shader invocation may run in all, 0 for no limit: llvmpipe (lavapipe)
  /// ends an invocation's loops after 65535 iterations, silently. Kernels that cannot keep
  /// under it are refused with an error instead of returning short results.
  int64_t loop_limit = 0;
};

/// One compute shader, ready for shaderc, with how to bind and dispatch it.
struct kernel_source {
  std::string name;               ///< "mm_12", "ew4_7", ... (variant and root node)
  std::string glsl;
  std::vector<node_index> bindings;  ///< materialised nodes at bindings 0..n-1; [0] is the root (written)
  size_t writes = 1;              ///< bindings [0, writes) are written (a rows kernel writes each member's root)
  std::array<uint32_t, 3> groups{1, 1, 1};
  uint64_t bytes = 0;   ///< bytes the kernel reads and writes at least (for GB/s figures)
  double flops = 0;     ///< matmul: 2*m*n*k*batch
  /// The GLSL is an NV cooperative-matrix kernel on f16 fragments whose data are bf16: its SPIR-V
  /// is rewritten to KHR matrices on bf16 after compilation (kernel_spirv, spirv_coopmat.hpp).
  bool bf16_matrices = false;
  /// The GLSL is an NV cooperative-matrix kernel run as a KHR one: its SPIR-V is rewritten after
  /// compilation (khr_cooperative_matrices; bf16_matrices implies it). Its pipeline asks for full
  /// subgroups, as every cooperative-matrix kernel's does (VK_EXT_subgroup_size_control).
  bool khr_matrices = false;
};

class shader_cache;

/// The SPIR-V of `src`: compiled by `cache` (or found there), then rewritten where the kernel
/// asks (khr_matrices, bf16_matrices). Fails with shaderc's or the rewrite's error.
expected<std::vector<uint32_t>> kernel_spirv(shader_cache& cache, const kernel_source& src);

/// Splits along k the prompt-sized linears of f16 and bf16 weights that `mmctl` (tensor cores)
/// would run in too few workgroups to fill the device: each becomes pass 1 (slices of k into a scratch buffer of the
/// plan) and pass 2 (the slices added in order, then the epilogue). Run on a plan from lower()
/// for a device with `caps`; a no-op where `mmctl` does not apply (no cooperative matrices).
void split_linears(const graph& g, plan& p, const device_caps& caps);

/// Gives each prompt-sized linear of a quantized weight that `mmctl` runs a kernel before it that
/// decodes the weight to f16 into a scratch buffer (`dqw`, kernel_kind::weight_decode), which the
/// product then reads as an f16 weight (kernel::weight): the tensor cores then wait on no block
/// decoding. All such linears of the plan share one scratch buffer, as large as the largest of
/// their weights in f16 (the executor orders each decode after the previous product's reads).
/// Which linears qualify: kernel_variants::linear_decode (by default a whole prompt's, 512 rows,
/// and products in few tiles). Run on a plan from lower() before
/// split_linears (a decoded weight is an f16 weight there); a no-op without cooperative matrices.
void predecode_linears(const graph& g, plan& p, const device_caps& caps);

/// Emits the kernel `k` of plan `p`. Fails (unsupported) when the device lacks what it needs,
/// e.g. 16-bit storage for f16/bf16 tensors.
expected<kernel_source> emit(const graph& g, const plan& p, const kernel& k, const device_caps& caps);

}  // namespace mesh::gpu
