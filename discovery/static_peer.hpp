#pragma once
/// `--peer` values: "host:port", "[ipv6]:port" or "<node id>@host:port", parsed purely.
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace mesh::discovery {

/// One configured peer; `node_id` is empty when the user gave only an address.
struct static_peer {
  std::string node_id;
  std::string host;  ///< name or IP literal, without brackets
  uint16_t port = 0;
};

/// Parses one `--peer` value; an error says what is wrong with it.
expected<static_peer> parse_static_peer(std::string_view text);

}  // namespace mesh::discovery
