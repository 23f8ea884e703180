#pragma once
/// What executor::drop_parameters may free, shared by both back ends: the parameters named with a
/// prefix that no loaded program reads (a loaded program's buffers or descriptor sets point at
/// the parameters it reads, so those stay until it is unloaded).
#include <set>
#include <string>

#include "graph/graph.hpp"

namespace mesh::gpu {

/// Adds the names of the parameters `g` reads to `names`.
inline void add_parameter_names(const graph& g, std::set<std::string>& names) {
  for (const auto& n : g.nodes)
    if (n.op == op_kind::parameter) names.insert(n.attrs.name);
}

/// Erases the entries of `params` (a map by name) whose name starts with `prefix` and is not in
/// `used`, calling `release(entry)` on each first; returns how many went.
template <class Map, class Release>
size_t drop_unused(Map& params, const std::string& prefix, const std::set<std::string>& used, Release release) {
  size_t dropped = 0;
  for (auto it = params.lower_bound(prefix); it != params.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    if (used.count(it->first)) {
      ++it;
      continue;
    }
    release(it->second);
    it = params.erase(it);
    ++dropped;
  }
  return dropped;
}

}  // namespace mesh::gpu
