#pragma once
/// Structural hash of a graph, for kernel and plan caches.
///
/// Each node's hash covers its op, dtype, shape, attributes and its inputs' hashes (not their ids),
/// so two graphs that compute the same thing the same way hash equal even if their nodes were
/// created in another order. Outputs (by name) and updates are included.
#include <cstdint>

#include "graph/graph.hpp"

namespace mesh {

uint64_t structural_hash(const graph& g);

/// Per-node structural hashes (same rules), e.g. to key fused kernels by the subgraph they cover.
std::vector<uint64_t> node_hashes(const graph& g);

}  // namespace mesh
