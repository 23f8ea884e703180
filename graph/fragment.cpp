#include "graph/fragment.hpp"

#include <map>

namespace mesh {

std::string cut_name(node_index id) { return "cut." + std::to_string(id); }

expected<graph> stage_fragment(const graph& g, const plan& p, int s) {
  if (p.kind != strategy::pipeline || s < 0 || s >= static_cast<int>(p.stages.size()))
    return make_error(error_code::invalid_argument, "stage_fragment: not a stage of a pipeline plan");
  std::vector<int> stage_of(g.nodes.size(), -1);
  for (size_t k = 0; k < p.stages.size(); ++k)
    for (auto id : p.stages[k].nodes) stage_of[static_cast<size_t>(id)] = static_cast<int>(k);

  graph f;
  std::map<node_index, node_index> local;  // original id -> fragment id
  const auto bring = [&](node_index id) -> node_index {
    if (auto it = local.find(id); it != local.end()) return it->second;
    const node& n = g[id];
    node copy;
    if (family_of(n.op) == op_family::leaf) {
      copy = n;  // leaves are brought to every stage that uses them
    } else {
      copy.op = op_kind::input;  // a value computed by an earlier stage
      copy.type = n.type;
      copy.dims = n.dims;
      copy.attrs.name = cut_name(id);
    }
    f.nodes.push_back(std::move(copy));
    return local[id] = f.size() - 1;
  };
  for (auto id : p.stages[static_cast<size_t>(s)].nodes) {
    const node& n = g[id];
    if (family_of(n.op) == op_family::leaf) {
      bring(id);
      continue;
    }
    node copy = n;
    for (auto& in : copy.inputs) in = bring(in);
    f.nodes.push_back(std::move(copy));
    local[id] = f.size() - 1;
  }
  // Values later stages need leave as cut outputs.
  for (const auto& t : p.transfers)
    if (t.from_stage == s && f.find_output(cut_name(t.value)) < 0) f.outputs.push_back({cut_name(t.value), local.at(t.value)});
  for (const auto& o : g.outputs)
    if (stage_of[static_cast<size_t>(o.id)] == s) f.outputs.push_back({o.name, local.at(o.id)});
  for (const auto& u : g.updates) {
    auto t = local.find(u.target), v = local.find(u.value);
    if (t != local.end() && v != local.end() && stage_of[static_cast<size_t>(u.value)] == s) f.updates.push_back({t->second, v->second});
  }
  return f;
}

}  // namespace mesh
