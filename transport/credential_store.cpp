#include "transport/credential_store.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/durable_file.hpp"

namespace mesh::transport {

expected<credential_source> choose_credential_source(const credential_request& r) {
  if (r.open + r.secret_file + r.join > 1) {
    const std::string a = r.open ? "--open" : "--secret-file", b = r.join ? "--join" : "--secret-file";
    return make_error(error_code::invalid_argument, a + " and " + b + " exclude each other: a node belongs to one mesh");
  }
  if (r.open) return credential_source::open;
  if (r.secret_file) return credential_source::secret_file;
  if (r.join) return credential_source::join;
  if (r.stored) return credential_source::stored;
  return credential_source::create;
}

expected<std::optional<mesh_credential>> load_stored_credential(const std::filesystem::path& state_dir) {
  const auto path = state_dir / credential_file_name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<mesh_credential>{};
    return make_error(error_code::io_error, "cannot inspect " + path.string() + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return make_error(error_code::invalid_argument, path.string() + " is not a regular file");
  if (st.st_mode & 077)
    return make_error(error_code::invalid_argument, path.string() + " (the mesh secret) is readable by others: chmod 600 " + path.string());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  if (!f) return make_error(error_code::io_error, "cannot read " + path.string());
  auto c = decode_join_token(text.str());
  if (!c) return make_error(c.error().code, path.string() + ": " + c.error().message);
  return std::optional<mesh_credential>{std::move(*c)};
}

expected<void> store_credential(const std::filesystem::path& state_dir, const mesh_credential& c) {
  return write_text_durably(state_dir / credential_file_name, encode_join_token(c) + "\n", 0600);
}

}  // namespace mesh::transport
