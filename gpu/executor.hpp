#pragma once
/// The executor: runs graphs on one device. Parameters (by name) stay resident on the device and
/// are shared by every program loaded on it; a run returns the graph's outputs and applies its
/// updates on the device. Two back ends: Vulkan (any GPU, or lavapipe) and the CPU.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "gpu/kernel_variants.hpp"

namespace mesh::gpu {

/// What a device is and can do (probed, never assumed).
struct device_info {
  std::string name;
  std::string kind;  ///< "discrete", "integrated", "virtual", "cpu"
  uint64_t memory_bytes = 0;
  uint32_t subgroup_size = 0;
  uint32_t shared_memory_bytes = 0;
  bool fp16 = false;          ///< 16-bit storage: f16/bf16 tensors supported
  bool bf16_storage = false;  ///< bf16 tensors (stored as 16-bit words, computed in f32)
  bool coopmat = false;       ///< VK_NV_cooperative_matrix offered (f16 matmuls use it: docs/gpu.md)
  bool coopmat_khr = false;   ///< f16 tensor-core kernels run as KHR cooperative matrices (rewritten from NV)
  bool coopmat_bf16 = false;  ///< KHR bf16 cooperative matrices enabled (bf16 matmuls use them)
  /// Packed 8-bit integer dot products enabled (VK_KHR_shader_integer_dot_product), and whether
  /// the device calls them accelerated: decode's matrix-vector products on 8-bit x (docs/gpu.md).
  bool integer_dot = false, integer_dot_fast = false;
  /// The driver's deviceUUID (Vulkan); zeros for the CPU back end. Tells identical GPUs apart.
  std::array<uint8_t, 16> uuid{};
};

/// Time spent in one kernel of a program, summed over runs (GPU timestamps).
struct kernel_timing {
  std::string name;       ///< variant and root node, e.g. "mm128_12"
  uint64_t runs = 0;
  double total_ms = 0;
  double last_ms = 0;
  uint64_t bytes = 0;     ///< bytes read + written per run (at least)
  double flops = 0;       ///< per run (matmul)
};

struct kernel_stats {
  uint64_t shader_compiles = 0;  ///< shaderc invocations
  uint64_t cache_memory_hits = 0;
  uint64_t cache_disk_hits = 0;
  uint64_t pipelines_created = 0;  ///< driver pipelines made; a kernel loaded again shares its own
  double compile_ms = 0;
  /// Kernels made for loaded programs (GLSL emitted, then compiled or found in the caches, and
  /// given a pipeline) and the wall time that took: per kernel, the cache-hit path when nothing
  /// was compiled. Buffer allocation and command recording are not in it.
  uint64_t kernels_made = 0;
  double kernel_making_ms = 0;
  uint64_t validation_errors = 0;  ///< validation-layer errors seen (validation mode only)
  uint64_t validation_warnings = 0;
  uint64_t device_bytes = 0;       ///< device memory sub-allocated now
  /// Bytes read_parameters and write_parameters* moved between parameters and imported host
  /// memory with copy commands alone (import_host_memory), so far.
  uint64_t imported_copy_bytes = 0;
  /// Copies made beside the kernels (read_parameters_async, write_parameters_from_async), and
  /// how many of them later work of the executor's would have raced with, and so waited for
  /// (at once where the copy was done by then; a copy found done before is not counted).
  uint64_t async_copies = 0, async_copy_waits = 0;
  std::vector<kernel_timing> kernels;  ///< the last-run program's kernels, in order
  /// Programs run, the host's wall time inside run() (inputs in to outputs out), and of that the
  /// time from queue submission to the fence's signal (the GPU's work plus submission and
  /// wake-up latency). Vulkan only: what a step costs besides its kernels.
  uint64_t runs = 0;
  double run_ms = 0, submit_ms = 0;
};

using program_id = uint32_t;

/// The end of a copy the device makes while its caller goes on (executor::read_parameters_async,
/// write_parameters_from_async). wait() blocks until the copy is done and says how it ended; any
/// thread may call it, more than once. A default-made one stands for a copy done before the call
/// that made it returned.
struct pending_copy {
  std::function<expected<void>()> wait_for_it;
  expected<void> wait() const { return wait_for_it ? wait_for_it() : expected<void>{}; }
};

/// Not thread-safe: one caller at a time (the node's executor actor owns it).
class executor {
 public:
  virtual ~executor() = default;
  virtual const device_info& info() const = 0;
  /// Validates and compiles `g` (kernel cache), allocates its buffers. Parameters it names that
  /// were not set yet are created (zeros) with the graph's dtype and shape.
  virtual expected<program_id> load(const graph& g) = 0;
  /// Uploads parameters (creating them when new; an existing one must keep dtype and shape).
  virtual expected<void> set_parameters(const tensor_map& params) = 0;
  /// Uploads one parameter from bytes the caller owns, e.g. a tensor of a memory-mapped GGUF or
  /// safetensors file, without copying it into a `tensor` first: quantized weights arrive as
  /// their blocks and stay so on the device. Creates the parameter when new; an existing one must
  /// keep dtype and shape. The bytes are read during the call only. Vulkan copies them into
  /// device memory directly where it is host-visible, else through a bounded staging buffer
  /// (at most 16 MiB at a time), so host memory does not grow with the weights; the CPU back
  /// end keeps its own copy (that is its device memory).
  virtual expected<void> set_parameter_view(const std::string& name, const tensor_view& value) = 0;
  virtual expected<tensor_map> get_parameters(const std::vector<std::string>& names) = 0;
  /// Copies the parameters `names` into `out` end to end, each as the bytes it holds on the
  /// device, in the order named; `out` must be exactly their size together. Where
  /// get_parameters makes a tensor of each, this moves many parameters in few transfers into a
  /// buffer the caller keeps and reuses (a training step's gradients leave the device this way:
  /// no allocation, no page of fresh memory touched per step).
  virtual expected<void> read_parameters(const std::vector<std::string>& names, std::span<uint8_t> out) = 0;
  /// The reverse of read_parameters: overwrites the existing parameters `names` from `bytes`,
  /// their values end to end (exactly their size together).
  virtual expected<void> write_parameters(const std::vector<std::string>& names, std::span<const uint8_t> bytes) = 0;
  /// write_parameters from bytes in pieces, end to end (a reduced sum whose shares lie in the
  /// shared regions of several processes, actors/host_reduce.hpp). Vulkan copies each piece from
  /// where it is; this default gathers them into one buffer first.
  virtual expected<void> write_parameters_from(const std::vector<std::string>& names, const std::vector<std::span<const uint8_t>>& pieces) {
    if (pieces.size() == 1) return write_parameters(names, pieces[0]);
    std::vector<uint8_t> all;
    for (auto p : pieces) all.insert(all.end(), p.begin(), p.end());
    return write_parameters(names, all);
  }
  /// read_parameters that may return while the device still copies: `out` must stay, untouched,
  /// until the returned copy's wait() returns. The executor orders its own later work after the
  /// copy where both touch the parameters (a program that updates one of `names` waits for it; a
  /// program that only reads them, or touches others, does not). Vulkan: where all of `out` lies
  /// in imported host memory (import_host_memory), one submission on the device's copy queue (its
  /// copy engines where it has a transfer-only queue family) that runs beside the kernels;
  /// otherwise, and on the CPU back end, the copy is done before this returns.
  virtual expected<pending_copy> read_parameters_async(const std::vector<std::string>& names, std::span<uint8_t> out) {
    if (auto ok = read_parameters(names, out); !ok) return tl::unexpected(ok.error());
    return pending_copy{};
  }
  /// write_parameters_from that may return while the device still copies, as
  /// read_parameters_async: the pieces must stay until wait() returns; later work that reads or
  /// writes one of `names` waits for the copy first.
  virtual expected<pending_copy> write_parameters_from_async(const std::vector<std::string>& names,
                                                             const std::vector<std::span<const uint8_t>>& pieces) {
    if (auto ok = write_parameters_from(names, pieces); !ok) return tl::unexpected(ok.error());
    return pending_copy{};
  }
  /// Makes host memory one the device copies to and from itself: read_parameters,
  /// write_parameters and write_parameters_from whose host bytes all lie in imported memory move
  /// them with the device's copy commands alone (Vulkan: VK_EXT_external_memory_host), with no
  /// staging memory and no copy on the host. The import holds the pages around `bytes` (whole
  /// pages) while the returned handle lives: keep the memory mapped that long, and the handle
  /// through every call that moves bytes there. Errors: unsupported (the CPU back end, whose
  /// copies are the host's anyway; a device without the extension) or the driver's refusal (it
  /// may refuse a read-only mapping); the calls then move the bytes as before.
  virtual expected<std::shared_ptr<void>> import_host_memory(std::span<const uint8_t> bytes) {
    (void)bytes;
    return make_error(error_code::unsupported, "importing host memory: " + info().name + " copies through the host");
  }
  /// Runs a loaded program: returns its outputs and applies its updates on the device.
  virtual expected<tensor_map> run(program_id id, const tensor_map& inputs) = 0;
  /// Runs a loaded program `times` times back to back with the same inputs, each run's updates
  /// applied before the next begins, and returns the last run's outputs (1 <= times <=
  /// max_repeated_runs). For a program whose parameters carry its state from one run to the
  /// next, as a greedy decode step that feeds the token it picked to the following step
  /// (models::session::decode_greedy): Vulkan submits the command buffer `times` times in one
  /// submission, so the device goes from run to run without waiting for the host.
  virtual expected<tensor_map> run_repeated(program_id id, const tensor_map& inputs, int64_t times) = 0;
  static constexpr int64_t max_repeated_runs = 1024;

