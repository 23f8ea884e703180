#pragma once
/// Type and shape inference: the one place that knows each op's typing rule.
///
/// The builder calls it to type a new node; validate() calls it to re-check every node of a graph
/// it did not build. One rule, two users, so they can never disagree.
#include <vector>

#include "base/error.hpp"
#include "graph/graph.hpp"

namespace mesh {

/// The result type of a node.
struct value_type {
  dtype type = dtype::f32;
  shape dims;
  bool operator==(const value_type&) const = default;
};

/// Infers the output of `n` from its inputs' types (`in`, one per n.inputs) and its attributes.
/// For ops whose result is chosen rather than derived (leaves, cast, broadcast, reshape,
/// scatter_add), n.type/n.dims are that choice and are checked against the inputs.
/// The error message names the op and the rule broken; callers add where.
expected<value_type> infer(const node& n, const std::vector<value_type>& in);

/// Numpy broadcasting of two shapes, or an error naming both.
expected<shape> broadcast_shapes(const shape& a, const shape& b);

}  // namespace mesh
