#include "base/node_id.hpp"

namespace mesh {

namespace {
constexpr char hex_digits[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string node_id::to_string() const {
  std::string out;
  out.reserve(64);
  for (uint8_t b : key) {
    out.push_back(hex_digits[b >> 4]);
    out.push_back(hex_digits[b & 15]);
  }
  return out;
}

std::string node_id::short_string() const { return to_string().substr(0, 8); }

expected<node_id> node_id::parse(std::string_view text) {
  if (text.size() != 64)
    return make_error(error_code::decode_error,
                      "node id must be 64 hex digits, got " + std::to_string(text.size()) + " characters");
  node_id id;
  for (size_t i = 0; i < 32; ++i) {
    int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return make_error(error_code::decode_error, "node id contains a non-hex character");
    id.key[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return id;
}

}  // namespace mesh
