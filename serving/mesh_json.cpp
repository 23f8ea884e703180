#include "serving/mesh_json.hpp"

#include <cmath>

#include <nlohmann/json.hpp>

namespace mesh::serving {

namespace {

using json = nlohmann::json;

json node_json(const node_view& n) {
  return {{"id", n.id},
          {"device", n.device},
          {"health", n.health},
          {"self", n.self},
          {"address", n.address},
          {"gflops", n.gflops},
          {"memory_bytes", n.memory_bytes},
          {"free_memory_bytes", n.free_memory_bytes},
          {"rtt_ms", n.rtt_ms},
          {"bytes_sent", n.bytes_sent},
          {"bytes_received", n.bytes_received},
          {"packets_lost", n.packets_lost},
          {"relayed", n.relayed},
          {"running_stages", n.running_stages}};
}

json model_json(const model_view& m) {
  json stages = json::array();
  for (const auto& s : m.stages) stages.push_back({{"node", s.node}, {"first_layer", s.first_layer}, {"end_layer", s.end_layer}});
  return {{"id", m.id}, {"path", m.path}, {"context", m.context}, {"layers", m.layers}, {"stages", std::move(stages)}};
}

json training_json(const training_view& t) {
  json loss = json::array();
  for (const double l : t.loss) loss.push_back(std::isfinite(l) ? json(l) : json(nullptr));
  return {{"run", std::to_string(t.run)}, {"state", t.state}, {"step", t.step}, {"steps", t.steps}, {"loss", std::move(loss)}};
}

}  // namespace

std::string mesh_json(const mesh_snapshot& mesh, const serving_view& serving) {
  json nodes = json::array(), models = json::array(), trainings = json::array(), served = json::array();
  for (const auto& n : mesh.nodes) nodes.push_back(node_json(n));
  for (const auto& m : mesh.models) models.push_back(model_json(m));
  for (const auto& t : mesh.trainings) trainings.push_back(training_json(t));
  for (const auto& m : serving.models)
    served.push_back({{"id", m.id}, {"context", m.context}, {"created", m.created}, {"chat", m.chat}});
  const json s = {
      {"models", std::move(served)},
      {"queue", {{"running", serving.queue.running}, {"waiting", serving.queue.waiting}}},
      {"totals",
       {{"requests", serving.totals.requests},
        {"prompt_tokens", serving.totals.prompt_tokens},
        {"completion_tokens", serving.totals.completion_tokens}}},
      {"series",
       {{"interval_s", serving.series.interval_s}, {"requests", serving.series.requests}, {"tokens", serving.series.tokens}}},
  };
  const json doc = {{"uptime_s", mesh.uptime_s},
                    {"nodes", std::move(nodes)},
                    {"models", std::move(models)},
                    {"trainings", std::move(trainings)},
                    {"serving", s}};
  // Replace, not throw, on invalid UTF-8 from a peer's device name or a path.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace mesh::serving
