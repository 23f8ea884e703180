#include "discovery/peer_table.hpp"

#include <algorithm>

#include "discovery/txt_record.hpp"

namespace mesh::discovery {
namespace {

// Fresher sources first: mDNS records are current, exchanged and static ones are second-hand.
int source_rank(const std::string& s) {
  if (s == "avahi" || s == "dnssd") return 0;
  if (s == "static") return 1;
  return 2;
}

}  // namespace

peer_table::peer_table(announcement self) : self_(std::move(self)) {}

std::vector<event> peer_table::apply(const event& e) {
  switch (e.k) {
    case event::peer_found:
    case event::peer_updated: {
      if (e.peer.node_id == self_.node_id) return {};
      if (!is_valid_node_id(e.peer.node_id)) {
        return {{event::peer_rejected, e.peer, "not a valid node id: '" + sanitize_device_summary(e.peer.node_id.substr(0, 80)) + "'"}};
      }
      if (!is_member(self_, e.peer)) {
        return {{event::foreign_peer, e.peer, e.detail.empty() ? "not a member of this mesh" : e.detail}};
      }
      sources_[e.peer.node_id][e.peer.source] = e.peer;
      return refresh(e.peer.node_id, "");
    }
    case event::peer_lost: {
      auto it = sources_.find(e.peer.node_id);
      if (it == sources_.end()) return {};
      it->second.erase(e.peer.source);
      if (it->second.empty()) sources_.erase(it);
      return refresh(e.peer.node_id, e.detail);
    }
    default:
      return {e};
  }
}

std::vector<event> peer_table::forget(const std::string& node_id, const std::string& detail) {
  sources_.erase(node_id);
  return refresh(node_id, detail);
}

std::vector<peer_info> peer_table::members() const {
  std::vector<peer_info> out;
  for (const auto& [id, info] : reported_) out.push_back(info);
  return out;
}

const peer_info* peer_table::find(const std::string& node_id) const {
  auto it = reported_.find(node_id);
  return it == reported_.end() ? nullptr : &it->second;
}

std::vector<event> peer_table::refresh(const std::string& node_id, const std::string& detail) {
  auto src = sources_.find(node_id);
  auto rep = reported_.find(node_id);
  if (src == sources_.end()) {
    if (rep == reported_.end()) return {};
    event lost{event::peer_lost, rep->second, detail};
    reported_.erase(rep);
    return {lost};
  }
  std::vector<const peer_info*> ordered;
  for (const auto& [name, info] : src->second) ordered.push_back(&info);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](auto* a, auto* b) { return source_rank(a->source) < source_rank(b->source); });
  peer_info merged = *ordered.front();
  merged.addresses.clear();
  std::string sources;
  for (const peer_info* p : ordered) {
    for (const auto& a : p->addresses) {
      if (std::find(merged.addresses.begin(), merged.addresses.end(), a) == merged.addresses.end()) {
        merged.addresses.push_back(a);
      }
    }
    if (merged.device_summary.empty()) merged.device_summary = p->device_summary;
    sources += (sources.empty() ? "" : ",") + p->source;
  }
  merged.source = sources;
  if (rep == reported_.end()) {
    reported_[node_id] = merged;
    return {{event::peer_found, merged, ""}};
  }
  const peer_info& old = rep->second;
  if (old.addresses == merged.addresses && old.port == merged.port &&
      old.device_summary == merged.device_summary && old.source == merged.source) {
    return {};
  }
  rep->second = merged;
  return {{event::peer_updated, merged, ""}};
}

}  // namespace mesh::discovery
