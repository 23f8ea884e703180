#pragma once
/// Settings shared by meshnode and meshctl: where a node keeps its state, how a mesh secret file
/// is read. Header-only: both programs are single files.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace mesh::app {

/// $XDG_STATE_HOME/meshnode, else ~/.local/state/meshnode, else ./meshnode-state.
inline std::string default_state_dir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME")) return std::string(xdg) + "/meshnode";
  if (const char* home = std::getenv("HOME")) return std::string(home) + "/.local/state/meshnode";
  return "meshnode-state";
}

/// Reads a mesh secret: 32 raw bytes or 64 hex characters, from a file nobody else can read.
inline expected<std::vector<uint8_t>> read_secret(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return make_error(error_code::io_error, "cannot read secret file " + path);
  if (st.st_mode & 077)
    return make_error(error_code::invalid_argument, "secret file " + path + " is readable by others: chmod 600 " + path);
  std::ifstream f(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // 32 raw bytes before trimming: a random secret may end in a byte that looks like white space.
  if (s.size() == 32) return std::vector<uint8_t>(s.begin(), s.end());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.size() == 32) return std::vector<uint8_t>(s.begin(), s.end());
  if (s.size() == 64 && s.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
    std::vector<uint8_t> out;
    for (size_t i = 0; i < 64; i += 2) out.push_back(static_cast<uint8_t>(std::strtoul(s.substr(i, 2).c_str(), nullptr, 16)));
    return out;
  }
  return make_error(error_code::invalid_argument, "secret file " + path + " must hold 32 bytes or 64 hex characters");
}

}  // namespace mesh::app
