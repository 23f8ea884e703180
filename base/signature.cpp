#include "base/signature.hpp"

#include <sodium.h>

namespace mesh {

signature sign_statement(const std::array<uint8_t, 64>& secret_key, std::span<const uint8_t> statement) {
  signature out{};
  if (sodium_init() < 0) return out;
  if (crypto_sign_detached(out.data(), nullptr, statement.data(), statement.size(), secret_key.data()) != 0) out = {};
  return out;
}

bool verify_signature(const node_id& signer, std::span<const uint8_t> statement, const signature& sig) {
  if (sodium_init() < 0) return false;
  return crypto_sign_verify_detached(sig.data(), statement.data(), statement.size(), signer.key.data()) == 0;
}

}  // namespace mesh
