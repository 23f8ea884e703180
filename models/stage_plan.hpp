#pragma once
/// Which node holds which layers: a model split into contiguous pipeline stages over candidate
/// nodes by their free device memory and measured speed. Pure (no I/O): the costs come from
/// plan_costs (models/model_weights.hpp), the nodes from whoever measured them.
///
/// The rule: nodes keep their given order and each takes the next layers. Layers are shared in
/// proportion to speed (largest remainder, ties to the earlier node), so that stages take about
/// equal time; a node whose share does not fit its free memory (its layers' weights and KV
/// caches, plus the embedding on the first stage and the final norm and head on the last) keeps
/// what fits, and the rest is shared again among the others by speed, until every share fits.
/// Nodes that get no layers are left out. The same input always gives the same plan.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "models/layer_range.hpp"

namespace mesh::models {

/// A node that may hold a stage.
struct stage_node {
  std::string id;
  int64_t free_bytes = 0;  ///< device memory it can give the model
  double speed = 0;        ///< measured speed, in one unit for all nodes (e.g. GB/s); > 0
};

/// One node's stage.
struct stage_assignment {
  std::string node;
  layer_range layers;
  int64_t bytes = 0;  ///< what it holds: its layers' weights and KV caches, and the first and last stage's extras
};

/// Where a plan of several stages puts the final norm and the output head.
enum class head_place {
  last_stage,   ///< with the last layer
  /// With the embedding, on the first stage's node (the serving node, which samples): the stage
  /// ending at the last layer gets `layers.head = false` and returns hidden rows.
  first_stage,
};

/// The stages over `nodes`, in their order, covering every layer once, each within its node's
/// free memory as `head` places the head (a plan of one stage holds it either way). Errors: no nodes, no
/// layers, a speed that is not positive or a negative free memory (invalid_argument, naming the
/// node); a model that does not fit (limit_exceeded): "needs 5.1 GB, the 3 nodes have 3.9 GB
/// free", or, when the total would fit but no contiguous split does, how many layers they hold.
expected<std::vector<stage_assignment>> plan_stages(const model_costs& costs, std::span<const stage_node> nodes,
                                                    head_place head = head_place::last_stage);

/// Bytes for people: "812 B", "3.4 kB", "5.1 MB", "5.1 GB" (powers of 1000).
std::string format_bytes(int64_t bytes);

}  // namespace mesh::models
