#pragma once
/// Where a node keeps its mesh credential (<state dir>/mesh.token, mode 0600) and how a node
/// chooses the credential it starts with.
#include <filesystem>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "transport/join_token.hpp"

namespace mesh::transport {

/// The file in a state directory that holds the node's join token.
inline constexpr const char* credential_file_name = "mesh.token";

/// Where a starting node's credential comes from.
enum class credential_source {
  open,         ///< --open: no secret; any host may join
  secret_file,  ///< --secret-file: the mesh is named by that secret
  join,         ///< --join TOKEN: taken and kept in the state directory
  stored,       ///< the token an earlier start kept in the state directory
  create,       ///< none of these: the first node of a new mesh makes one
};

/// What the user asked for at start, and whether the state directory holds a token.
struct credential_request {
  bool open = false;
  bool secret_file = false;
  bool join = false;
  bool stored = false;
};

/// The pure choice: explicit flags win over the stored token; --open, --secret-file and --join
/// exclude each other (invalid_argument naming the pair).
expected<credential_source> choose_credential_source(const credential_request& r);

/// The token kept in `state_dir`, or nullopt when there is none. Refuses a file that others may
/// read (the secret would no longer be one) and a token that does not decode.
expected<std::optional<mesh_credential>> load_stored_credential(const std::filesystem::path& state_dir);

/// Keeps `c`'s token in `state_dir` (mode 0600, written durably).
expected<void> store_credential(const std::filesystem::path& state_dir, const mesh_credential& c);

}  // namespace mesh::transport
