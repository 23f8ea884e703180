#pragma once
/// `GET /api/mesh`: the mesh snapshot and this server's serving figures as one JSON document,
/// what the dashboard draws. Pure.
#include <string>
#include <vector>

#include "serving/backend.hpp"
#include "serving/mesh_view.hpp"
#include "serving/rate_series.hpp"
#include "serving/serving_stats.hpp"

namespace mesh::serving {

/// This server's part: the models its backend serves, its queue, totals and recent history.
struct serving_view {
  std::vector<model_info> models;
  backend_queue queue;
  serving_totals totals;
  rate_series::view series;
};

/// {"uptime_s", "nodes": [...], "models": [...], "trainings": [...], "serving": {...}}: every
/// field of the views under its own name. Run ids are strings (64-bit ids do not fit a
/// JavaScript number); a NaN or infinite loss is null.
std::string mesh_json(const mesh_snapshot& mesh, const serving_view& serving);

}  // namespace mesh::serving
