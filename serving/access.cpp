#include "serving/access.hpp"

#include <charconv>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace mesh::serving {

bool bearer_matches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view scheme = "Bearer ";
  std::string_view given;
  if (authorization.size() >= scheme.size() && authorization.substr(0, scheme.size()) == scheme)
    given = authorization.substr(scheme.size());
  // Every byte of the key is compared against the guess (or against 0 past its end): the loop's
  // length and work depend on the key alone. The result folds in the length difference.
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(key[i]);
  }
  // Volatile so that the compiler cannot turn the fold into an early exit.
  volatile unsigned result = diff;
  return result == 0 && !key.empty();
}

expected<std::string> read_key_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(error_code::io_error, fmt::format("API key file {}: cannot be read", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return make_error(error_code::invalid_argument, fmt::format("API key file {}: empty", path.string()));
  const auto last = text.find_last_not_of(" \t\r\n");
  std::string key = text.substr(first, last - first + 1);
  for (unsigned char c : key)
    if (c <= 0x20 || c == 0x7f)
      return make_error(error_code::invalid_argument,
                        fmt::format("API key file {}: the key holds whitespace or control characters", path.string()));
  return key;
}

expected<bind_address> parse_bind_address(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos)
    return make_error(error_code::invalid_argument, fmt::format("API address '{}': expected HOST:PORT", text));
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
    return make_error(error_code::invalid_argument, fmt::format("API address '{}': the port must be 0..65535", text));
  bind_address out;
  if (!host.empty()) out.host = std::string(host);
  out.port = static_cast<uint16_t>(value);
  return out;
}

}  // namespace mesh::serving
