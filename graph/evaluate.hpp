#pragma once
/// The CPU reference evaluator: plain, obviously-correct loops for every op.
///
/// Every back end (gpu/) is tested against it. Values are held as doubles between ops and rounded
/// to each node's dtype after the op, so it sees what a device storing that dtype sees; reductions
/// and matmul accumulate in double, i32 sums in integers that wrap modulo 2^32 (exact past 2^53).
/// Not fast: use the executors in gpu/ for speed. Nor lean: every node's value lives for the whole
/// run as 8-byte doubles, so a graph may need up to 4x the bytes validate() bounds it by (which
/// counts each result at its dtype's size); run large graphs on an executor.
#include <map>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/graph.hpp"
#include "graph/tensor.hpp"

namespace mesh {

/// Tensors by name: inputs of a run, parameters, outputs.
using tensor_map = std::map<std::string, tensor>;

/// Runs `g` (which must be valid) with `inputs` bound by name. Parameters are read from `params`
/// and, when the run succeeds, the graph's updates are written back to it. Returns the outputs.
/// Errors: a missing or mistyped input or parameter (named in the message).
expected<tensor_map> evaluate(const graph& g, const tensor_map& inputs, tensor_map& params);

/// Runs `g` and returns the value of every node (for tests, constant folding and debugging).
expected<std::vector<tensor>> evaluate_nodes(const graph& g, const tensor_map& inputs,
                                             const tensor_map& params);

/// Evaluates with every float value kept as an exact double (no rounding to f32/f16/bf16), with
/// inputs and parameters given as doubles by name. For finite-difference gradient checks.
expected<std::vector<std::vector<double>>> evaluate_exact(const graph& g,
                                                          const std::map<std::string, std::vector<double>>& leaves);

/// Checks that `bindings` holds every input (or parameter, when `parameters`) of g with the
/// right dtype and shape. Shared by every executor.
expected<void> check_bindings(const graph& g, const tensor_map& bindings, bool parameters);

}  // namespace mesh
