#include "transport/join_token.hpp"

#include <sodium.h>

#include <array>

#include "transport/mesh_id.hpp"

namespace mesh::transport {
namespace {

constexpr char hex_digits[] = "0123456789abcdef";

std::string to_hex(const uint8_t* p, size_t n) {
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(hex_digits[p[i] >> 4]);
    s.push_back(hex_digits[p[i] & 15]);
  }
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// 4 bytes of BLAKE2b over the version and the decoded fields: a typo in any digit changes it.
std::array<uint8_t, 4> checksum(std::string_view mesh_id_hex, const std::vector<uint8_t>& secret) {
  static constexpr char domain[] = "meshnode join token v1";
  // crypto_generichash's smallest output is 16 bytes; the token keeps the first 4.
  std::array<uint8_t, crypto_generichash_BYTES_MIN> full{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, full.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(domain), sizeof(domain) - 1);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(mesh_id_hex.data()), mesh_id_hex.size());
  crypto_generichash_update(&st, secret.data(), secret.size());
  crypto_generichash_final(&st, full.data(), full.size());
  return {full[0], full[1], full[2], full[3]};
}

/// Decodes `n` bytes of hex at `text[at..]`; the error names the field and the position.
expected<std::vector<uint8_t>> decode_hex(std::string_view text, size_t at, size_t n, const char* field) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < 2 * n; ++i) {
    const int v = hex_value(text[at + i]);
    if (v < 0)
      return make_error(error_code::decode_error, std::string("join token: character ") + std::to_string(at + i + 1) +
                                                      " (in the " + field + ") is not a hex digit: mistyped?");
    out[i / 2] = static_cast<uint8_t>(out[i / 2] << 4 | v);
  }
  return out;
}

}  // namespace

mesh_credential new_mesh_credential() {
  if (sodium_init() < 0) return {};
  std::array<uint8_t, mesh_id_bytes> id{};
  randombytes_buf(id.data(), id.size());
  mesh_credential c;
  c.mesh_id = to_hex(id.data(), id.size());
  c.secret.resize(mesh_secret_size);
  randombytes_buf(c.secret.data(), c.secret.size());
  return c;
}

mesh_credential credential_from_secret(std::vector<uint8_t> secret) {
  mesh_credential c;
  c.mesh_id = mesh_id_of(secret);
  c.secret = std::move(secret);
  return c;
}

mesh_credential open_credential() { return {mesh_id_of({}), {}}; }

std::string encode_join_token(const mesh_credential& c) {
  if (sodium_init() < 0) return {};
  const auto sum = checksum(c.mesh_id, c.secret);
  return std::string(join_token_prefix) + std::to_string(join_token_version) + "." + c.mesh_id + "." +
         to_hex(c.secret.data(), c.secret.size()) + "." + to_hex(sum.data(), sum.size());
}

expected<mesh_credential> decode_join_token(std::string_view token) {
  if (sodium_init() < 0) return make_error(error_code::internal, "libsodium failed to initialise");
  const auto blank = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; };
  while (!token.empty() && blank(token.front())) token.remove_prefix(1);
  while (!token.empty() && blank(token.back())) token.remove_suffix(1);
  if (token.empty()) return make_error(error_code::decode_error, "join token is empty (`meshctl invite` prints one)");
  if (token.substr(0, join_token_prefix.size()) != join_token_prefix)
    return make_error(error_code::decode_error,
                      "not a meshnode join token: it must start with \"mesh1.\" (`meshctl invite` on a member prints one)");
  // The version: digits up to the first dot. Parsed before the length, so that a newer token
  // says "newer version" rather than "wrong length".
  size_t i = join_token_prefix.size();
  uint64_t version = 0;
  const size_t digits_from = i;
  while (i < token.size() && token[i] >= '0' && token[i] <= '9' && i - digits_from < 9) version = version * 10 + static_cast<uint64_t>(token[i++] - '0');
  if (i == digits_from || i >= token.size() || token[i] != '.')
    return make_error(error_code::decode_error, "join token: no version after \"mesh\" (it must start with \"mesh1.\")");
  if (version != join_token_version)
    return make_error(error_code::version_mismatch, "join token version " + std::to_string(version) +
                                                        " is not one this meshnode reads (it reads version " +
                                                        std::to_string(join_token_version) + "): use a matching meshnode");
  if (token.size() != join_token_size)
    return make_error(error_code::decode_error, "join token has " + std::to_string(token.size()) + " characters, not " +
                                                    std::to_string(join_token_size) + ": truncated or mistyped?");
  // Fixed layout from here on: mesh1.<32>.<64>.<8>
  constexpr size_t id_at = 6, secret_at = id_at + 32 + 1, sum_at = secret_at + 64 + 1;
  if (token[secret_at - 1] != '.' || token[sum_at - 1] != '.')
    return make_error(error_code::decode_error, "join token: its fields must be separated by dots (mesh1.ID.SECRET.CHECK)");
  auto id = decode_hex(token, id_at, mesh_id_bytes, "mesh id");
  if (!id) return tl::unexpected(id.error());
  auto secret = decode_hex(token, secret_at, mesh_secret_size, "secret");
  if (!secret) return tl::unexpected(secret.error());
  auto sum = decode_hex(token, sum_at, 4, "checksum");
  if (!sum) return tl::unexpected(sum.error());
  mesh_credential c;
  c.mesh_id = to_hex(id->data(), id->size());  // lower case, as published
  c.secret = std::move(*secret);
  const auto want = checksum(c.mesh_id, c.secret);
  if (sodium_memcmp(want.data(), sum->data(), want.size()) != 0)
    return make_error(error_code::decode_error, "join token checksum does not match: a character is mistyped or missing; copy the "
                                                "whole line `meshctl invite` printed");
  return c;
}

}  // namespace mesh::transport
