#pragma once
/// When and over which nodes a split model is planned again (docs/serving.md, "Split over the
/// mesh"). Pure: the failover pipeline (actors/failover_pipeline.hpp) asks these with what the
/// node's health view and its own failed stage calls told it, and acts on the answer.
///
/// The policy, in short: a stage node that is gone (left, Dead, or its stage call failed as
/// unavailable) makes the model re-plan at once over the nodes left; a node that joins is taken
/// only while the model runs on fewer nodes than its split asked for (after a loss), so that a
/// mesh at full width does not move its layers each time a node comes and goes.
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"

namespace mesh::generation {

/// A node that may hold a stage, as its hello describes it.
struct split_candidate {
  node_id id;
  uint64_t memory_bytes = 0;  ///< its device memory free now (its latest report; its size before one came)
  double speed = 0;           ///< its measured memory bandwidth, GB/s: decoding is bound by it
};

/// Where a split model stands: the nodes its plan was made over (this node first; some may hold
/// no layers) and those holding stages now, and how many nodes its split asked for.
struct split_plan_view {
  node_id self;
  std::vector<node_id> planned_over;
  std::vector<node_id> in_stages;
  size_t want = 0;
};

/// How split plans order nodes by free memory: in whole GiB, so that the small changes of a
/// figure asked again at every heartbeat do not reorder nodes (and move layers) between loads.
inline uint64_t memory_rank(uint64_t free_bytes) { return free_bytes >> 30; }

/// Why a plan must change now.
enum class replan_cause {
  none,       ///< the plan stands
  lost_node,  ///< a node holding a stage is gone: requests cannot run until it is re-planned
  widen,      ///< the plan has fewer nodes than asked for and a node it does not use is there
  asked,      ///< a user asked for a plan over a number of nodes (meshctl models replan)
};

const char* to_string(replan_cause c);

/// What to do, given the peers alive now (`live`, this node not among them) and the nodes that
/// must not be used (`excluded`: gone, failed a stage call, or refused a stage since they last
/// joined). A plan with no stages (dropped after a loss) is a lost_node.
replan_cause replan_needed(const split_plan_view& plan, std::span<const split_candidate> live, const std::set<node_id>& excluded);

/// The nodes to plan over next, in plan order: `self` first (it holds the tokenizer and embeds
/// the tokens when it gets layers), then the nodes of the old plan still usable, in their order
/// (their layers move least), then other usable peers with the most memory (memory_rank; ties:
/// the lower id),
/// up to `want` nodes in all.
std::vector<split_candidate> replan_nodes(const split_candidate& self, std::span<const node_id> planned_over,
                                          std::span<const split_candidate> live, const std::set<node_id>& excluded, size_t want);

/// Whether a failed pipeline step means its stage's node is lost (it left, is not connected, or
/// did not answer in time), as opposed to an error of the request or of a device, which a
/// re-plan would not cure.
bool is_stage_loss(const error& e);

}  // namespace mesh::generation
