#pragma once
/// Cutting a graph into the fragments a pipeline plan ships to its devices.
#include <string>

#include "base/error.hpp"
#include "graph/planner.hpp"

namespace mesh {

/// Name of the input/output that carries node `id` of the original graph across stages.
std::string cut_name(node_index id);

/// The graph that stage `s` of pipeline plan `p` runs: its nodes (ids renumbered), the leaves
/// they use, values from earlier stages as inputs named cut_name(id), and as outputs both the
/// values later stages need (cut_name(id)) and the original outputs computed here (their own
/// names). Updates whose parameter and value are both here are kept.
expected<graph> stage_fragment(const graph& g, const plan& p, int s);

}  // namespace mesh
