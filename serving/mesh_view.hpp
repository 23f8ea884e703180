#pragma once
/// What the dashboard (GET /, GET /api/mesh) and the metrics (GET /metrics) show of the mesh, as
/// plain data: the node that serves the page, its peers as this node sees them, the models it
/// serves and the training runs it knows. The node fills it (from its status view) when a page
/// asks; tests fill it by hand. No CAF, no wire types.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mesh::serving {

/// One node of the mesh: this one (`self`) or a peer as this node sees it.
struct node_view {
  std::string id;          ///< node id, hex
  std::string device;      ///< device name and kind, e.g. "NVIDIA H100 (vulkan)"
  std::string health;      ///< "self", "healthy", "suspect", "dead", "unknown"
  bool self = false;
  std::string address;     ///< host:port this node reaches it at ("" for self)
  double gflops = 0;       ///< measured at its start
  uint64_t memory_bytes = 0;  ///< device memory (host memory for a CPU node)
  uint64_t free_memory_bytes = 0;  ///< of which free now (a peer: at its latest heartbeat)
  double rtt_ms = 0;       ///< smoothed round-trip time from this node (0 for self)
  uint64_t bytes_sent = 0;      ///< by this node to it (QUIC payload bytes)
  uint64_t bytes_received = 0;  ///< by this node from it
  uint64_t packets_lost = 0;
  bool relayed = false;
  uint32_t running_stages = 0;
};

/// A contiguous range of a model's layers on one node.
struct stage_view {
  std::string node;        ///< node id, hex
  int64_t first_layer = 0;
  int64_t end_layer = 0;   ///< one past the last
};

struct model_view {
  std::string id;
  std::string path;
  int64_t context = 0;
  int64_t layers = 0;
  std::vector<stage_view> stages;  ///< where its layers run (one stage: all on one node)
};

struct training_view {
  uint64_t run = 0;
  std::string state;          ///< "running", "done", "failed", ...
  uint64_t step = 0, steps = 0;
  std::vector<double> loss;   ///< per step so far (may be thinned to the most recent)
};

struct mesh_snapshot {
  double uptime_s = 0;             ///< of the node serving the page
  std::vector<node_view> nodes;    ///< this node first
  std::vector<model_view> models;
  std::vector<training_view> trainings;
};

/// Called on an HTTP thread for every page, JSON or metrics request that needs it; must be
/// thread-safe and return within a second or two.
using snapshot_source = std::function<mesh_snapshot()>;

}  // namespace mesh::serving
