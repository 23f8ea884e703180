#include "transport/mesh_id.hpp"

#include <sodium.h>

#include <array>

namespace mesh::transport {

std::string mesh_id_of(std::span<const uint8_t> secret) {
  if (sodium_init() < 0) return {};
  // Domain-separated from the admission key derivation, so publishing this reveals nothing
  // usable for a proof.
  static constexpr char domain[] = "meshnode mesh id v1";
  std::array<uint8_t, 16> out{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, out.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(domain), sizeof(domain) - 1);
  crypto_generichash_update(&st, secret.data(), secret.size());
  crypto_generichash_final(&st, out.data(), out.size());
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : out) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

}  // namespace mesh::transport
