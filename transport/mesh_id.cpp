#include "transport/mesh_id.hpp"

#include <sodium.h>

#include <array>

namespace mesh::transport {
namespace {

std::string hex_of(const uint8_t* p, size_t n) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(hex[p[i] >> 4]);
    s.push_back(hex[p[i] & 15]);
  }
  return s;
}

}  // namespace

std::string mesh_id_of(std::span<const uint8_t> secret) {
  if (sodium_init() < 0) return {};
  std::array<uint8_t, 16> out{};
  if (secret.empty()) {
    // The open mesh: a fixed id every open node agrees on.
    static constexpr char open_domain[] = "meshnode open mesh id v1";
    crypto_generichash(out.data(), out.size(), reinterpret_cast<const uint8_t*>(open_domain), sizeof(open_domain) - 1, nullptr, 0);
    return hex_of(out.data(), out.size());
  }
  // A fixed salt (domain separation from the admission key, which hashes the secret with its own
  // label): every node must derive the same id from the same secret.
  static constexpr char salt_domain[] = "meshnode mesh id v2";
  std::array<uint8_t, crypto_pwhash_SALTBYTES> salt{};
  crypto_generichash(salt.data(), salt.size(), reinterpret_cast<const uint8_t*>(salt_domain), sizeof(salt_domain) - 1, nullptr, 0);
  if (crypto_pwhash(out.data(), out.size(), reinterpret_cast<const char*>(secret.data()), secret.size(), salt.data(),
                    crypto_pwhash_OPSLIMIT_INTERACTIVE, crypto_pwhash_MEMLIMIT_INTERACTIVE, crypto_pwhash_ALG_ARGON2ID13) != 0)
    return {};  // out of memory: an empty id matches no mesh, so the node finds no peers by mDNS
  return hex_of(out.data(), out.size());
}

}  // namespace mesh::transport
