#include "actors/split_replan.hpp"

#include <algorithm>

namespace mesh::generation {

namespace {

const split_candidate* find_live(std::span<const split_candidate> live, const node_id& id) {
  auto it = std::find_if(live.begin(), live.end(), [&](const auto& c) { return c.id == id; });
  return it == live.end() ? nullptr : &*it;
}

}  // namespace

const char* to_string(replan_cause c) {
  switch (c) {
    case replan_cause::none: return "none";
    case replan_cause::lost_node: return "a stage node was lost";
    case replan_cause::widen: return "a node joined";
    case replan_cause::asked: return "asked for";
  }
  return "?";
}

replan_cause replan_needed(const split_plan_view& plan, std::span<const split_candidate> live, const std::set<node_id>& excluded) {
  if (plan.in_stages.empty()) return replan_cause::lost_node;
  for (const auto& n : plan.in_stages)
    if (n != plan.self && (excluded.count(n) || !find_live(live, n))) return replan_cause::lost_node;
  if (plan.planned_over.size() >= plan.want) return replan_cause::none;
  for (const auto& c : live) {
    if (c.id == plan.self || excluded.count(c.id)) continue;
    if (std::find(plan.planned_over.begin(), plan.planned_over.end(), c.id) == plan.planned_over.end()) return replan_cause::widen;
  }
  return replan_cause::none;
}

std::vector<split_candidate> replan_nodes(const split_candidate& self, std::span<const node_id> planned_over,
                                          std::span<const split_candidate> live, const std::set<node_id>& excluded, size_t want) {
  std::vector<split_candidate> out{self};
  const auto taken = [&](const node_id& id) {
    return std::any_of(out.begin(), out.end(), [&](const auto& c) { return c.id == id; });
  };
  for (const auto& id : planned_over) {
    if (out.size() >= want) return out;
    const auto* c = find_live(live, id);
    if (c && !excluded.count(id) && !taken(id)) out.push_back(*c);
  }
  std::vector<split_candidate> others;
  for (const auto& c : live)
    if (!excluded.count(c.id) && !taken(c.id)) others.push_back(c);
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) {
    const uint64_t ra = memory_rank(a.memory_bytes), rb = memory_rank(b.memory_bytes);
    return ra != rb ? ra > rb : a.id.to_string() < b.id.to_string();
  });
  for (const auto& c : others) {
    if (out.size() >= want) break;
    out.push_back(c);
  }
  return out;
}

bool is_stage_loss(const error& e) {
  return e.code == error_code::unavailable || e.code == error_code::network || e.code == error_code::timeout;
}

}  // namespace mesh::generation
