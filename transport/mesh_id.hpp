#pragma once
/// The public name of a mesh, derived from its secret.
#include <cstdint>
#include <span>
#include <string>

namespace mesh::transport {

/// A printable hash (32 hex digits) of a mesh secret, safe to publish (mDNS TXT records):
/// it names the mesh without revealing the secret. The empty secret (the open LAN mesh) has
/// a fixed, well-known id too.
std::string mesh_id_of(std::span<const uint8_t> secret);

}  // namespace mesh::transport
