#pragma once
/// Turning any plan into stages the pipeline machinery can run.
///
/// The job engine runs a job as a set of stages: each stage is a fragment of a graph
/// (stage_fragment) on one device, and values cross stages as named cut tensors sent peer to
/// peer. A pipeline plan already is such a set. A data-parallel or tensor-parallel plan is first
/// rewritten into a larger graph whose stages express the plan:
///
/// - data parallel: one replica of the graph per batch share, reading its own rows of every input
///   (the inputs are split on the coordinator, so each worker receives only its rows); a final
///   stage on device 0 concatenates the batched outputs along axis 0. This is only correct when
///   each output row depends only on the same input rows; the rewrite checks that op by op and
///   refuses graphs that mix rows (a reduction over axis 0, a matmul contracting the batch axis,
///   a reshape that moves rows, scatter_add, ...), saying which node and why.
/// - tensor parallel: each matmul whose right operand is a sharded parameter becomes one matmul
///   per device over that device's columns of the parameter (split on the coordinator), followed
///   by a concatenation along the last axis on device 0; everything else runs on device 0.
///
/// Pure: no I/O. The rewritten graph is validated before it is returned.
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "graph/planner.hpp"

namespace mesh {

/// A leaf of the staged graph made from part of a job tensor: [begin, end) of `axis` of `source`.
struct tensor_piece {
  std::string name;    ///< the leaf's name in the staged graph
  std::string source;  ///< the job's input or parameter it is cut from
  int axis = 0;
  int64_t begin = 0, end = 0;
};

/// What the job engine runs: `g` cut into the stages of `stages` (a pipeline-kind plan whose
/// stage devices index the device list the original plan was made for).
struct staged_job {
  graph g;
  plan stages;
  std::vector<tensor_piece> pieces;  ///< leaves of g cut from the job's tensors
};

/// The stages of plan `p` (any concrete strategy) for the valid graph `g`. Errors say why a plan
/// cannot be run as stages (for data parallel: the node that mixes batch rows; for tensor
/// parallel: a parameter whose column ranges do not tile its columns in device order).
expected<staged_job> stage_plan(const graph& g, const plan& p);

/// The tensors the stages' leaves bind: pieces cut from `job`, the rest taken as they are.
expected<tensor_map> staged_tensors(const staged_job& s, const tensor_map& job);

/// Elements [begin, end) of `axis` of `t` (0 <= begin <= end <= dims[axis]).
tensor slice_tensor(const tensor& t, int axis, int64_t begin, int64_t end);

}  // namespace mesh
