#include "actors/split_model.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "models/model_weights.hpp"
#include "models/session.hpp"

namespace mesh::generation {

expected<std::vector<split_candidate>> pick_split_nodes(const split_candidate& self, std::vector<split_candidate> peers, size_t n) {
  if (n < 2) return make_error(error_code::invalid_argument, fmt::format("a split needs 2 nodes or more, not {}", n));
  if (peers.size() + 1 < n)
    return make_error(error_code::invalid_argument,
                      fmt::format("a split over {} nodes needs {} healthy peers; this node has {}", n, n - 1, peers.size()));
  std::sort(peers.begin(), peers.end(), [](const auto& a, const auto& b) {
    return a.memory_bytes != b.memory_bytes ? a.memory_bytes > b.memory_bytes : a.id.to_string() < b.id.to_string();
  });
  std::vector<split_candidate> out{self};
  out.insert(out.end(), peers.begin(), peers.begin() + static_cast<std::ptrdiff_t>(n - 1));
  return out;
}

serving::split_builder make_split_builder(std::shared_ptr<stage_calls> calls, const node_id& self,
                                          std::vector<split_candidate> nodes, std::string path, remote_stage_timeouts timeouts) {
  std::error_code ec;
  auto absolute = std::filesystem::absolute(path, ec);
  if (!ec) path = absolute.lexically_normal().string();
  return [calls, self, nodes, path, timeouts](const serving::split_input& in) -> expected<std::unique_ptr<models::pipeline>> {
    const int64_t context = in.context > 0 ? in.context : std::min(in.config.max_context, models::session_options::default_context_cap);
    if (context > in.config.max_context)
      return make_error(error_code::invalid_argument, fmt::format("a context of {} positions was asked for, but the model was trained for {}",
                                                                  context, in.config.max_context));
    auto costs = models::plan_costs(in.config, in.ckpt, {}, context);
    if (!costs) return tl::unexpected(costs.error());
    std::vector<models::stage_node> candidates;
    for (const auto& n : nodes)
      candidates.push_back({n.id.to_string(), static_cast<int64_t>(std::min<uint64_t>(n.memory_bytes, INT64_MAX)), std::max(n.speed, 1e-3)});
    auto plan = models::plan_stages(*costs, candidates);
    if (!plan) return tl::unexpected(plan.error());
    std::vector<models::pipeline_stage> stages;
    for (const auto& a : *plan) {
      if (a.node == self.to_string()) {
        models::session_options so;
        so.context = context;
        so.layers = a.layers;
        auto s = models::session::create(in.ex, in.ckpt, so);
        if (!s) return tl::unexpected(s.error());
        stages.push_back({a.node, a.layers, models::local_stage::make(std::move(*s))});
        continue;
      }
      auto peer = node_id::parse(a.node);
      if (!peer) return tl::unexpected(peer.error());
      // On failure the stages opened so far go out of scope here, which closes them on their nodes.
      auto r = remote_stage::open(calls, *peer, path, a.layers, context, in.config.hidden_size, timeouts);
      if (!r)
        return make_error(r.error().code, fmt::format("stage {} (layers {}) on node {}: {}", stages.size() + 1,
                                                      models::to_string(a.layers), peer->short_string(), r.error().message));
      stages.push_back({a.node, a.layers, std::move(*r)});
    }
    return models::pipeline::create(in.config, context, std::move(stages));
  };
}

}  // namespace mesh::generation
