#pragma once
/// The DNS-SD TXT record of a meshnode announcement (RFC 6763 section 6), as pure functions.
///
/// Entries, in order: `txtvers=1`, `id=<64 lowercase hex>`, `mesh=<mesh id>`, `v=<protocol
/// version>`, `port=<udp port>`, `dev=<device summary>`. Keys compare case-insensitively; the
/// first occurrence of a key wins (RFC 6763 6.4); unknown keys are ignored so that later versions
/// can add some. Everything read from the network is validated here: a TXT record either decodes
/// to a complete, valid announcement or gives an error saying what is wrong.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/types.hpp"
#include "base/error.hpp"

namespace mesh::discovery {

/// Largest single TXT string (its length prefix is one byte).
inline constexpr std::size_t max_txt_entry_size = 255;
/// Our bound on a whole TXT record (wire size): a record must fit one mDNS packet with room left.
inline constexpr std::size_t max_txt_record_size = 1024;
/// Most entries we look at in one TXT record.
inline constexpr std::size_t max_txt_entries = 32;
/// Longest mesh id and device summary.
inline constexpr std::size_t max_mesh_id_size = 128;
inline constexpr std::size_t max_device_summary_size = 128;
/// The TXT format version written in `txtvers`.
inline constexpr int txt_format_version = 1;

/// True for exactly 64 lowercase hex characters.
bool is_valid_node_id(std::string_view id);
/// True for 1..max_mesh_id_size printable ASCII characters other than space.
bool is_valid_mesh_id(std::string_view id);
/// True for 0..max_device_summary_size printable ASCII characters (space allowed).
bool is_valid_device_summary(std::string_view s);

/// Replaces non-printable bytes by '?' and truncates, so any device name can be announced.
std::string sanitize_device_summary(std::string_view s);

/// Checks every field of an announcement (ours before announcing, a peer's after decoding).
expected<void> validate(const announcement& a);

/// The TXT entries ("key=value") announcing `a`; an error if `a` is not valid.
expected<std::vector<std::string>> encode_txt(const announcement& a);

/// Decodes and validates TXT entries received from the network.
expected<announcement> decode_txt(const std::vector<std::string>& entries);

/// RFC 6763 wire form: each entry as one length byte and its bytes.
expected<std::vector<uint8_t>> txt_to_wire(const std::vector<std::string>& entries);

/// Splits the wire form into entries; an error on truncation, an oversized record or an empty
/// string. (A record of one zero byte is the RFC's "no entries" and gives an empty list.)
expected<std::vector<std::string>> txt_from_wire(std::span<const uint8_t> bytes);

}  // namespace mesh::discovery
