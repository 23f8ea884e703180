#include "discovery/static_peer.hpp"

#include <algorithm>
#include <charconv>

#include "discovery/txt_record.hpp"

namespace mesh::discovery {

expected<static_peer> parse_static_peer(std::string_view text) {
  static_peer p;
  const std::string shown(text.substr(0, 80));
  if (auto at = text.find('@'); at != std::string_view::npos) {
    p.node_id = std::string(text.substr(0, at));
    if (!is_valid_node_id(p.node_id)) {
      return make_error(error_code::invalid_argument,
                        "peer '" + shown + "': the part before '@' must be a 64-hex-char node id");
    }
    text.remove_prefix(at + 1);
  }
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return make_error(error_code::invalid_argument, "peer '" + shown + "': expected [ipv6]:port");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) {
      return make_error(error_code::invalid_argument,
                        "peer '" + shown + "': expected host:port (IPv6 as [addr]:port)");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  const bool host_ok = !host.empty() && host.size() <= 253 &&
                       std::all_of(host.begin(), host.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                (c >= '0' && c <= '9') || c == '.' || c == '-' || c == ':' ||
                                c == '%' || c == '_';
                       });
  if (!host_ok) return make_error(error_code::invalid_argument, "peer '" + shown + "': bad host");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || value == 0 || value > 65535) {
    return make_error(error_code::invalid_argument, "peer '" + shown + "': port must be 1-65535");
  }
  p.host = std::string(host);
  p.port = static_cast<uint16_t>(value);
  return p;
}

}  // namespace mesh::discovery
