#include "discovery/peer_exchange.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <set>

#include "discovery/txt_record.hpp"

namespace mesh::discovery {
namespace {

constexpr uint8_t pex_format = 1;

int hex_value(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

// Binary address of an IP literal fit for another host, or empty.
std::vector<uint8_t> pack_address(const std::string& text) {
  std::array<uint8_t, 16> buf{};
  if (inet_pton(AF_INET, text.c_str(), buf.data()) == 1) {
    if ((buf[0] == 0) || (buf[0] >= 224)) return {};  // unspecified, multicast, reserved
    return {4, buf[0], buf[1], buf[2], buf[3]};
  }
  if (text.find('%') != std::string::npos) return {};  // scoped: link-local
  if (inet_pton(AF_INET6, text.c_str(), buf.data()) == 1) {
    const bool unspecified = std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == 0; });
    const bool multicast = buf[0] == 0xff;
    const bool link_local = buf[0] == 0xfe && (buf[1] & 0xc0) == 0x80;
    if (unspecified || multicast || link_local) return {};
    std::vector<uint8_t> out{6};
    out.insert(out.end(), buf.begin(), buf.end());
    return out;
  }
  return {};
}

struct reader {
  std::span<const uint8_t> b;
  std::size_t i = 0;
  bool take(std::size_t n, const uint8_t*& p) {
    if (n > b.size() - i) return false;
    p = b.data() + i;
    i += n;
    return true;
  }
  bool u8(uint8_t& v) {
    const uint8_t* p;
    if (!take(1, p)) return false;
    v = p[0];
    return true;
  }
  bool u16(uint16_t& v) {
    const uint8_t* p;
    if (!take(2, p)) return false;
    v = static_cast<uint16_t>(p[0] << 8 | p[1]);
    return true;
  }
};

tl::unexpected<error> bad(const std::string& what) {
  return make_error(error_code::decode_error, "peer exchange message: " + what);
}

}  // namespace

std::vector<uint8_t> encode_pex(const std::vector<peer_info>& members) {
  std::vector<uint8_t> body;
  std::size_t count = 0;
  for (const peer_info& p : members) {
    if (count == max_pex_entries) break;
    if (!is_valid_node_id(p.node_id) || p.port == 0) continue;
    std::vector<std::vector<uint8_t>> addrs;
    for (const auto& a : p.addresses) {
      auto packed = pack_address(a);
      if (!packed.empty() && addrs.size() < max_pex_addresses &&
          std::find(addrs.begin(), addrs.end(), packed) == addrs.end()) {
        addrs.push_back(std::move(packed));
      }
    }
    if (addrs.empty()) continue;
    for (std::size_t k = 0; k < 64; k += 2) {
      body.push_back(static_cast<uint8_t>(hex_value(p.node_id[k]) << 4 | hex_value(p.node_id[k + 1])));
    }
    body.push_back(static_cast<uint8_t>(p.port >> 8));
    body.push_back(static_cast<uint8_t>(p.port & 0xff));
    body.push_back(static_cast<uint8_t>(addrs.size()));
    for (const auto& a : addrs) body.insert(body.end(), a.begin(), a.end());
    const std::string dev = sanitize_device_summary(p.device_summary);
    body.push_back(static_cast<uint8_t>(dev.size()));
    body.insert(body.end(), dev.begin(), dev.end());
    ++count;
  }
  // Header built in place (inserting after a 6-byte initializer list trips a false
  // -Warray-bounds in g++ 12 -O2).
  std::vector<uint8_t> out(6 + body.size());
  out[0] = 'M';
  out[1] = 'P';
  out[2] = 'X';
  out[3] = pex_format;
  out[4] = static_cast<uint8_t>(count >> 8);
  out[5] = static_cast<uint8_t>(count & 0xff);
  std::copy(body.begin(), body.end(), out.begin() + 6);
  return out;
}

