#include "transport/admission.hpp"

#include <sodium.h>

#include <cstring>
#include <string>

namespace mesh::transport {

namespace {

std::array<uint8_t, crypto_auth_KEYBYTES> admission_key(std::span<const uint8_t> secret) {
  static constexpr char domain[] = "meshnode admission v1";
  std::array<uint8_t, crypto_auth_KEYBYTES> key{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, key.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(domain), sizeof(domain) - 1);
  crypto_generichash_update(&st, secret.data(), secret.size());
  crypto_generichash_final(&st, key.data(), key.size());
  return key;
}

std::array<uint8_t, 32 + 32 + 32 + 4> mac_input(const admission_binding& b) {
  std::array<uint8_t, 32 + 32 + 32 + 4> m{};
  std::memcpy(m.data(), b.exporter.data(), 32);
  std::memcpy(m.data() + 32, b.prover.key.data(), 32);
  std::memcpy(m.data() + 64, b.verifier.key.data(), 32);
  for (int i = 0; i < 4; ++i) m[96 + i] = static_cast<uint8_t>(b.protocol_version >> (24 - 8 * i));
  return m;
}

}  // namespace

std::array<uint8_t, admission_proof_size> make_admission_proof(std::span<const uint8_t> mesh_secret,
                                                               const admission_binding& binding) {
  if (sodium_init() < 0) return {};
  static_assert(crypto_auth_BYTES == 32);
  std::array<uint8_t, admission_proof_size> proof{};
  for (int i = 0; i < 4; ++i) proof[i] = static_cast<uint8_t>(binding.protocol_version >> (24 - 8 * i));
  auto key = admission_key(mesh_secret);
  auto msg = mac_input(binding);
  crypto_auth(proof.data() + 4, msg.data(), msg.size(), key.data());
  sodium_memzero(key.data(), key.size());
  return proof;
}

expected<void> verify_admission_proof(std::span<const uint8_t> proof, std::span<const uint8_t> mesh_secret,
                                      const admission_binding& binding) {
  if (sodium_init() < 0) return make_error(error_code::internal, "libsodium failed to initialise");
  if (proof.size() != admission_proof_size)
    return make_error(error_code::decode_error,
                      "admission proof has " + std::to_string(proof.size()) + " bytes, expected " +
                          std::to_string(admission_proof_size));
  uint32_t version = 0;
  for (int i = 0; i < 4; ++i) version = (version << 8) | proof[i];
  if (version != binding.protocol_version)
    return make_error(error_code::version_mismatch,
                      "peer speaks protocol version " + std::to_string(version) + ", this node speaks " +
                          std::to_string(binding.protocol_version));
  auto key = admission_key(mesh_secret);
  auto msg = mac_input(binding);
  int ok = crypto_auth_verify(proof.data() + 4, msg.data(), msg.size(), key.data());
  sodium_memzero(key.data(), key.size());
  if (ok != 0)
    return make_error(error_code::invalid_argument,
                      "admission proof rejected: the peer does not know this mesh's secret (or replayed "
                      "a proof from another connection)");
  return {};
}

}  // namespace mesh::transport
