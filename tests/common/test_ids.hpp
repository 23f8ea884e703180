#pragma once
// Node ids with readable names for the engine tests: the name's bytes ("a", "cli", "node-b") are
// the first bytes of the key, so a simulation can name its nodes and still hand the engines
// typed ids.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "base/node_id.hpp"

namespace mesh::test {

inline node_id named(std::string_view name) {
  node_id id;
  std::memcpy(id.key.data(), name.data(), std::min(name.size(), id.key.size()));
  return id;
}

inline std::string name_of(const node_id& id) {
  std::string s(id.key.begin(), id.key.end());
  s.erase(s.find_last_not_of('\0') + 1);
  return s;
}
inline const std::string& name_of(const std::string& name) { return name; }

}  // namespace mesh::test
