#pragma once
/// A node's long-lived Ed25519 key pair, stored in its state directory.
#include <array>
#include <cstdint>
#include <filesystem>

#include "base/error.hpp"
#include "base/node_id.hpp"

namespace mesh::transport {

/// An Ed25519 key pair (libsodium). The node id is the public key.
class identity {
 public:
  /// Loads `<state_dir>/node.key`, or creates it (mode 0600, directory 0700) when absent.
  /// Refuses a key file that group or others may read, and a corrupt one.
  static expected<identity> load_or_create(const std::filesystem::path& state_dir);
  /// A fresh key pair that lives only in memory (tests, throw-away nodes).
  static identity generate();
  /// The key pair derived from a 32-byte seed (deterministic tests).
  static identity from_seed(const std::array<uint8_t, 32>& seed);

  node_id id() const { return node_id{public_key_}; }
  const std::array<uint8_t, 32>& seed() const { return seed_; }
  const std::array<uint8_t, 32>& public_key() const { return public_key_; }
  /// libsodium's 64-byte secret key (seed || public key).
  std::array<uint8_t, 64> secret_key() const;

 private:
  std::array<uint8_t, 32> seed_{};
  std::array<uint8_t, 32> public_key_{};
};

/// The name of the key file inside a state directory.
inline constexpr const char* identity_file_name = "node.key";

}  // namespace mesh::transport
