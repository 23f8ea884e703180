#include "discovery/browse_state.hpp"

#include <algorithm>

#include "discovery/txt_record.hpp"

namespace mesh::discovery {

browse_state::browse_state(announcement self, std::string source)
    : self_(std::move(self)), source_(std::move(source)) {}

std::vector<event> browse_state::resolved(const std::string& instance_key,
                                          const std::vector<std::string>& txt,
                                          const std::vector<std::string>& addresses, uint16_t port) {
  auto decoded = decode_txt(txt);
  if (!decoded) {
    // A hostile or broken record: forget what this instance said before, report why.
    std::vector<event> out = removed(instance_key);
    event e{event::peer_rejected, {}, "instance '" + sanitize_device_summary(instance_key) +
                                          "': " + decoded.error().message};
    e.peer.source = source_;
    out.push_back(std::move(e));
    return out;
  }
  if (decoded->node_id == self_.node_id) return removed(instance_key);  // ourselves
  if (decoded->port != port) {
    std::vector<event> out = removed(instance_key);
    out.push_back({event::peer_rejected, {}, "instance '" + sanitize_device_summary(instance_key) +
                                                 "': TXT port " + std::to_string(decoded->port) +
                                                 " differs from SRV port " + std::to_string(port)});
    out.back().peer.node_id = decoded->node_id;
    out.back().peer.source = source_;
    return out;
  }
  peer_info info{decoded->node_id, decoded->mesh_id, decoded->protocol_version, addresses,
                 port, decoded->device_summary, source_};
  std::vector<event> out;
  // The instance may have changed node id (a re-announce under the same name): drop the old.
  if (auto it = instances_.find(instance_key); it != instances_.end() && it->second.node_id != info.node_id) {
    out = removed(instance_key);
  }
  const bool member = is_member(self_, info);
  instances_[instance_key] = instance{info.node_id, member, info};
  if (!member) {
    const std::string why = info.mesh_id != self_.mesh_id ? "another mesh id" : "another protocol version";
    // This instance may have announced our mesh until now (same name, same node id, new TXT):
    // without it the node may be no member any more, and must be lost before it is foreign,
    // or it stays a member that nothing refreshes or removes.
    auto lost = refresh(info.node_id, "now announces " + why);
    out.insert(out.end(), lost.begin(), lost.end());
    const std::string tag = info.mesh_id + "/" + std::to_string(info.protocol_version);
    auto& seen = foreign_[info.node_id];
    if (seen != tag) {
      seen = tag;
      out.push_back({event::foreign_peer, info, why});
    }
    return out;
  }
  // Back in our mesh with every instance: moving out again is news again.
  if (std::none_of(instances_.begin(), instances_.end(),
                   [&](const auto& kv) { return kv.second.node_id == info.node_id && !kv.second.member; }))
    foreign_.erase(info.node_id);
  auto more = refresh(info.node_id, "");
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::vector<event> browse_state::removed(const std::string& instance_key) {
  auto it = instances_.find(instance_key);
  if (it == instances_.end()) return {};
  const std::string node_id = it->second.node_id;
  instances_.erase(it);
  const bool any_left = std::any_of(instances_.begin(), instances_.end(),
                                    [&](const auto& kv) { return kv.second.node_id == node_id; });
  if (!any_left) foreign_.erase(node_id);
  return refresh(node_id, "no longer announced");
}

std::vector<event> browse_state::clear(const std::string& detail) {
  std::vector<event> out;
  for (auto& [id, info] : reported_) out.push_back({event::peer_lost, info, detail});
  reported_.clear();
  instances_.clear();
  foreign_.clear();
  return out;
}

std::vector<peer_info> browse_state::members() const {
  std::vector<peer_info> out;
  for (const auto& [id, info] : reported_) out.push_back(info);
  return out;
}

peer_info browse_state::merged(const std::string& node_id) const {
  peer_info out;
  for (const auto& [key, inst] : instances_) {
    if (inst.node_id != node_id || !inst.member) continue;
    if (out.node_id.empty()) {
      out = inst.info;
      out.addresses.clear();
    }
    for (const auto& a : inst.info.addresses) {
      if (std::find(out.addresses.begin(), out.addresses.end(), a) == out.addresses.end()) {
        out.addresses.push_back(a);
      }
    }
  }
  // IPv4 first, then global IPv6, link-local last: the order a dialer should try them in.
  std::stable_sort(out.addresses.begin(), out.addresses.end(), [](const auto& a, const auto& b) {
    auto rank = [](const std::string& s) { return s.find(':') == std::string::npos ? 0 : (s.find('%') == std::string::npos ? 1 : 2); };
    return rank(a) < rank(b);
  });
  return out;
}

std::vector<event> browse_state::refresh(const std::string& node_id, const std::string& detail) {
  peer_info now = merged(node_id);
  auto it = reported_.find(node_id);
  if (now.node_id.empty()) {
    if (it == reported_.end()) return {};
    event e{event::peer_lost, it->second, detail};
    reported_.erase(it);
    return {e};
  }
  if (it == reported_.end()) {
    reported_[node_id] = now;
    return {{event::peer_found, now, ""}};
  }
  const peer_info& old = it->second;
  if (old.addresses == now.addresses && old.port == now.port && old.device_summary == now.device_summary) {
    return {};
  }
  it->second = now;
  return {{event::peer_updated, now, ""}};
}

}  // namespace mesh::discovery
