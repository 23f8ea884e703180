#include "actors/blob_digest.hpp"

#include <sodium.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace mesh::blobs {

static_assert(sizeof(crypto_generichash_state) <= 384, "hasher::state_ must hold libsodium's state");
static_assert(crypto_generichash_BYTES == 32, "a digest is BLAKE2b-256");

namespace {
crypto_generichash_state* state_of(unsigned char* s) { return reinterpret_cast<crypto_generichash_state*>(s); }
}  // namespace

std::string to_hex(const digest& d) {
  static const char* const x = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : d) {
    out.push_back(x[b >> 4]);
    out.push_back(x[b & 15]);
  }
  return out;
}

expected<digest> parse_digest(std::string_view hex) {
  const auto bad = [&] { return make_error(error_code::invalid_argument, "not a blob digest (64 hex digits): \"" + std::string(hex.substr(0, 80)) + "\""); };
  if (hex.size() != 64) return bad();
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  digest d{};
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad();
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}

bool is_zero(const digest& d) {
  for (uint8_t b : d)
    if (b) return false;
  return true;
}

digest hash_bytes(std::span<const uint8_t> bytes) {
  hasher h;
  h.update(bytes);
  return h.finish();
}

hasher::hasher() {
  // sodium_init is idempotent and thread-safe. Its failure (no entropy source) leaves BLAKE2b,
  // which needs no randomness, working, so it is not an error here. (g++ does not let a (void)
  // cast discard a warn_unused_result value.)
  if (sodium_init() < 0) {
  }
  crypto_generichash_init(state_of(state_), nullptr, 0, crypto_generichash_BYTES);
}

void hasher::update(std::span<const uint8_t> bytes) { crypto_generichash_update(state_of(state_), bytes.data(), bytes.size()); }

digest hasher::finish() {
  digest d{};
  crypto_generichash_final(state_of(state_), d.data(), d.size());
  crypto_generichash_init(state_of(state_), nullptr, 0, crypto_generichash_BYTES);
  return d;
}

expected<digest> hash_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(error_code::io_error, "cannot read " + path.string() + " to hash it: " + std::strerror(errno));
  hasher h;
  std::vector<char> buf(size_t{1} << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(f.gcount());
    if (n) h.update({reinterpret_cast<const uint8_t*>(buf.data()), n});
  }
  if (f.bad()) return make_error(error_code::io_error, "cannot read " + path.string() + " to hash it: a read failed");
  return h.finish();
}

expected<file_digests> hash_file_chunks(const std::filesystem::path& path, uint32_t chunk) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(error_code::io_error, "cannot read " + path.string() + " to hash it: " + std::strerror(errno));
  if (chunk == 0) return make_error(error_code::invalid_argument, "chunks of 0 bytes");
  file_digests out;
  hasher whole;
  std::vector<char> buf(chunk);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(f.gcount());
    if (n == 0) break;
    const std::span<const uint8_t> bytes{reinterpret_cast<const uint8_t*>(buf.data()), n};
    whole.update(bytes);
    out.chunks.push_back(hash_bytes(bytes));
  }
  if (f.bad()) return make_error(error_code::io_error, "cannot read " + path.string() + " to hash it: a read failed");
  out.whole = whole.finish();
  return out;
}

digest hash_chunk_list(std::span<const digest> chunks) {
  hasher h;
  for (const auto& c : chunks) h.update(c);
  return h.finish();
}

}  // namespace mesh::blobs
