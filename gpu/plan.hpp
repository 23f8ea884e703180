#pragma once
/// Lowering: groups the nodes of a graph into kernels (pure, no device).
///
/// A node is *materialised* when its value lives in a device buffer: leaves, matmul, reductions,
/// scatter_add, outputs, update values, and elementwise/movement nodes whose value several kernels
/// need. Every other node is computed inline, at the index its consumer asks for: elementwise chains
/// fuse (fan-in, fan-out inside one kernel, selects), and broadcast/reshape/permute/slice/concat/
/// gather become index arithmetic instead of copies. Each materialised compute node is the root of
/// one kernel. An elementwise root whose expression reaches a matmul or reduction only through
/// single-use elementwise nodes absorbs it: the kernel is then that matmul/reduction with the
/// elementwise chain as its epilogue (bias, activation, residual, scaling).
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
};

/// One dispatch.
struct kernel {
  kernel_kind kind = kernel_kind::elementwise;
  node_id root = -1;    ///< the node this kernel writes
  node_id anchor = -1;  ///< the matmul/reduce/scatter_add node (== root when no epilogue)
};

/// The lowering of one graph.
struct plan {
  std::vector<bool> materialised;  ///< per node: has a device buffer
  std::vector<kernel> kernels;     ///< in execution (topological) order
};

/// True for a constant holding one value for all elements (emitted as a literal).
bool is_splat(const node& n);

/// Lowers a valid graph.
plan lower(const graph& g);

/// "ew(%5<-%3,%4) mm(%7+epi %9)": a compact listing for logs and tests.
std::string describe(const graph& g, const plan& p);

}  // namespace mesh::gpu
