#pragma once
/// Lowering: groups the nodes of a graph into kernels (pure, no device).
///
/// A node is *materialised* when its value lives in a device buffer: leaves, matmul, linear,
/// reductions, scatter_add, kv_write, outputs, update values, and elementwise/movement nodes whose value several kernels
/// need. Every other node is computed inline, at the index its consumer asks for: elementwise chains
/// fuse (fan-in, fan-out inside one kernel, selects), and broadcast/reshape/permute/slice/concat/
/// gather become index arithmetic instead of copies. Each materialised compute node is the root of
/// one kernel. An elementwise root whose expression reaches a matmul, linear or reduction only
/// through single-use elementwise nodes absorbs it: the kernel is then that matmul/linear/reduction
/// with the elementwise chain as its epilogue (bias, activation, residual, scaling). A kv_write's
/// buffer is its cache parameter's (the executors alias them): its kernel writes only the slice.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace mesh::gpu {

/// What a kernel's main loop computes.
enum class kernel_kind {
  elementwise,  ///< one thread per output element (vec4 when possible)
  reduce,       ///< a reduction (with prologue inlined), optionally with an epilogue
  matmul,       ///< tiled matmul (with prologue index arithmetic), optionally with an epilogue
  scatter_add,  ///< deterministic scatter-add: each output element sums its matching rows
  rows,         ///< several kernels over the same rows run as one: a workgroup per row (kernel::members)
  linear,       ///< x times a weight read transposed (any float or quantized dtype), optionally with an epilogue
  kv_write,     ///< a value written into a cache parameter's buffer at a runtime position (in place)
  attention,    ///< causal attention of query rows against a KV cache (op_kind::attention)
  /// A quantized weight (root) decoded to f16 into plan::scratch[scratch] for the linear kernel
  /// after it (kernel::weight); added by predecode_linears, never by lower().
  weight_decode,
};

/// One dispatch.
struct kernel {
  kernel_kind kind = kernel_kind::elementwise;
  node_index root = -1;    ///< the node this kernel writes
  node_index anchor = -1;  ///< the matmul/reduce/scatter_add node (== root when no epilogue)
  /// A split reduction runs as two kernels: pass 1 reduces `slices` fixed slices of every
  /// output's range (with the prologue) into a partial buffer, pass 2 combines each output's
  /// partials in slice order and applies the epilogue. Attention always runs so, its slices
  /// being slices of the keys (attention_slice_keys each). 0: a one-pass kernel.
  int pass = 0;
  int64_t slices = 0;  ///< split reduction, attention: slices per output
  int scratch = -1;    ///< split reduction, attention: its partial buffer, an index into plan::scratch
  /// A linear whose quantized weight a weight_decode kernel before it decoded to f16: the
  /// plan::scratch index holding it ([n, k] f16), read instead of the weight's own buffer.
  int weight = -1;
  /// kernel_kind::rows: the kernels it runs, in order, for one row at a time: one-pass
  /// reductions over the last axis of the same [..., L] shape, then at most one elementwise
  /// kernel of that shape. Later members read earlier members' results only at their own row,
  /// so a workgroup keeps them in registers and reads each row from memory once (softmax,
  /// layer norm: 1 kernel instead of 3). root is the last member's root.
  std::vector<kernel> members;
};

/// A device buffer that no graph node owns (the partials of a split reduction, a decoded weight). Emitted kernels
/// bind it as the id scratch_id(g, index), past the graph's node ids.
struct scratch_buffer {
  dtype type = dtype::f32;
  int64_t elements = 0;
};

/// The lowering of one graph.
struct plan {
  std::vector<bool> materialised;      ///< per node: has a device buffer
  std::vector<kernel> kernels;         ///< in execution (topological) order
  std::vector<scratch_buffer> scratch;  ///< buffers of split reductions' partials, decoded weights
};

/// Keys per tile of an attention kernel's first pass (add_attention in plan.cpp): a slice of the
/// keys is one tile, or several when the partials would pass attention_partials_max floats.
inline constexpr int64_t attention_slice_keys = 64;
inline constexpr int64_t attention_partials_max = int64_t{1} << 18;

