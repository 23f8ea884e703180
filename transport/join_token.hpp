#pragma once
/// Mesh credentials and the join token that carries one: pure functions, no I/O.
///
/// A credential is what makes a node a member: the mesh id (published in mDNS TXT records, so
/// nodes of one mesh find each other) and the mesh secret (never published; the admission proof
/// shows knowledge of it). The join token is one printable line holding both:
///
///   mesh1.<mesh id: 32 hex>.<secret: 64 hex>.<checksum: 8 hex>
///
/// `mesh1` names the format version; the checksum (BLAKE2b over the version and both fields) makes a
/// mistyped or truncated token fail with a clear error instead of joining no mesh at all.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace mesh::transport {

/// Bytes of a mesh secret (the admission key material).
inline constexpr size_t mesh_secret_size = 32;
/// Bytes of a mesh id (published as 32 hex digits).
inline constexpr size_t mesh_id_bytes = 16;
/// The format version this build writes and reads.
inline constexpr uint32_t join_token_version = 1;
/// Every join token starts with this, followed by its version and a dot.
inline constexpr std::string_view join_token_prefix = "mesh";
/// Characters of a version-1 token: "mesh1." + 32 + "." + 64 + "." + 8.
inline constexpr size_t join_token_size = 6 + 32 + 1 + 64 + 1 + 8;

/// What a node needs to be a member of a mesh. An empty secret is the open mesh (`--open`).
struct mesh_credential {
  std::string mesh_id;           ///< printable, public: goes into mDNS TXT records
  std::vector<uint8_t> secret;   ///< mesh_secret_size bytes, or empty for the open mesh

  bool open() const { return secret.empty(); }
  friend bool operator==(const mesh_credential&, const mesh_credential&) = default;
};

/// A new mesh: a random secret and a random mesh id. The id is independent of the secret, so
/// what mDNS publishes says nothing about the secret, not even to an offline guesser.
mesh_credential new_mesh_credential();

/// The credential of a mesh named only by its secret (`--secret-file`): the mesh id is derived
/// from the secret with a memory-hard hash (mesh_id_of), so that every node with the file agrees
/// on it and a weak, guessable secret still costs an offline guesser much per guess.
mesh_credential credential_from_secret(std::vector<uint8_t> secret);

/// The open mesh: no secret, the well-known open mesh id.
mesh_credential open_credential();

/// The one-line token for `c` (which must not be open).
std::string encode_join_token(const mesh_credential& c);

/// Parses a token a person typed or pasted (surrounding white space is ignored, hex digits may
/// be upper case). Errors (decode_error unless said) name what was wrong: not a meshnode token,
/// a version this build does not read (version_mismatch), the wrong length, a character that is
/// no hex digit (and where), a checksum that does not match (mistyped or truncated).
expected<mesh_credential> decode_join_token(std::string_view token);

}  // namespace mesh::transport
