// What the node's actors share (node_shell.hpp): sending a message to a peer, on the channel its
// size and kind call for, and which announced addresses the endpoint can dial.
#include "actors/node_shell.hpp"

#include <spdlog/spdlog.h>

#include <utility>
#include <variant>

namespace mesh::node_shell {
namespace {

/// "host:port" for dialing, with IPv6 literals in brackets.
std::string host_port(const std::string& address, uint16_t port) {
  return address.find(':') != std::string::npos ? "[" + address + "]:" + std::to_string(port)
                                                : address + ":" + std::to_string(port);
}

}  // namespace

std::vector<std::string> reachable(const transport::endpoint& ep, const std::vector<std::string>& addresses, uint16_t port) {
  std::vector<std::string> out;
  for (const auto& a : addresses)
    if (auto hp = host_port(a, port); ep.can_reach(hp)) out.push_back(std::move(hp));
  return out;
}

bool try_send_peer(const node_context& ctx, const node_id& to, const msg::message& m) {
  auto bytes = msg::encode_message(m);
  if (!bytes) return true;  // nothing that could ever be sent
  if (!ctx.ep->connected(to)) return false;
  // Heartbeats as datagrams (they wait for nothing); large payloads (tensors, fragments) on bulk
  // streams of their own, small ones on the control stream. The peer's application sees both in
  // the order sent: a small message sent after a large one waits for it.
  const auto ch = std::holds_alternative<msg::heartbeat>(m) ? transport::channel::heartbeat
                  : bytes->size() > msg::max_control_message ? transport::channel::bulk
                                                             : transport::channel::control;
  if (auto ok = ctx.ep->send(to, ch, std::move(*bytes)); !ok)
    spdlog::warn("send {} to {}: {}", msg::kind_name(m), to.short_string(), ok.error().message);
  return true;
}

void send_peer(const node_context& ctx, const node_id& to, const msg::message& m) {
  if (!try_send_peer(ctx, to, m)) spdlog::warn("send {} to {}: the peer is not connected", msg::kind_name(m), to.short_string());
}

}  // namespace mesh::node_shell
