#pragma once
/// The partition planner: how to spread one graph over several devices. Pure: no I/O, no clock;
/// the job coordinator calls it with the live devices' measured profiles.
///
/// Strategies:
/// - pipeline: the graph is cut at any nodes into contiguous stages of a schedule order (a
///   topological order in which each leaf sits just before its first user); the cut minimises the
///   slowest stage's time (compute + bytes received over its link), which is exactly optimal for
///   this cost model (dynamic programming; unit-tested against brute force). Devices keep the
///   order given; a device may get an empty stage when using it would not help.
/// - data parallel: every device holds the whole graph and a share of the batch (axis 0 of every
///   input) proportional to its speed; updated parameters' gradients are all-reduced.
/// - tensor parallel: matmuls whose right operand is a rank-2 parameter (directly, or through a
///   broadcast that only adds batch axes) and that have at least one column are split by columns
///   across devices, proportional to speed, and their outputs all-gathered; the rest is replicated.
///
/// Speeds and bandwidths are the devices' own reports: one that is not finite and positive (NaN,
/// an infinity, 0, negative) counts as the slowest possible (usable_rate), and when no device has
/// a usable speed, shares are equal. Every share is a valid range: 0 <= first <= second <= size.
/// - automatic: the cheapest of the three by estimated step time.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/cost.hpp"
#include "base/error.hpp"
#include "graph/graph.hpp"

namespace mesh {

enum class strategy : uint8_t { pipeline, data_parallel, tensor_parallel, automatic };
const char* to_string(strategy s);

/// A value produced in one stage and used in a later one (sent peer to peer).
struct stage_transfer {
  node_index value = -1;
  int from_stage = 0, to_stage = 0;
  int64_t bytes = 0;
};

struct pipeline_stage {
  int device = 0;                ///< index into the device list
  std::vector<node_index> nodes;    ///< in schedule order
  double seconds = 0;            ///< estimated compute + receive time
};

struct batch_share {
  int device = 0;
  int64_t begin = 0, end = 0;  ///< rows [begin, end) of axis 0
};

/// A parameter split by columns: device d holds columns [ranges[d].first, ranges[d].second).
struct column_shard {
  node_index param = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges;  ///< one per device, in device order
};

struct plan {
  strategy kind = strategy::pipeline;
  double step_seconds = 0;  ///< estimated time of one run (pipeline: the bottleneck stage)
  // pipeline
  std::vector<pipeline_stage> stages;
  std::vector<stage_transfer> transfers;
  // data parallel
  int64_t batch = 0;
  std::vector<batch_share> shares;
  int64_t allreduce_bytes = 0;
  // tensor parallel
  std::vector<column_shard> shards;
  int64_t allgather_bytes = 0;
};

/// Plans `g` (valid) over `devices` (at least one). Errors: no devices; data parallel on a graph
/// without a common batch axis; pipeline on a graph whose updates would cross stages (training
/// graphs: use data parallel); tensor parallel without any shardable matmul; no stage fitting a
/// device's memory.
expected<plan> partition(const graph& g, const std::vector<device_profile>& devices, strategy s);

/// The cheapest (by estimated step time) of the pipeline, data- and tensor-parallel plans that
/// `usable` accepts (every plan the planner can make, when it is empty); the error lists why each
/// strategy was left out. partition(..., automatic) is cheapest_plan(g, devices).
expected<plan> cheapest_plan(const graph& g, const std::vector<device_profile>& devices,
                             const std::function<expected<void>(const plan&)>& usable = {});

/// The parameter that tensor parallel splits by columns for node `id`: for a matmul with at least
/// one column whose right operand is a rank-2 parameter, directly or through a broadcast that
/// keeps the last two dims (adds batch axes only), that parameter (its columns are the matmul's);
/// else -1. The planner and the staged rewrite (staged_plan.hpp) agree through this one rule.
node_index column_sharded_parameter(const graph& g, node_index id);

/// The schedule order the pipeline planner cuts: topological, leaves just before first use.
std::vector<node_index> schedule_order(const graph& g);

/// Bottleneck time of given pipeline cuts (stage i = order[cuts[i-1], cuts[i])), for tests and
/// for comparing plans. `cuts` has devices.size()-1 non-decreasing positions.
double pipeline_cost(const graph& g, const std::vector<device_profile>& devices, const std::vector<size_t>& cuts);

/// Re-plans after device `dead` (index into the old device list) failed, keeping every
/// survivor's nodes, batch rows or columns where they are and moving only what `dead` held.
/// `survivors` is the old device list without `dead`, in the same order.
expected<plan> replan(const graph& g, const plan& old, int dead, const std::vector<device_profile>& survivors);

}  // namespace mesh
