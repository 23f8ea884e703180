#pragma once
/// Settings shared by meshnode and meshctl: where a node keeps its state, how a mesh secret file
/// is read. Header-only: both programs are single files.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "transport/credential_store.hpp"
#include "transport/state_dir.hpp"

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

/// The credential a node starts with, and where it came from (for the start-up log line).
struct node_credential {
  transport::mesh_credential credential;
  transport::credential_source source = transport::credential_source::create;
};

/// Chooses and, where needed, keeps the credential of a node whose state directory is
/// `state_dir`: --open, --secret-file, --join TOKEN (kept for later starts), the token kept by an
/// earlier start, or a new mesh (its token kept). Prepares the state directory first.
inline expected<node_credential> resolve_node_credential(const std::string& state_dir, bool open, const std::string& secret_file,
                                                         const std::string& join_token) {
  if (auto ok = transport::prepare_state_dir(state_dir); !ok) return tl::unexpected(ok.error());
  auto stored = transport::load_stored_credential(state_dir);
  // An unreadable or damaged stored token matters only when it would be used: an explicit
  // --join replaces it, --open and --secret-file ignore it.
  const bool explicit_choice = open || !secret_file.empty() || !join_token.empty();
  if (!stored && !explicit_choice) return tl::unexpected(stored.error());
  const bool has_stored = stored && stored->has_value();
  auto source = transport::choose_credential_source({open, !secret_file.empty(), !join_token.empty(), has_stored});
  if (!source) return tl::unexpected(source.error());
  node_credential out;
  out.source = *source;
  switch (*source) {
    case transport::credential_source::open: out.credential = transport::open_credential(); break;
    case transport::credential_source::secret_file: {
      auto s = read_secret(secret_file);
      if (!s) return tl::unexpected(s.error());
      out.credential = transport::credential_from_secret(std::move(*s));
      break;
    }
    case transport::credential_source::join: {
      auto c = transport::decode_join_token(join_token);
      if (!c) return make_error(c.error().code, "--join: " + c.error().message);
      if (auto kept = transport::store_credential(state_dir, *c); !kept) return tl::unexpected(kept.error());
      out.credential = std::move(*c);
      break;
    }
    case transport::credential_source::stored: out.credential = std::move(**stored); break;
    case transport::credential_source::create: {
      out.credential = transport::new_mesh_credential();
      if (auto kept = transport::store_credential(state_dir, out.credential); !kept) return tl::unexpected(kept.error());
      break;
    }
  }
  return out;
}

}  // namespace mesh::app
