#pragma once
/// Who may call the API and where it listens: the bearer key check and `HOST:PORT` parsing.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace mesh::serving {

/// Whether an `Authorization` header value is `Bearer <key>`. The comparison takes the same
/// time whatever the header holds (it depends on the key's length only), so that response
/// times do not tell an attacker how much of a guess was right.
bool bearer_matches(std::string_view authorization, std::string_view key);

/// The key in a key file: its content without surrounding whitespace. A missing, unreadable or
/// empty file, or a key with whitespace or control characters inside, is an error naming the
/// file.
expected<std::string> read_key_file(const std::filesystem::path& path);

struct bind_address {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  ///< 0: the system picks one
};

/// `HOST:PORT`, `[v6]:PORT`, or `:PORT` (loopback). A port outside 0..65535 or a missing colon
/// is an error.
expected<bind_address> parse_bind_address(std::string_view text);

}  // namespace mesh::serving