/// Attention with at least this many query rows (a prompt) and head size at most
/// attention_tiled_max_dim runs as one kernel (`attnt`, glsl_attention.cpp) that reads each key
/// once per tile of query rows; fewer rows (decode) take the two-pass flash-decoding kernels.
inline constexpr int64_t attention_tiled_min_rows = 17;
inline constexpr int64_t attention_tiled_max_dim = 128;

/// Tiles of attention_slice_keys keys per slice, for `slices` slices of `keys` keys.
inline int64_t attention_tiles_per_slice(int64_t keys, int64_t slices) {
  const int64_t tiles = (keys + attention_slice_keys - 1) / attention_slice_keys;
  return slices > 0 ? std::max<int64_t>(1, (tiles + slices - 1) / slices) : 1;
}

/// The binding id of plan::scratch[index] (ids past the graph's own nodes).
inline node_index scratch_id(const graph& g, int index) { return g.size() + index; }

/// How a reduction reads its input: `outputs` results, each combining `reduced` elements.
struct reduction_layout {
  int64_t outputs = 0, reduced = 0;
  bool trailing = false;  ///< the reduced axes are the last ones (rows: each output's range is contiguous)
  bool leading = false;   ///< the reduced axes are the first ones, not all (columns: input index r * outputs + o)

  /// The kernel reads columns: 32 neighbouring outputs per workgroup (`redc`).
  bool columns() const { return leading && reduced >= 64; }
  /// Otherwise, one workgroup per output (`redg`) rather than one thread per output (`redt`):
  /// for contiguous ranges, few outputs, or ranges too long for one thread (lavapipe stops an
  /// invocation's loops after 65535 iterations; a GPU thread folding 32K elements is slow anyway).
  bool per_group() const { return !columns() && reduced >= 256 && (trailing || outputs < 1024 || reduced > 32768); }
};

/// The layout of reduction node `reduce` (reduce_sum or reduce_max).
reduction_layout layout_of(const graph& g, node_index reduce);

/// When a reduction is split into two passes. A one-pass kernel gives each output (rows) or each
/// 32 outputs (columns) one workgroup: with few outputs over long ranges that leaves most of a GPU
/// idle (a loss: one workgroup for 1.5M elements). Thresholds are fields so tests can reach the
/// split path with small tensors.
struct split_options {
  bool enabled = true;
  int64_t max_groups = 264;      ///< split when the one-pass kernel has fewer workgroups (2x a 132-SM GPU)
  int64_t min_reduced = 2048;    ///< ... and each output combines at least this many elements
  int64_t min_slice = 2048;      ///< elements each pass-1 workgroup reduces, at least (8 per thread)
  int64_t target_groups = 1024;  ///< pass 1 aims at this many workgroups (a full wave of 256-thread groups)
  int64_t max_slices = 1024;     ///< partials per output, at most (pass 2 reads them all)
  /// Split anyway (even when not `enabled`) when a one-pass thread would fold more than this
  /// many elements; 0: never. Set on CPU devices: llvmpipe ends a shader invocation's loops after
  /// 65535 iterations in all, silently (a sum over a 16M-element row came back 45% short).
  int64_t must_split_above = 0;
};

/// Slices for a reduction of this layout: 0 for one pass, else >= 2.
int64_t split_slices(const reduction_layout& l, const split_options& o);

/// Elements of the reduced range in each slice: slice s covers [s * len, min((s + 1) * len, reduced)).
/// A multiple of 64 so that every slice of a row starts on a 256-byte boundary of f32 data.
int64_t slice_length(int64_t reduced, int64_t slices);

/// True for a constant holding one value for all elements (emitted as a literal).
bool is_splat(const node& n);

/// Lowers a valid graph. Runs of kernels over rows of at least `fuse_rows_from` elements become
/// one kernel_kind::rows kernel (0: never).
plan lower(const graph& g, const split_options& split = {}, int64_t fuse_rows_from = 2);

/// Merges runs of consecutive kernels over the same rows (of at least `min_length` elements)
/// into kernel_kind::rows kernels (see kernel::members); part of lower().
void fuse_row_kernels(const graph& g, plan& p, int64_t min_length = 2);

/// "ew(%5<-%3,%4) mm(%7+epi %9)": a compact listing for logs and tests.
std::string describe(const graph& g, const plan& p);

}  // namespace mesh::gpu
