#include "models/stage_plan.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include <fmt/format.h>

namespace mesh::models {

namespace {

// `total` seats shared among the nodes `who` by speed: largest remainder, ties to the earlier.
std::vector<int64_t> share_by_speed(int64_t total, const std::vector<size_t>& who, std::span<const stage_node> nodes) {
  double speed = 0;
  for (const size_t i : who) speed += nodes[i].speed;
  std::vector<int64_t> seats(who.size());
  std::vector<double> rest(who.size());
  int64_t given = 0;
  for (size_t j = 0; j < who.size(); ++j) {
    const double quota = static_cast<double>(total) * nodes[who[j]].speed / speed;
    seats[j] = static_cast<int64_t>(std::floor(quota));
    rest[j] = quota - static_cast<double>(seats[j]);
    given += seats[j];
  }
  std::vector<size_t> order(who.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t k = 0; given < total; ++k, ++given) ++seats[order[k % order.size()]];
  return seats;
}

// What the stage `r` of a plan holds. With the head on the first stage, the first holds the
// final norm and the head beside the embedding (its own copy, even of a tied embedding) and the
// stage ending at the last layer holds neither.
int64_t stage_cost(const model_costs& c, layer_range r, head_place head) {
  if (head == head_place::last_stage) return c.stage_bytes(r);
  r.head = false;
  return c.stage_bytes(r) + (r.first == 0 ? c.last_bytes : 0);
}

// The most layers, at most `want`, that a node with `free` bytes holds from layer `first` on.
int64_t layers_that_fit(const model_costs& c, int64_t first, int64_t want, int64_t free, head_place head) {
  for (int64_t k = want; k > 0; --k)
    if (stage_cost(c, {first, first + k}, head) <= free) return k;
  return 0;
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes < 1000) return fmt::format("{} B", bytes);
  if (bytes < 1000 * 1000) return fmt::format("{:.1f} kB", b / 1e3);
  if (bytes < 1000 * 1000 * 1000) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} GB", b / 1e9);
}

expected<std::vector<stage_assignment>> plan_stages(const model_costs& costs, std::span<const stage_node> nodes, head_place head) {
  const int64_t n_layers = costs.layers();
  if (n_layers < 1) return make_error(error_code::invalid_argument, "stage plan: the model has no layers");
  if (nodes.empty()) return make_error(error_code::invalid_argument, "stage plan: no nodes to place the model on");
  int64_t free = 0;
  for (const auto& n : nodes) {
    if (!(n.speed > 0) || !std::isfinite(n.speed) || n.free_bytes < 0)
      return make_error(error_code::invalid_argument,
                        fmt::format("stage plan: node {} has speed {} and {} bytes free; a speed must be positive "
                                    "and memory not negative",
                                    n.id, n.speed, n.free_bytes));
    free += n.free_bytes;
  }
  const int64_t need = costs.stage_bytes({0, n_layers});
  if (need > free)
    return make_error(error_code::limit_exceeded,
                      fmt::format("stage plan: the model needs {}, the {} nodes have {} free", format_bytes(need),
                                  nodes.size(), format_bytes(free)));

  // A node whose share did not fit keeps what fitted (capped); the others share the rest by
  // speed. Each pass caps a node or lowers a cap, so the loop ends.
  std::vector<std::optional<int64_t>> cap(nodes.size());
  std::vector<int64_t> count(nodes.size());
  for (;;) {
    std::vector<size_t> open;
    int64_t rest = n_layers;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (cap[i]) rest -= *cap[i];
      else open.push_back(i);
    }
    if (open.empty() && rest > 0)
      return make_error(error_code::limit_exceeded,
                        fmt::format("stage plan: the model needs {} and the {} nodes have {} free, but in contiguous "
                                    "stages they hold only {} of its {} layers",
                                    format_bytes(need), nodes.size(), format_bytes(free), n_layers - rest, n_layers));
    const auto shares = share_by_speed(rest, open, nodes);
    for (size_t j = 0; j < open.size(); ++j) count[open[j]] = shares[j];
    for (size_t i = 0; i < nodes.size(); ++i)
      if (cap[i]) count[i] = *cap[i];
    bool fits = true;
    for (int64_t i = 0, next = 0; i < static_cast<int64_t>(nodes.size()) && fits; ++i) {
      const auto u = static_cast<size_t>(i);
      const int64_t k = layers_that_fit(costs, next, count[u], nodes[u].free_bytes, head);
      if (k < count[u]) {
        cap[u] = k;
        fits = false;
      }
      next += count[u];
    }
    if (fits) break;
  }

  std::vector<stage_assignment> out;
  for (size_t i = 0, next = 0; i < nodes.size(); ++i) {
    if (count[i] == 0) continue;
    const layer_range r{static_cast<int64_t>(next), static_cast<int64_t>(next) + count[i]};
    out.push_back({nodes[i].id, r, stage_cost(costs, r, head)});
    next += static_cast<size_t>(count[i]);
  }
  if (out.size() == 1) out.front().bytes = costs.stage_bytes(out.front().layers);  // the whole model: the head is its own
  else if (head == head_place::first_stage) out.back().layers.head = false;
  return out;
}

}  // namespace mesh::models
