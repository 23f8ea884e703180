#include "graph/planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

namespace mesh {
namespace {

constexpr double infinity = std::numeric_limits<double>::infinity();

bool is_leaf(const node& n) { return family_of(n.op) == op_family::leaf; }

/// Everything the pipeline cost needs, precomputed once per (graph, devices).
struct pipeline_model {
  const graph& g;
  const std::vector<device_profile>& devices;
  std::vector<node_index> order;
  std::vector<size_t> pos;  ///< position of each node in `order`

  pipeline_model(const graph& gr, const std::vector<device_profile>& devs)
      : g(gr), devices(devs), order(schedule_order(gr)), pos(gr.nodes.size()) {
    for (size_t i = 0; i < order.size(); ++i) pos[static_cast<size_t>(order[i])] = i;
  }

  size_t size() const { return order.size(); }

  /// Seconds for device d to run order[a, b), including receiving non-leaf values made earlier.
  /// Infinite when the stage's results do not fit the device's memory.
  double stage_seconds(int d, size_t a, size_t b) const {
    if (a == b) return 0;
    const auto& dev = devices[static_cast<size_t>(d)];
    double secs = 0;
    int64_t incoming = 0, resident = 0;
    std::vector<bool> counted(order.size(), false);
    for (size_t i = a; i < b; ++i) {
      const node_index id = order[i];
      secs += node_seconds(g, id, dev);
      resident += result_bytes(g[id]);
      for (auto in : g[id].inputs) {
        const size_t p = pos[static_cast<size_t>(in)];
        if (p < a && !is_leaf(g[in]) && !counted[p]) {
          counted[p] = true;
          incoming += result_bytes(g[in]);
        }
      }
    }
    if (resident + incoming > dev.memory_bytes) return infinity;
    return secs + static_cast<double>(incoming) / (usable_rate(dev.link_gbps) * 1e9);
  }

  /// Boundaries [0, cuts..., n] -> the slowest stage's time.
  double bottleneck(const std::vector<size_t>& cuts) const {
    double worst = 0;
    size_t a = 0;
    for (size_t s = 0; s <= cuts.size(); ++s) {
      const size_t b = s < cuts.size() ? cuts[s] : size();
      worst = std::max(worst, stage_seconds(static_cast<int>(s), a, b));
      a = b;
    }
    return worst;
  }

