#pragma once
/// validate(): the single gate for any graph, built here or decoded from a peer.
///
/// After it succeeds, everything downstream (evaluator, compiler, planner) may assume the graph is
/// well formed: no checks are repeated there.
#include <cstdint>

#include "base/error.hpp"
#include "graph/graph.hpp"

namespace mesh {

/// Bounds on what a graph may ask for. The defaults suit a worker with a few GiB of memory; a node
/// sets its own from its device.
struct graph_limits {
  int64_t max_nodes = 1 << 20;
  int64_t max_elements = int64_t{1} << 31;        ///< per tensor
  int64_t max_total_bytes = int64_t{16} << 30;    ///< all node results together
  /// Floating-point operations of one run of the graph, as graph/cost.hpp counts them (a job's
  /// compute budget: a small message of splatted constants can otherwise ask for hours).
  double max_flops = 1e15;
  int64_t max_constant_values = int64_t{1} << 24;  ///< literal values carried in the graph
  int64_t max_inputs_per_node = 4096;              ///< concat fan-in
};

/// Checks every rule of the IR: ops and dtypes known; each input precedes its user (so no cycles);
/// arity, attributes, dtypes and shapes as infer() derives them; sizes within `limits`; leaf names
/// non-empty and unique; outputs and updates refer to valid nodes (updates: a parameter and a value
/// of its dtype and shape, each parameter at most once); quantized dtypes only in leaves read by
/// linear or a cast, never returned or updated; a kv_write's cache a parameter that nothing else
/// reads, updated with the kv_write (it is written in place). The error names the node and the rule
/// (for a budget, the node at which the graph passed it).
expected<void> validate(const graph& g, const graph_limits& limits = {});

}  // namespace mesh