expected<std::vector<peer_info>> decode_pex(std::span<const uint8_t> bytes) {
  reader r{bytes};
  const uint8_t* magic;
  if (!r.take(3, magic) || std::memcmp(magic, "MPX", 3) != 0) return bad("bad magic");
  uint8_t format;
  if (!r.u8(format)) return bad("truncated header");
  if (format != pex_format) {
    return make_error(error_code::version_mismatch,
                      "peer exchange message: format " + std::to_string(format) + " is not supported");
  }
  uint16_t count;
  if (!r.u16(count)) return bad("truncated header");
  if (count > max_pex_entries) {
    return make_error(error_code::limit_exceeded, "peer exchange message: " + std::to_string(count) +
                                                      " entries, at most 256 allowed");
  }
  static const char* hex = "0123456789abcdef";
  std::vector<peer_info> out;
  std::set<std::string> seen;
  for (uint16_t n = 0; n < count; ++n) {
    const std::string at = "entry " + std::to_string(n) + ": ";
    peer_info p;
    p.source = "exchange";
    const uint8_t* id;
    if (!r.take(32, id)) return bad(at + "truncated node id");
    for (int k = 0; k < 32; ++k) {
      p.node_id.push_back(hex[id[k] >> 4]);
      p.node_id.push_back(hex[id[k] & 0xf]);
    }
    if (!seen.insert(p.node_id).second) return bad(at + "duplicate node id");
    if (!r.u16(p.port)) return bad(at + "truncated port");
    if (p.port == 0) return bad(at + "port 0");
    uint8_t naddr;
    if (!r.u8(naddr)) return bad(at + "truncated address count");
    if (naddr == 0 || naddr > max_pex_addresses) return bad(at + "address count must be 1-8");
    for (uint8_t a = 0; a < naddr; ++a) {
      uint8_t family;
      if (!r.u8(family)) return bad(at + "truncated address");
      const uint8_t* raw;
      char text[INET6_ADDRSTRLEN] = {};
      if (family == 4) {
        if (!r.take(4, raw)) return bad(at + "truncated IPv4 address");
        inet_ntop(AF_INET, raw, text, sizeof text);
      } else if (family == 6) {
        if (!r.take(16, raw)) return bad(at + "truncated IPv6 address");
        inet_ntop(AF_INET6, raw, text, sizeof text);
      } else {
        return bad(at + "address family " + std::to_string(family) + " is neither 4 nor 6");
      }
      // Same rules as on the sending side: a peer must not make us dial multicast and the like.
      if (pack_address(text).empty()) return bad(at + "unusable address " + text);
      if (std::find(p.addresses.begin(), p.addresses.end(), text) != p.addresses.end()) {
        return bad(at + "duplicate address");
      }
      p.addresses.emplace_back(text);
    }
    uint8_t dev_len;
    if (!r.u8(dev_len)) return bad(at + "truncated device summary");
    const uint8_t* dev;
    if (dev_len > max_device_summary_size || !r.take(dev_len, dev)) {
      return bad(at + "device summary too long or truncated");
    }
    p.device_summary.assign(reinterpret_cast<const char*>(dev), dev_len);
    if (!is_valid_device_summary(p.device_summary)) return bad(at + "device summary not printable");
    out.push_back(std::move(p));
  }
  if (r.i != bytes.size()) return bad(std::to_string(bytes.size() - r.i) + " trailing bytes");
  return out;
}

std::vector<event> merge_pex(peer_table& table, const std::string& sender_node_id,
                             const std::vector<peer_info>& entries) {
  std::vector<event> out;
  for (peer_info p : entries) {
    if (p.node_id == table.self().node_id || p.node_id == sender_node_id) continue;
    p.mesh_id = table.self().mesh_id;
    p.protocol_version = table.self().protocol_version;
    p.source = "exchange";
    auto evs = table.apply({event::peer_found, std::move(p), "told by " + sender_node_id.substr(0, 12)});
    out.insert(out.end(), evs.begin(), evs.end());
  }
  return out;
}

}  // namespace mesh::discovery