 protected:
  /// run_repeated's refusal of `times` outside [1, max_repeated_runs], shared by the back ends.
  static expected<void> check_repeated_runs(int64_t times) {
    if (times >= 1 && times <= max_repeated_runs) return {};
    return make_error(error_code::invalid_argument, "run_repeated: " + std::to_string(times) + " runs asked for; 1 to " +
                                                        std::to_string(max_repeated_runs) + " are possible");
  }

 public:
  /// Frees a loaded program (its buffers and command buffer); its id is not used again. Unknown
  /// or already unloaded ids are ignored. A node loads programs for as long as it runs: without
  /// this, device memory only grew.
  virtual void unload(program_id id) = 0;
  /// Frees every parameter whose name starts with `prefix` that no loaded program uses (unload
  /// those first); returns how many were freed.
  virtual size_t drop_parameters(const std::string& prefix) = 0;
  virtual kernel_stats stats() const = 0;
};

struct vulkan_options {
  /// Substring of the device name to pick, "#N" for the N-th device (0-based, the driver's
  /// order: one node per GPU of a multi-GPU host), or "discrete", "integrated", "cpu"; empty: the env
  /// variable MESH_DEVICE, else the best (discrete > integrated > virtual > cpu).
  std::string device;
  /// Enable VK_LAYER_KHRONOS_validation with a messenger that counts errors (also env
  /// MESH_VK_VALIDATION=1).
  bool validation = false;
  /// Kernel + pipeline cache directory; empty: default_cache_dir(); "-": memory only.
  std::string cache_dir;
  /// Device memory this executor may use (0: no limit besides the device's own). Going over is an
  /// out-of-memory error like the device's.
  uint64_t memory_limit = 0;
  /// Size of each device memory block that tensors are sub-allocated from.
  uint64_t block_bytes = 64ull << 20;
  /// Two-pass (split) reductions for few outputs over long ranges (a loss's mean): -1 chooses (on
  /// for GPUs; off for CPU devices such as lavapipe, where more workgroups only add dispatch
  /// overhead), 0 off, 1 on.
  int split_reductions = -1;
  /// Runs of kernels over the same rows (softmax, layer norm: row reductions, then the
  /// elementwise kernel that uses them) become one kernel that reads each row from memory once:
  /// -1 chooses (rows of 32 or more on GPUs, 256 or more on CPU devices such as lavapipe, where
  /// short rows ran slower fused), 0 off, 1 every row length.
  int fuse_rows = -1;
  /// GPU timestamps around every kernel (stats().kernels[].last_ms and total_ms). Off, the
  /// command buffers hold no queries: kernels keep their names and byte counts, their times stay 0.
  bool kernel_timestamps = true;
  /// Kernel variants other than the defaults, for comparing kernels (the benchmark).
  kernel_variants variants;
  /// Where device memory is host-visible (lavapipe, integrated GPUs), map it and copy tensors
  /// straight in and out. false moves them through staging buffers and copy commands, as on a
  /// discrete GPU: the tests run that path on lavapipe.
  bool map_device_memory = true;
};

/// A Vulkan executor on the chosen device, or an error saying why none is available.
expected<std::unique_ptr<executor>> make_vulkan_executor(const vulkan_options& options = {});

/// The CPU back end: `threads` workers (0: hardware concurrency).
std::unique_ptr<executor> make_cpu_executor(unsigned threads = 0);

struct cpu_options {
  unsigned threads = 0;  ///< workers, the calling thread included (0: hardware concurrency)
  /// Linears of q8_0, q4_0, q4_k and q6_k weights where the CPU has AVX2: x quantized to 8 bits
  /// (a decode step's products in integers; results differ from f32 x by x's rounding: the error
  /// bound in cpu_quant_dot.hpp), or x kept in f32 (within f32 rounding of the dequantized weights).
  /// -1: 8 bits unless the environment variable MESH_CPU_LINEAR is "f32"; 0: f32; 1: 8 bits.
  int int8_linear = -1;
};

/// The CPU back end with `options`.
std::unique_ptr<executor> make_cpu_executor(const cpu_options& options);

}  // namespace mesh::gpu
