#pragma once
/// A roofline cost model for graph nodes and devices, shared by the partition planner and by
/// whatever reports plan estimates. Devices advertise measured speeds (see device_profile).
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace mesh {

/// What a node knows of a device when planning: measured, not assumed.
struct device_profile {
  std::string id;             ///< node id (or any name, in tests)
  double gflops = 1;          ///< measured arithmetic throughput, GFLOP/s
  double mem_gbps = 1;        ///< measured device memory bandwidth, GB/s
  double link_gbps = 1;       ///< network bandwidth to its peers, GB/s
  int64_t memory_bytes = int64_t{1} << 32;
};

/// A measured rate (gflops, mem_gbps or link_gbps) as the cost model uses it: one that is not
/// finite and positive (NaN, an infinity, zero or negative: a broken or hostile measurement)
/// counts as the slowest rate the model knows, 1e-9, so that a device reporting it gets as little
/// work as possible rather than all of it (or a plan of NaN). Finite positive rates are floored
/// at 1e-9 too.
double usable_rate(double r);

/// Floating-point operations of one node (matmul and linear: 2mkn per batch; elementwise: one per
/// element or a few for transcendental ops; reductions: one per input element; gather: one per
/// result element; scatter_add: one per result element and one per update; movement and leaves,
/// splatted constants included: zero, their memory is what validate() bounds).
double node_flops(const graph& g, node_index id);

/// Bytes a node reads and writes (inputs' results and its own).
double node_bytes(const graph& g, node_index id);

/// Size in bytes of a node's result.
int64_t result_bytes(const node& n);

/// Estimated seconds for `dev` to compute node `id`: the larger of compute and memory time.
double node_seconds(const graph& g, node_index id, const device_profile& dev);

}  // namespace mesh
