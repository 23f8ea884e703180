#pragma once
/// Mesh admission proof: a pure function pair, no I/O.
///
/// After the TLS handshake each side sends `version:u32 big-endian | mac[32]` where
/// mac = crypto_auth(key = H("meshnode admission v1" | secret), exporter | prover id | verifier id | version).
/// The exporter value (RFC 8446 §7.5, label `admission_exporter_label`) is unique per TLS
/// connection, so a proof recorded on one connection is worthless on another.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "base/node_id.hpp"

namespace mesh::transport {

/// TLS exporter label both sides use for the admission proof.
inline constexpr std::string_view admission_exporter_label = "EXPORTER-meshnode-admission-v1";
/// Size of an admission proof payload.
inline constexpr size_t admission_proof_size = 4 + 32;

/// Everything a proof binds to, seen from the prover's side.
struct admission_binding {
  std::array<uint8_t, 32> exporter{};  ///< TLS exporter value of this connection
  node_id prover;                      ///< who makes the proof
  node_id verifier;                    ///< who checks it
  uint32_t protocol_version = 0;       ///< the prover's protocol version
};

/// The proof `binding.prover` sends to `binding.verifier`.
std::array<uint8_t, admission_proof_size> make_admission_proof(std::span<const uint8_t> mesh_secret,
                                                               const admission_binding& binding);

/// Checks a proof received from `binding.prover`; `binding.protocol_version` is the version the
/// verifier speaks. Errors: decode_error (malformed), version_mismatch, invalid_argument (the
/// peer does not know the mesh secret, or replayed a proof from another connection).
expected<void> verify_admission_proof(std::span<const uint8_t> proof, std::span<const uint8_t> mesh_secret,
                                      const admission_binding& binding);

}  // namespace mesh::transport
