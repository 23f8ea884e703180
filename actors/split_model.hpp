#pragma once
/// Building a model split over the mesh on the serving node (docs/serving.md, "Split over the
/// mesh"): the plan over this node and its peers (models/stage_plan.hpp), this node's stage as a
/// session, the others opened on their nodes (remote_stage), all driven as one pipeline by the
/// node's model host. No CAF here: the generator actor gathers the candidates from its views.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/blob_transfer.hpp"
#include "actors/remote_stage.hpp"
#include "actors/split_replan.hpp"
#include "actors/split_roster.hpp"
#include "base/node_id.hpp"
#include "models/stage_plan.hpp"
#include "serving/local_backend.hpp"

namespace mesh::generation {

/// The nodes to plan over for a split into `n`: `self` first (it holds the tokenizer, so the
/// embedding stays with it when it gets layers), then the n - 1 peers with the most free memory
/// (memory_rank: in whole GiB; ties: the lower id). Fewer peers than asked for is an invalid_argument error naming both counts.
expected<std::vector<split_candidate>> pick_split_nodes(const split_candidate& self, std::vector<split_candidate> peers, size_t n);

/// The split_builder for local_model_options: plans the checkpoint's stages over `nodes` (in
/// that order; nodes[0] must be this node, `self`), makes this node's stage here and opens the
/// others on their nodes from their copies of `path` (made absolute here). Errors name the path
/// and the node: a plan that does not fit, a peer that lacks the file or could not load it, one
/// that left. Stages opened before a failure are closed again.
///
/// The model it builds is a failover_pipeline: a lost stage node re-plans over the nodes left
/// (`roster`'s live peers; without one, the peers of `nodes` not lost yet) and the requests in
/// flight go on; a node that joins widens a plan narrower than `nodes` (only with a roster).
/// `log` gets a line per re-plan.
///
/// With `offers`, the file (a single-file checkpoint) is offered to the stage nodes by its
/// digest: one without its own copy fetches it from this node into its blob cache, at load and
/// at every re-plan. Without (or for a directory checkpoint), every stage node needs its own copy.
serving::split_builder make_split_builder(std::shared_ptr<stage_calls> calls, const node_id& self,
                                          std::vector<split_candidate> nodes, std::string path,
                                          remote_stage_timeouts timeouts = {}, std::shared_ptr<split_roster> roster = nullptr,
                                          std::function<void(const std::string&)> log = {},
                                          std::shared_ptr<blobs::blob_offers> offers = nullptr);

}  // namespace mesh::generation
