#include "actors/split_model.hpp"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include <fmt/format.h>

#include "actors/failover_pipeline.hpp"
#include "models/model_weights.hpp"
#include "models/session.hpp"

namespace mesh::generation {

expected<std::vector<split_candidate>> pick_split_nodes(const split_candidate& self, std::vector<split_candidate> peers, size_t n) {
  if (n < 2) return make_error(error_code::invalid_argument, fmt::format("a split needs 2 nodes or more, not {}", n));
  if (peers.size() + 1 < n)
    return make_error(error_code::invalid_argument,
                      fmt::format("a split over {} nodes needs {} healthy peers; this node has {}", n, n - 1, peers.size()));
  std::sort(peers.begin(), peers.end(), [](const auto& a, const auto& b) {
    const uint64_t ra = memory_rank(a.memory_bytes), rb = memory_rank(b.memory_bytes);
    return ra != rb ? ra > rb : a.id.to_string() < b.id.to_string();
  });
  std::vector<split_candidate> out{self};
  out.insert(out.end(), peers.begin(), peers.begin() + static_cast<std::ptrdiff_t>(n - 1));
  return out;
}

namespace {

/// The offered files with the byte ranges a stage of `layers` reads (a node without the
/// checkpoint fetches only their chunks); without ranges (whole files) when they cannot be told.
std::vector<msg::blob_file> with_ranges(std::vector<msg::blob_file> files, const models::model_config& config,
                                        const models::checkpoint& ckpt, const models::layer_range& layers) {
  if (files.empty()) return files;
  auto ranges = models::stage_file_ranges(config, ckpt, layers);
  if (!ranges || ranges->size() != files.size()) return files;
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& r : (*ranges)[i]) files[i].ranges.push_back({r.offset, r.length});
  return files;
}

}  // namespace

serving::split_builder make_split_builder(std::shared_ptr<stage_calls> calls, const node_id& self,
                                          std::vector<split_candidate> nodes, std::string path, remote_stage_timeouts timeouts,
                                          std::shared_ptr<split_roster> roster, std::function<void(const std::string&)> log,
                                          std::shared_ptr<blobs::blob_offers> offers) {
  std::error_code ec;
  auto absolute = std::filesystem::absolute(path, ec);
  if (!ec) path = absolute.lexically_normal().string();
  return [calls, self, nodes, path, timeouts, roster, log, offers](const serving::split_input& in) -> expected<std::unique_ptr<serving::split_sequence>> {
    const int64_t context = in.context > 0 ? in.context : std::min(in.config.max_context, models::session_options::default_context_cap);
    if (context > in.config.max_context)
      return make_error(error_code::invalid_argument, fmt::format("a context of {} positions was asked for, but the model was trained for {}",
                                                                  context, in.config.max_context));
    const int64_t slots = in.slots;
    auto costs = models::plan_costs(in.config, in.ckpt, {}, context, slots);
    if (!costs) return tl::unexpected(costs.error());
    if (nodes.empty() || nodes.front().id != self)
      return make_error(error_code::invalid_argument, "a split's nodes must begin with this node");
    // The checkpoint and the executor belong to the model, which outlives its pipeline.
    const models::checkpoint* ckpt = &in.ckpt;
    gpu::executor* ex = &in.ex;
    const models::model_config config = in.config;
    // Offered once per load; the re-plans of failover use the same digests (a file changed
    // meanwhile fails the fetch's check instead of feeding a stage other weights).
    std::vector<msg::blob_file> offered;
    if (offers) {
      if (auto o = offers->offer_checkpoint(in.ckpt.path(), in.ckpt.files())) offered = std::move(*o);
      else if (log) log("not offered to peers: " + o.error().message);
    }
    failover_options fo;
    fo.open = [=, costs = *costs](const std::vector<split_candidate>& over, std::shared_mutex& device) -> expected<std::unique_ptr<models::pipeline>> {
      std::vector<models::stage_node> candidates;
      for (const auto& n : over)
        candidates.push_back({n.id.to_string(), static_cast<int64_t>(std::min<uint64_t>(n.memory_bytes, INT64_MAX)), std::max(n.speed, 1e-3)});
      // The serving node samples: when it holds the first stage and the last is elsewhere, it
      // applies the final norm and the head itself, so that the last stage sends it one hidden
      // row per sequence and token instead of the vocabulary's logits (128,256 floats for Llama 3).
      // The plan counts the head's memory where it goes; a plan that leaves this node without
      // layers puts it back on the last stage.
      auto plan = models::plan_stages(costs, candidates, models::head_place::first_stage);
      if (!plan || plan->front().node != self.to_string()) plan = models::plan_stages(costs, candidates);
      if (!plan) return tl::unexpected(plan.error());
      const bool head_here = plan->size() > 1 && plan->front().node == self.to_string();
      std::vector<models::pipeline_stage> stages;
      for (const auto& a : *plan) {
        if (a.node == self.to_string()) {
          models::session_options so;
          so.context = context;
          so.layers = a.layers;
          so.slots = slots;
          so.prepare_decode = true;
          std::unique_lock<std::shared_mutex> lock(device);  // the executor serves the running pipeline too
          auto s = models::session::create(*ex, *ckpt, so);
          if (!s) return tl::unexpected(s.error());
          std::optional<models::session> head;
          if (head_here && stages.empty()) {
            models::session_options ho;
            ho.layers = models::layer_range::head_of(config.n_layers);
            ho.prefix = "head.";  // beside the stage's parameters on this executor
            ho.slots = slots;     // its programs for up to every sequence's row, loaded now
            ho.prepare_decode = true;
            auto h = models::session::create(*ex, *ckpt, ho);
            if (!h) return make_error(h.error().code, "the head on this node: " + h.error().message);
            head.emplace(std::move(*h));
          }
          stages.push_back({a.node, a.layers, models::local_stage::make(std::move(*s), std::move(head))});
          continue;
        }
        auto peer = node_id::parse(a.node);
        if (!peer) return tl::unexpected(peer.error());
        // On failure the stages opened so far go out of scope here, which closes them on their nodes.
        auto r = remote_stage::open(calls, *peer, path, a.layers, context, config.hidden_size, timeouts,
                                    with_ranges(offered, config, *ckpt, a.layers), slots);
        if (!r)
          return make_error(r.error().code, fmt::format("stage {} (layers {}) on node {}: {}", stages.size() + 1,
                                                        models::to_string(a.layers), peer->short_string(), r.error().message));
        stages.push_back({a.node, a.layers, std::move(*r)});
      }
      return models::pipeline::create(config, context, std::move(stages), slots);
    };
    fo.stage_bytes = [costs = *costs](const models::layer_range& r) { return costs.stage_bytes(r); };
    fo.self = nodes.front();
    fo.nodes = nodes;
    fo.roster = roster;
    fo.log = log;
    auto f = failover_pipeline::create(std::move(fo), config, context, slots);
    if (!f) return tl::unexpected(f.error());
    return std::unique_ptr<serving::split_sequence>(std::move(*f));
  };
}

}  // namespace mesh::generation
