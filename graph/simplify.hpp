#pragma once
/// Graph simplification, so that gradient graphs are not bloated:
/// - constant folding: ops on splat constants fold at any size (one value is computed); other ops
///   whose inputs are all constants fold when their result is small;
/// - algebraic identities: x+0, x-0, x*1, x/1, 0*x (to zeros), neg(neg x), cast to the same
///   dtype, and no-op broadcast/reshape/permute/slice; reshape of reshape;
/// - common subexpression elimination (same op, attributes, type and inputs);
/// - dead-code elimination (nodes that no output or update needs). Inputs and parameters are
///   always kept: they are the graph's interface.
/// Outputs and updates are preserved with their names; the result is valid if the input was.
#include "graph/graph.hpp"

namespace mesh {

struct simplify_stats {
  int folded = 0, rewritten = 0, merged = 0, removed = 0;
};

/// Returns the simplified graph. `stats`, when given, counts what each pass did.
graph simplify(const graph& g, simplify_stats* stats = nullptr);

}  // namespace mesh
