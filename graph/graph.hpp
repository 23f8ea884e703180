#pragma once
/// The graph IR: nodes in topological order, named outputs and parameter updates.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/ops.hpp"
#include "graph/shape.hpp"

namespace mesh {

/// A node's index in graph::nodes.
using node_index = int32_t;

/// Per-op attributes. Fields an op does not use stay empty/default (validate() checks this).
struct attributes {
  std::string name;             ///< input, parameter: the binding name
  std::vector<int64_t> axes;    ///< reduce_*: axes reduced; permute: the permutation
  std::vector<int64_t> starts;  ///< slice: first index per dim
  std::vector<int64_t> stops;   ///< slice: one past the last index per dim
  int64_t axis = 0;             ///< concat: the axis joined; kv_write: the axis written along
  compare_kind cmp = compare_kind::eq;  ///< compare
  bool keep_dims = false;               ///< reduce_*: reduced dims stay as size 1
  std::vector<double> values;  ///< constant: one value per element, or a single splat value

  bool operator==(const attributes&) const = default;
};

/// One operation. Its output has `type` and `dims`; its id is its index in the graph.
struct node {
  op_kind op = op_kind::constant;
  dtype type = dtype::f32;
  shape dims;
  std::vector<node_index> inputs;
  attributes attrs;

  bool operator==(const node&) const = default;
};

/// A named result a run returns.
struct output {
  std::string name;
  node_index id = -1;
  bool operator==(const output&) const = default;
};

/// After a run, parameter `target` takes the value of node `value` (optimizer steps, running
/// statistics). All updates read values of the same run: they apply together at its end.
struct update {
  node_index target = -1;  ///< a parameter node
  node_index value = -1;   ///< same dtype and shape as the parameter
  bool operator==(const update&) const = default;
};

/// A computation: nodes in topological order (inputs precede users), what to return, what to
/// write back. Build one with mesh::builder; check a foreign one with mesh::validate().
struct graph {
  std::vector<node> nodes;
  std::vector<output> outputs;
  std::vector<update> updates;

  const node& operator[](node_index id) const { return nodes[static_cast<size_t>(id)]; }
  node_index size() const { return static_cast<node_index>(nodes.size()); }
  /// The id of the input or parameter with this name, or -1.
  node_index find_leaf(const std::string& name) const;
  /// The id of the output with this name, or -1.
  node_index find_output(const std::string& name) const;

  bool operator==(const graph&) const = default;
};

/// Which element of its input each element of a broadcast, permute or slice node reads, by flat
/// index (what the back ends compute as index arithmetic). Made once per node; the reference
/// evaluator keeps its own, independent, multi-index version.
class movement_index {
 public:
  /// `n` is a broadcast, permute or slice node; `in_dims` its input's shape.
  movement_index(const node& n, const shape& in_dims);
  /// The input's flat index read by output element `k`.
  int64_t operator()(int64_t k) const;

 private:
  struct axis {
    int64_t out_stride, out_size, in_stride, offset;  ///< in += ((k / out_stride) % out_size + offset) * in_stride
  };
  std::vector<axis> axes_;
};

/// A readable listing, one node per line ("%3 = matmul(%1, %2) : f32[4,8]"), for errors and logs.
std::string to_string(const graph& g);

}  // namespace mesh
