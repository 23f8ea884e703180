#pragma once
/// Ed25519 signatures by a node's key (libsodium). A node id is its public key, so a statement a
/// node signed can be checked by anyone who knows the id, and cannot be made by anyone else: a
/// client authorises things it cannot say itself on every connection (a takeover of its
/// training run, wire/takeover_grant.hpp) this way.
#include <array>
#include <cstdint>
#include <span>

#include "base/node_id.hpp"

namespace mesh {

/// A detached Ed25519 signature.
using signature = std::array<uint8_t, 64>;

/// Signs `statement` with libsodium's 64-byte Ed25519 secret key (seed || public key:
/// transport::identity::secret_key()). All zero if libsodium cannot initialise (no entropy
/// source), which no verify_signature() accepts.
signature sign_statement(const std::array<uint8_t, 64>& secret_key, std::span<const uint8_t> statement);

/// Whether `sig` is `signer`'s signature of `statement`. False for a key that is not a valid
/// Ed25519 point (the empty id among them), and when libsodium cannot initialise.
bool verify_signature(const node_id& signer, std::span<const uint8_t> statement, const signature& sig);

}  // namespace mesh
