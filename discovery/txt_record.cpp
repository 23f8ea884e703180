#include "discovery/txt_record.hpp"

#include <algorithm>
#include <charconv>
#include <optional>

namespace mesh::discovery {
namespace {

bool is_printable(char c) { return c >= 0x20 && c <= 0x7e; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Strict unsigned decimal: digits only, no sign, no leading zeros (so one value has one spelling).
template <class T>
std::optional<T> parse_decimal(std::string_view s) {
  if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  T value{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return value;
}

// A printable, bounded excerpt of hostile bytes for an error message.
std::string excerpt(std::string_view s) {
  return sanitize_device_summary(s.substr(0, 40)) + (s.size() > 40 ? "..." : "");
}

}  // namespace

bool is_valid_node_id(std::string_view id) {
  return id.size() == 64 && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool is_valid_mesh_id(std::string_view id) {
  return !id.empty() && id.size() <= max_mesh_id_size &&
         std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c <= 0x7e; });
}

bool is_valid_device_summary(std::string_view s) {
  return s.size() <= max_device_summary_size && std::all_of(s.begin(), s.end(), is_printable);
}

std::string sanitize_device_summary(std::string_view s) {
  std::string out(s.substr(0, max_device_summary_size));
  for (char& c : out) {
    if (!is_printable(c)) c = '?';
  }
  return out;
}

expected<void> validate(const announcement& a) {
  if (!is_valid_node_id(a.node_id)) {
    return make_error(error_code::invalid_argument,
                      "node id must be 64 lowercase hex characters, got '" + excerpt(a.node_id) + "'");
  }
  if (!is_valid_mesh_id(a.mesh_id)) {
    return make_error(error_code::invalid_argument,
                      "mesh id must be 1-128 printable characters without spaces, got '" +
                          excerpt(a.mesh_id) + "'");
  }
  if (a.port == 0) return make_error(error_code::invalid_argument, "port must be 1-65535, got 0");
  if (!is_valid_device_summary(a.device_summary)) {
    return make_error(error_code::invalid_argument,
                      "device summary must be at most 128 printable ASCII characters "
                      "(use sanitize_device_summary)");
  }
  return {};
}

expected<std::vector<std::string>> encode_txt(const announcement& a) {
  if (auto ok = validate(a); !ok) return forward_error(ok);
  std::vector<std::string> entries{
      "txtvers=" + std::to_string(txt_format_version),
      "id=" + a.node_id,
      "mesh=" + a.mesh_id,
      "v=" + std::to_string(a.protocol_version),
      "port=" + std::to_string(a.port),
      "dev=" + a.device_summary,
  };
  // Bounds above keep every entry < 255 bytes and the record < 1024 bytes; check anyway so that
  // a later change of a bound cannot produce a record peers reject.
  if (auto wire = txt_to_wire(entries); !wire) return forward_error(wire);
  return entries;
}

expected<announcement> decode_txt(const std::vector<std::string>& entries) {
  if (entries.size() > max_txt_entries) {
    return make_error(error_code::limit_exceeded,
                      "TXT record has " + std::to_string(entries.size()) + " entries, at most " +
                          std::to_string(max_txt_entries) + " allowed");
  }
  std::size_t total = 0;
  std::optional<std::string> txtvers, id, mesh, version, port, dev;
  for (const std::string& entry : entries) {
    total += entry.size() + 1;
    if (entry.size() > max_txt_entry_size || total > max_txt_record_size) {
      return make_error(error_code::limit_exceeded, "TXT record is oversized");
    }
    const auto eq = entry.find('=');
    // RFC 6763 6.4: entries without a key are silently ignored; so are boolean attributes
    // (no '='), since none of ours is one, and keys that cannot be ours.
    if (eq == 0 || eq == std::string::npos) continue;
    const std::string key = lower(std::string_view(entry).substr(0, eq));
    const std::string value = entry.substr(eq + 1);
    auto take = [&](std::optional<std::string>& slot) {
      if (!slot) slot = value;  // first occurrence wins
    };
    if (key == "txtvers") take(txtvers);
    else if (key == "id") take(id);
    else if (key == "mesh") take(mesh);
    else if (key == "v") take(version);
    else if (key == "port") take(port);
    else if (key == "dev") take(dev);
  }
  if (txtvers && *txtvers != std::to_string(txt_format_version)) {
    return make_error(error_code::version_mismatch,
                      "TXT format version '" + excerpt(*txtvers) + "' is not supported");
  }
  for (auto [slot, name] : {std::pair{&id, "id"}, {&mesh, "mesh"}, {&version, "v"}, {&port, "port"}}) {
    if (!*slot) return make_error(error_code::decode_error, std::string("TXT record lacks key '") + name + "'");
  }
  announcement a;
  a.node_id = *id;
  a.mesh_id = *mesh;
  a.device_summary = dev.value_or("");
  auto v = parse_decimal<uint32_t>(*version);
  if (!v) return make_error(error_code::decode_error, "TXT 'v' is not a version number: '" + excerpt(*version) + "'");
  a.protocol_version = *v;
  auto p = parse_decimal<uint32_t>(*port);
  if (!p || *p == 0 || *p > 65535) {
    return make_error(error_code::decode_error, "TXT 'port' is not a port number: '" + excerpt(*port) + "'");
  }
  a.port = static_cast<uint16_t>(*p);
  if (auto ok = validate(a); !ok) {
    return make_error(error_code::decode_error, "TXT record invalid: " + ok.error().message);
  }
  return a;
}

expected<std::vector<uint8_t>> txt_to_wire(const std::vector<std::string>& entries) {
  std::vector<uint8_t> out;
  for (const std::string& e : entries) {
    if (e.empty() || e.size() > max_txt_entry_size) {
      return make_error(error_code::invalid_argument, "TXT entry must be 1-255 bytes");
    }
    out.push_back(static_cast<uint8_t>(e.size()));
    out.insert(out.end(), e.begin(), e.end());
  }
  if (out.size() > max_txt_record_size) {
    return make_error(error_code::limit_exceeded, "TXT record would exceed 1024 bytes");
  }
  if (out.empty()) out.push_back(0);  // RFC 6763 6.1: an empty TXT record is one zero byte
  return out;
}

expected<std::vector<std::string>> txt_from_wire(std::span<const uint8_t> bytes) {
  if (bytes.size() > max_txt_record_size) {
    return make_error(error_code::limit_exceeded, "TXT record of " + std::to_string(bytes.size()) +
                                                      " bytes exceeds 1024");
  }
  std::vector<std::string> entries;
  if (bytes.size() == 1 && bytes[0] == 0) return entries;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const std::size_t n = bytes[i++];
    if (n == 0) return make_error(error_code::decode_error, "TXT record contains an empty string");
    if (n > bytes.size() - i) return make_error(error_code::decode_error, "TXT record is truncated");
    if (entries.size() == max_txt_entries) {
      return make_error(error_code::limit_exceeded, "TXT record has too many entries");
    }
    entries.emplace_back(reinterpret_cast<const char*>(bytes.data() + i), n);
    i += n;
  }
  return entries;
}

}  // namespace mesh::discovery
