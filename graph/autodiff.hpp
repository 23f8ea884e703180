#pragma once
/// Reverse-mode automatic differentiation on the graph IR.
///
/// Gradients are new nodes appended to the same graph (so one graph holds forward, backward and
/// optimizer step, and runs as one program). Every differentiable op has a vector-Jacobian rule in
/// autodiff.cpp; integer-valued ops (compare, casts to i32, indices) pass no gradient.
#include <vector>

#include "graph/builder.hpp"

namespace mesh {

/// d loss / d x for each x in `wrt`, built into loss's builder. `loss` must be a float scalar.
/// An x that does not influence the loss gets zeros. Errors poison the results (see builder).
std::vector<expr> gradients(const expr& loss, const std::vector<expr>& wrt, source_loc loc = source_loc::current());

/// A graph extended with gradient nodes.
struct gradient_graph {
  graph g;                      ///< the original nodes (same ids) followed by the backward nodes
  std::vector<node_index> grads;   ///< one per `wrt`, ids in g
};

/// The graph-level form: gradients of node `loss` of `g` with respect to nodes `wrt`.
expected<gradient_graph> grad(const graph& g, node_index loss, const std::vector<node_index>& wrt);

}  // namespace mesh
