#pragma once
/// The public name of a mesh named only by its secret (`--secret-file`, and the open mesh).
/// Meshes made by `meshnode` itself get a random id instead (see join_token.hpp).
#include <cstdint>
#include <span>
#include <string>

namespace mesh::transport {

/// A printable id (32 hex digits) of a mesh secret, safe to publish (mDNS TXT records).
///
/// Derived with Argon2id (libsodium crypto_pwhash, interactive limits: 64 MiB and a fraction of a second): the id
/// is public, so anyone may test guesses of the secret against it offline; a memory-hard hash
/// makes each guess costly for a secret a person chose. A random 32-byte secret cannot be guessed
/// either way. The empty secret (the open mesh) has a fixed, well-known id.
std::string mesh_id_of(std::span<const uint8_t> secret);

}  // namespace mesh::transport
