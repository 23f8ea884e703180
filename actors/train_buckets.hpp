#pragma once
/// The gradients of a data-parallel step in buckets, so that their all-reduce overlaps the
/// backward pass (docs/training.md, "Buckets"): the gradients in the order the backward pass
/// finishes them (the last layers' first), cut into buckets of about a size; and the program
/// that computes them cut into segments, one per bucket, run one after another on the device,
/// each bucket's all-reduce starting as its segment ends. Pure graph work: no device, no I/O.
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"

namespace mesh {

/// Reorders `grads` (with `sizes` and `dims`, the gradient outputs of `grad`) by where `grad`
/// computes them, and returns the end of each bucket: bucket b holds grads [ends[b-1], ends[b]).
/// A bucket closes once it holds `bucket_bytes` of f32 or more; at most max_buckets buckets
/// (later ones merge into the last). bucket_bytes 0: one bucket.
std::vector<size_t> order_into_buckets(const graph& grad, std::vector<std::string>& grads, std::vector<int64_t>& sizes,
                                       std::vector<shape>& dims, uint64_t bucket_bytes, int max_buckets);

/// A program cut into segments that run one after another and give the same updates and outputs.
struct segmented_program {
  std::vector<graph> segments;
  /// The inputs each segment reads (a run binds those and no others).
  std::vector<std::vector<std::string>> inputs;
  /// Values one segment computes and a later one reads, kept on the device between them as
  /// parameters "<prefix>x.<node>" (zeros until the first run writes them): set them up before
  /// the first run.
  tensor_map saved;
};

/// Cuts `g` so that segment k makes the updates whose targets `groups[k]` names (and segment 0
/// also returns g's outputs), each segment computing only what it needs that an earlier one did
/// not. A value an earlier segment computed is saved there (an update of a parameter named
/// `prefix` + "x." + its node index) and read back here. Errors: a group names no update of g.
expected<segmented_program> segment_by_updates(const graph& g, const std::vector<std::vector<std::string>>& groups,
                                               const std::string& prefix);

}  // namespace mesh
