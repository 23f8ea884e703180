#include "graph/hash.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace mesh {
namespace {

/// FNV-1a over bytes, then a final avalanche (splitmix64) so that nearby inputs spread.
struct hasher {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  template <class T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  template <class T>
  void list(const std::vector<T>& xs) {
    value(xs.size());
    for (const auto& x : xs) value(x);
  }
  void text(const std::string& s) {
    value(s.size());
    bytes(s.data(), s.size());
  }
  uint64_t done() const {
    uint64_t z = h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

}  // namespace

std::vector<uint64_t> node_hashes(const graph& g) {
  std::vector<uint64_t> hs(g.nodes.size());
  for (node_index id = 0; id < g.size(); ++id) {
    const node& n = g[id];
    hasher h;
    h.value(n.op);
    h.value(n.type);
    h.list(n.dims);
    h.value(n.inputs.size());
    for (auto i : n.inputs) h.value(hs[static_cast<size_t>(i)]);
    h.text(n.attrs.name);
    h.list(n.attrs.axes);
    h.list(n.attrs.starts);
    h.list(n.attrs.stops);
    h.value(n.attrs.axis);
    h.value(n.attrs.cmp);
    h.value(n.attrs.keep_dims);
    h.list(n.attrs.values);
    hs[static_cast<size_t>(id)] = h.done();
  }
  return hs;
}

uint64_t structural_hash(const graph& g) {
  const auto hs = node_hashes(g);
  hasher h;
  // Leaves are the interface: include them all, order-independently (sorted hashes).
  std::vector<uint64_t> leaves;
  for (node_index id = 0; id < g.size(); ++id)
    if (g[id].op == op_kind::input || g[id].op == op_kind::parameter) leaves.push_back(hs[static_cast<size_t>(id)]);
  std::sort(leaves.begin(), leaves.end());
  h.list(leaves);
  for (const auto& o : g.outputs) {
    h.text(o.name);
    h.value(hs[static_cast<size_t>(o.id)]);
  }
  for (const auto& u : g.updates) {
    h.value(hs[static_cast<size_t>(u.target)]);
    h.value(hs[static_cast<size_t>(u.value)]);
  }
  return h.done();
}

}  // namespace mesh
