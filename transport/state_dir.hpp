#pragma once
/// The node's state directory: identity key, mesh credential, endpoint file.
#include <filesystem>

#include "base/error.hpp"

namespace mesh::transport {

/// Makes sure `dir` is fit to hold secrets: creates it (and missing parents) with mode 0700 when
/// absent; refuses a `dir` that is a symbolic link (whoever can change the link chooses where
/// the node's key and mesh secret are read and written), that is no directory, or that others
/// may write to (they could swap the key files). Errors are invalid_argument or io_error with
/// a sentence naming the directory and what to do.
expected<void> prepare_state_dir(const std::filesystem::path& dir);

}  // namespace mesh::transport