  plan make_plan(const std::vector<size_t>& cuts) const {
    plan p;
    p.kind = strategy::pipeline;
    std::vector<int> stage_of(g.nodes.size(), -1);
    size_t a = 0;
    for (size_t s = 0; s <= cuts.size(); ++s) {
      const size_t b = s < cuts.size() ? cuts[s] : size();
      pipeline_stage st;
      st.device = static_cast<int>(s);
      st.nodes.assign(order.begin() + static_cast<std::ptrdiff_t>(a), order.begin() + static_cast<std::ptrdiff_t>(b));
      st.seconds = stage_seconds(static_cast<int>(s), a, b);
      for (auto id : st.nodes) stage_of[static_cast<size_t>(id)] = static_cast<int>(s);
      p.step_seconds = std::max(p.step_seconds, st.seconds);
      p.stages.push_back(std::move(st));
      a = b;
    }
    for (size_t t = 0; t < p.stages.size(); ++t) {
      std::vector<bool> seen(g.nodes.size(), false);
      for (auto id : p.stages[t].nodes)
        for (auto in : g[id].inputs) {
          const int from = stage_of[static_cast<size_t>(in)];
          if (is_leaf(g[in]) || from == static_cast<int>(t) || seen[static_cast<size_t>(in)]) continue;
          seen[static_cast<size_t>(in)] = true;
          p.transfers.push_back({in, from, static_cast<int>(t), result_bytes(g[in])});
        }
    }
    return p;
  }
};

/// Optimal cuts by dynamic programming over (stages used, prefix covered).
std::vector<size_t> optimal_cuts(const pipeline_model& m) {
  const size_t n = m.size(), k = m.devices.size();
  // best[j][i]: smallest bottleneck covering order[0, i) with the first j devices.
  std::vector<std::vector<double>> best(k + 1, std::vector<double>(n + 1, infinity));
  std::vector<std::vector<size_t>> from(k + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t j = 1; j <= k; ++j) {
    for (size_t a = 0; a <= n; ++a) {
      if (best[j - 1][a] == infinity) continue;
      for (size_t i = a; i <= n; ++i) {
        const double c = std::max(best[j - 1][a], m.stage_seconds(static_cast<int>(j - 1), a, i));
        if (c < best[j][i]) {
          best[j][i] = c;
          from[j][i] = a;
        }
      }
    }
  }
  std::vector<size_t> cuts(k - 1);
  size_t i = n;
  for (size_t j = k; j > 1; --j) {
    i = from[j][i];
    cuts[j - 2] = i;
  }
  return cuts;
}

/// Checks that every updated parameter lives with its update in one stage.
expected<void> check_updates_local(const graph& g, const plan& p) {
  std::vector<int> stage_of(g.nodes.size(), -1);
  for (size_t s = 0; s < p.stages.size(); ++s)
    for (auto id : p.stages[s].nodes) stage_of[static_cast<size_t>(id)] = static_cast<int>(s);
  for (const auto& u : g.updates) {
    const int vs = stage_of[static_cast<size_t>(u.value)];
    for (node_index id = 0; id < g.size(); ++id)
      for (auto in : g[id].inputs)
        if (in == u.target && stage_of[static_cast<size_t>(id)] != vs)
          return make_error(error_code::unsupported,
                            "pipeline: parameter \"" + g[u.target].attrs.name +
                                "\" is used in one stage and updated in another; plan training graphs with data parallel");
  }
  return {};
}

/// Seconds for device d to run the whole graph.
double whole_graph_seconds(const graph& g, const device_profile& d) {
  double s = 0;
  for (node_index id = 0; id < g.size(); ++id) s += node_seconds(g, id, d);
  return s;
}

/// Splits `total` into integer parts proportional to `weights` (largest remainder). A weight that
/// is not finite and positive counts as 0, and when no weight is usable the parts are equal: the
/// weights come from measurements a peer reports, and a NaN or an infinity must neither reach the
/// cast to int64 (undefined, then a remainder loop of ~2^63 turns) nor give negative parts. The
/// parts are never negative and add up to max(total, 0).
std::vector<int64_t> proportional(int64_t total, const std::vector<double>& weights) {
  std::vector<int64_t> parts(weights.size(), 0);
  if (weights.empty() || total <= 0) return parts;
  // Scaled by the largest usable weight, so that the sum cannot overflow (1e308 + 1e308) and
  // total * w / sum cannot either: every scaled weight is in [0, 1] and their sum in [1, n].
  double top = 0;
  for (double w : weights)
    if (std::isfinite(w) && w > top) top = w;
  std::vector<double> scaled(weights.size(), 1.0);
  if (top > 0)
    for (size_t i = 0; i < weights.size(); ++i)
      scaled[i] = std::isfinite(weights[i]) && weights[i] > 0 ? weights[i] / top : 0.0;
  const double sum = std::accumulate(scaled.begin(), scaled.end(), 0.0);
  std::vector<std::pair<double, size_t>> rest;
  int64_t given = 0;
  for (size_t i = 0; i < scaled.size(); ++i) {
    const double exact = static_cast<double>(total) * (scaled[i] / sum);  // in [0, total]
    const int64_t left = total - given;
    // Capped at what is left, so that rounding in the double cannot hand out more than total.
    parts[i] = exact < static_cast<double>(left) ? static_cast<int64_t>(exact) : left;
    given += parts[i];
    rest.push_back({exact - static_cast<double>(parts[i]), i});
  }
  std::sort(rest.begin(), rest.end(), [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
  for (size_t r = 0; given < total; ++r, ++given) parts[rest[r % rest.size()].second]++;
  return parts;
}

int64_t trainable_bytes(const graph& g) {
  int64_t b = 0;
  for (const auto& u : g.updates)
    if (g[u.target].attrs.name.rfind("opt.", 0) != 0) b += result_bytes(g[u.target]);
  return b;
}

double min_link(const std::vector<device_profile>& devices) {
  double l = infinity;
  for (const auto& d : devices) l = std::min(l, usable_rate(d.link_gbps));
  return l * 1e9;
}

expected<plan> data_parallel(const graph& g, const std::vector<device_profile>& devices) {
  int64_t batch = -1;
  for (const auto& n : g.nodes) {
    if (n.op != op_kind::input) continue;
    if (n.dims.empty() || (batch >= 0 && n.dims[0] != batch))
      return make_error(error_code::unsupported, "data parallel: inputs do not share a batch axis 0 (input \"" + n.attrs.name + "\" is " + to_string(n.dims) + ")");
    batch = n.dims[0];
  }
  if (batch <= 0) return make_error(error_code::unsupported, "data parallel: the graph has no batched input");
  std::vector<double> speed, full;
  for (const auto& d : devices) {
    full.push_back(whole_graph_seconds(g, d));
    speed.push_back(1.0 / std::max(full.back(), 1e-12));
  }
  const auto rows = proportional(batch, speed);
  plan p;
  p.kind = strategy::data_parallel;
  p.batch = batch;
  int64_t at = 0;
  double compute = 0;
  for (size_t d = 0; d < devices.size(); ++d) {
    p.shares.push_back({static_cast<int>(d), at, at + rows[d]});
    at += rows[d];
    compute = std::max(compute, full[d] * static_cast<double>(rows[d]) / static_cast<double>(batch));
  }
  p.allreduce_bytes = trainable_bytes(g);
  const double n = static_cast<double>(devices.size());
  p.step_seconds = compute + 2 * (n - 1) / n * static_cast<double>(p.allreduce_bytes) / min_link(devices);
  return p;
}

expected<plan> tensor_parallel(const graph& g, const std::vector<device_profile>& devices) {
  std::vector<double> speed;
  for (const auto& d : devices) speed.push_back(usable_rate(d.gflops));
  plan p;
  p.kind = strategy::tensor_parallel;
  std::vector<double> secs(devices.size(), 0.0);
  std::vector<bool> sharded_param(g.nodes.size(), false);
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    const node_index w = column_sharded_parameter(g, id);
    if (w < 0) {
      for (size_t d = 0; d < devices.size(); ++d) secs[d] += node_seconds(g, id, devices[d]);
      continue;
    }
    const int64_t cols = n.dims.back();  // the matmul's own columns: what the staged rewrite splits
    const auto part = proportional(cols, speed);
    if (!sharded_param[static_cast<size_t>(w)]) {
      sharded_param[static_cast<size_t>(w)] = true;
      column_shard sh{w, {}};
      int64_t at = 0;
      for (auto c : part) {
        sh.ranges.push_back({at, at + c});
        at += c;
      }
      p.shards.push_back(std::move(sh));
    }
    for (size_t d = 0; d < devices.size(); ++d)
      secs[d] += node_seconds(g, id, devices[d]) * static_cast<double>(part[d]) / static_cast<double>(std::max<int64_t>(cols, 1));
    const double n_dev = static_cast<double>(devices.size());
    p.allgather_bytes += static_cast<int64_t>(static_cast<double>(result_bytes(n)) * (n_dev - 1) / n_dev);
  }
  if (p.shards.empty()) return make_error(error_code::unsupported, "tensor parallel: no matmul with a rank-2 parameter to shard");
  p.step_seconds = *std::max_element(secs.begin(), secs.end()) + static_cast<double>(p.allgather_bytes) / min_link(devices);
  return p;
}

}  // namespace

node_index column_sharded_parameter(const graph& g, node_index id) {
  const node& n = g[id];
  if (n.op != op_kind::matmul || n.dims.empty() || n.dims.back() == 0) return -1;
  node_index r = n.inputs[1];
  // Only a broadcast that adds batch axes keeps the parameter's columns the matmul's columns: one
  // that expands a column axis of size 1 ([k, 1] -> [k, n]) does not, and sharding its source
  // would give the matmul 1 column instead of n.
  if (g[r].op == op_kind::broadcast) {
    const node_index src = g[r].inputs[0];
    const shape& to = g[r].dims;
    const shape& from = g[src].dims;
    if (from.size() != 2 || to.size() < 2 || to[to.size() - 2] != from[0] || to.back() != from[1]) return -1;
    r = src;
  }
  if (g[r].op != op_kind::parameter || g[r].dims.size() != 2) return -1;
  return g[r].dims[1] == n.dims.back() ? r : -1;
}

const char* to_string(strategy s) {
  switch (s) {
    case strategy::pipeline: return "pipeline";
    case strategy::data_parallel: return "data_parallel";
    case strategy::tensor_parallel: return "tensor_parallel";
    case strategy::automatic: return "automatic";
  }
  return "?";
}

std::vector<node_index> schedule_order(const graph& g) {
  std::vector<node_index> order;
  std::vector<bool> placed(g.nodes.size(), false);
  for (node_index id = 0; id < g.size(); ++id) {
    if (is_leaf(g[id])) continue;
    for (auto in : g[id].inputs)
      if (is_leaf(g[in]) && !placed[static_cast<size_t>(in)]) {
        placed[static_cast<size_t>(in)] = true;
        order.push_back(in);
      }
    placed[static_cast<size_t>(id)] = true;
    order.push_back(id);
  }
  for (node_index id = 0; id < g.size(); ++id)
    if (!placed[static_cast<size_t>(id)]) order.push_back(id);  // leaves nothing uses
  return order;
}

double pipeline_cost(const graph& g, const std::vector<device_profile>& devices, const std::vector<size_t>& cuts) {
  return pipeline_model(g, devices).bottleneck(cuts);
}

expected<plan> partition(const graph& g, const std::vector<device_profile>& devices, strategy s) {
  if (devices.empty()) return make_error(error_code::invalid_argument, "partition: no devices to plan over");
  switch (s) {
    case strategy::pipeline: {
      pipeline_model m(g, devices);
      auto p = m.make_plan(optimal_cuts(m));
      if (p.step_seconds == infinity)
        return make_error(error_code::limit_exceeded, "pipeline: the graph does not fit the devices' memory");
      if (auto ok = check_updates_local(g, p); !ok) return tl::unexpected(ok.error());
      return p;
    }
    case strategy::data_parallel: return data_parallel(g, devices);
    case strategy::tensor_parallel: return tensor_parallel(g, devices);
    case strategy::automatic: return cheapest_plan(g, devices);
  }
  return make_error(error_code::invalid_argument, "partition: unknown strategy");
}

expected<plan> cheapest_plan(const graph& g, const std::vector<device_profile>& devices,
                             const std::function<expected<void>(const plan&)>& usable) {
  std::optional<plan> best;
  std::string why;
  for (auto c : {strategy::pipeline, strategy::data_parallel, strategy::tensor_parallel}) {
    auto p = partition(g, devices, c);
    if (p && usable)
      if (auto ok = usable(*p); !ok) p = tl::unexpected(ok.error());
    if (!p) {
      why += std::string(" ") + to_string(c) + ": " + p.error().message + ";";
      continue;
    }
    if (!best || p->step_seconds < best->step_seconds) best = std::move(*p);
  }
  if (!best) return make_error(error_code::unsupported, "no strategy applies:" + why);
  return *best;
}

expected<plan> replan(const graph& g, const plan& old, int dead, const std::vector<device_profile>& survivors) {
  if (survivors.empty()) return make_error(error_code::invalid_argument, "replan: no surviving devices");
  const auto renumber = [dead](int d) { return d > dead ? d - 1 : d; };
  switch (old.kind) {
    case strategy::pipeline: {
      // Old boundaries between consecutive stages; drop the dead stage's two boundaries and give
      // its segment to its neighbours, choosing the split point that minimises the bottleneck.
      pipeline_model m(g, survivors);
      std::vector<size_t> bounds{0};
      for (const auto& st : old.stages) bounds.push_back(bounds.back() + st.nodes.size());
      const auto s = static_cast<size_t>(dead);
      if (s >= old.stages.size()) return make_error(error_code::invalid_argument, "replan: no such device in the plan");
      const size_t a = bounds[s], b = bounds[s + 1];
      std::vector<size_t> kept(bounds.begin() + 1, bounds.end() - 1);  // interior cuts
      kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(s == 0 ? 0 : s - 1));
      // The remaining cut at index s-1 (if s > 0) separates stage s-1 from s+1: try it anywhere in [a, b].
      // The first stage's segment goes to the next stage, the last one's to the previous: erasing
      // the shared boundary already did that.
      if (s == 0 || s == old.stages.size() - 1 || kept.empty()) return m.make_plan(kept);
      std::vector<size_t> best_cuts = kept;
      double best = infinity;
      for (size_t c = a; c <= b; ++c) {
        auto cuts = kept;
        cuts[s - 1] = c;
        const double cost = m.bottleneck(cuts);
        if (cost < best) {
          best = cost;
          best_cuts = cuts;
        }
      }
      return m.make_plan(best_cuts);
    }
    case strategy::data_parallel: {
      plan p = old;
      p.shares.clear();
      std::vector<batch_share> orphaned;
      for (const auto& sh : old.shares) {
        if (sh.device == dead) orphaned.push_back(sh);
        else p.shares.push_back({renumber(sh.device), sh.begin, sh.end});
      }
      std::vector<double> speed;
      for (const auto& d : survivors) speed.push_back(1.0 / std::max(whole_graph_seconds(g, d), 1e-12));
      for (const auto& sh : orphaned) {
        const auto rows = proportional(sh.end - sh.begin, speed);
        int64_t at = sh.begin;
        for (size_t d = 0; d < survivors.size(); ++d) {
          if (rows[d]) p.shares.push_back({static_cast<int>(d), at, at + rows[d]});
          at += rows[d];
        }
      }
      const double n = static_cast<double>(survivors.size());
      double compute = 0;
      for (size_t d = 0; d < survivors.size(); ++d) {
        int64_t mine = 0;
        for (const auto& sh : p.shares)
          if (sh.device == static_cast<int>(d)) mine += sh.end - sh.begin;
        compute = std::max(compute, whole_graph_seconds(g, survivors[d]) * static_cast<double>(mine) / static_cast<double>(p.batch));
      }
      p.step_seconds = compute + (n > 1 ? 2 * (n - 1) / n * static_cast<double>(p.allreduce_bytes) / min_link(survivors) : 0);
      return p;
    }
    case strategy::tensor_parallel: {
      plan p = old;
      const size_t d = static_cast<size_t>(dead);
      const size_t heir = d > 0 ? d - 1 : 1;  // a neighbour, so column ranges stay contiguous
      for (auto& sh : p.shards) {
        if (d >= sh.ranges.size()) return make_error(error_code::invalid_argument, "replan: no such device in the plan");
        if (sh.ranges.size() < 2) return make_error(error_code::invalid_argument, "replan: no surviving devices");
        auto& h = sh.ranges[heir];
        h = {std::min(h.first, sh.ranges[d].first), std::max(h.second, sh.ranges[d].second)};
        sh.ranges.erase(sh.ranges.begin() + static_cast<std::ptrdiff_t>(d));
      }
      return p;
    }
    case strategy::automatic: break;
  }
  return make_error(error_code::invalid_argument, "replan: the old plan has no concrete strategy");
}

}  // namespace mesh
