#pragma once
/// The CPU reference evaluator: plain, obviously-correct loops for every op.
///
/// Every back end (gpu/) is tested against it. Values are held as doubles between ops and rounded
/// to each node's dtype after the op, so it sees what a device storing that dtype sees; reductions
/// and matmul accumulate in double, i32 sums in integers that wrap modulo 2^32 (exact past 2^53).
/// Not fast: use the executors in gpu/ for speed. Nor lean: every node's value lives for the whole
/// run as 8-byte doubles, so a graph may need up to 4x the bytes validate() bounds it by (which
/// counts each result at its dtype's size); run large graphs on an executor.
///
/// It is also the checked mode: an index that gather or scatter_add cannot use is an error here
/// (see index_check), where the executors' kernels, which do not check, read zeros or drop it.
#include <map>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/graph.hpp"
#include "graph/tensor.hpp"

namespace mesh {

/// Tensors by name: inputs of a run, parameters, outputs.
using tensor_map = std::map<std::string, tensor>;

/// What evaluate() does with a gather or scatter_add index outside its table's rows.
enum class index_check {
  /// The run fails with an error naming the node and the index: the checked mode, which the
  /// graph tests use. The default.
  strict,
  /// Gather reads zeros and scatter_add drops the row, as the executors in gpu/ do: their hot
  /// path does not check indices, and only keeps a bad one from faulting the device. For tests
  /// that compare an executor with the reference on such indices.
  as_devices,
};

/// The result of one run of evaluate().
struct evaluation {
  tensor_map outputs;  ///< every output of the graph, by name
  tensor_map params;   ///< the parameters given, with the graph's updates applied
};

/// Runs `g` (which must be valid) with `inputs` and `params` bound by name. Leaves its arguments
/// alone: the outputs and the parameters after the graph's updates come back in the evaluation.
/// Errors: a missing or mistyped input or parameter (named in the message); with
/// index_check::strict, a gather or scatter_add index outside its table (naming the node and
/// the index).
expected<evaluation> evaluate(const graph& g, const tensor_map& inputs, const tensor_map& params,
                              index_check indices = index_check::strict);

/// Runs `g` and returns the value of every node (for tests, constant folding and debugging).
/// Indices are checked as by index_check::strict.
expected<std::vector<tensor>> evaluate_nodes(const graph& g, const tensor_map& inputs,
                                             const tensor_map& params);

/// Evaluates with every float value kept as an exact double (no rounding to f32/f16/bf16), with
/// inputs and parameters given as doubles by name. For finite-difference gradient checks.
/// Indices are checked as by index_check::strict.
expected<std::vector<std::vector<double>>> evaluate_exact(const graph& g,
                                                          const std::map<std::string, std::vector<double>>& leaves);

/// Checks that `bindings` holds every input (or parameter, when `parameters`) of g with the
/// right dtype and shape. Shared by every executor.
expected<void> check_bindings(const graph& g, const tensor_map& bindings, bool parameters);

}  // namespace mesh
