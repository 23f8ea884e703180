// Join tokens (outside input: what a person types) and where a node keeps its credential.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "transport/credential_store.hpp"
#include "transport/join_token.hpp"
#include "transport/mesh_id.hpp"
#include "transport/state_dir.hpp"

using namespace mesh;
using namespace mesh::transport;

namespace {

/// A fresh temporary folder, removed at the end.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/meshnode-token-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

mode_t mode_of(const std::filesystem::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

}  // namespace

TEST_CASE("a join token round-trips a new credential", "[transport][token]") {
  const auto c = new_mesh_credential();
  CHECK(c.secret.size() == mesh_secret_size);
  CHECK(c.mesh_id.size() == 2 * mesh_id_bytes);
  const auto token = encode_join_token(c);
  CHECK(token.size() == join_token_size);
  CHECK(token.rfind("mesh1.", 0) == 0);
  auto back = decode_join_token(token);
  REQUIRE(back);
  CHECK(*back == c);
  // Pasted with a line end and in upper case: still the same mesh.
  std::string upper = token;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  upper.replace(0, 4, "mesh");
  auto again = decode_join_token("  " + upper + "\r\n");
  REQUIRE(again);
  CHECK(*again == c);
}

TEST_CASE("new meshes differ, and their id says nothing about their secret", "[transport][token]") {
  const auto a = new_mesh_credential(), b = new_mesh_credential();
  CHECK(a.mesh_id != b.mesh_id);
  CHECK(a.secret != b.secret);
  // The published id of a created mesh is random: not the (guessable) derivation of its secret.
  CHECK(a.mesh_id != mesh_id_of(a.secret));
}

TEST_CASE("a mistyped join token is refused with an error that says what is wrong", "[transport][token]") {
  const auto token = encode_join_token(new_mesh_credential());
  const auto error_of = [](const std::string& t) {
    auto r = decode_join_token(t);
    REQUIRE_FALSE(r);
    return r.error();
  };
  CHECK_THAT(error_of("").message, Catch::Contains("empty"));
  CHECK_THAT(error_of("hello").message, Catch::Contains("not a meshnode join token"));
  CHECK_THAT(error_of("meshX.abc").message, Catch::Contains("no version"));
  auto newer = error_of("mesh2" + token.substr(5));
  CHECK(newer.code == error_code::version_mismatch);
  CHECK_THAT(newer.message, Catch::Contains("version 2"));
  CHECK_THAT(error_of(token.substr(0, token.size() - 1)).message, Catch::Contains("truncated"));
  CHECK_THAT(error_of(token + "0").message, Catch::Contains("characters"));
  std::string bad_char = token;
  bad_char[10] = 'g';
  CHECK_THAT(error_of(bad_char).message, Catch::Contains("character 11") && Catch::Contains("mesh id"));
  std::string bad_dot = token;
  bad_dot[38] = '-';
  CHECK_THAT(error_of(bad_dot).message, Catch::Contains("dots"));
  // One digit changed in the secret: every field still parses, only the checksum catches it.
  std::string typo = token;
  typo[50] = typo[50] == '0' ? '1' : '0';
  const auto e = error_of(typo);
  CHECK(e.code == error_code::decode_error);
  CHECK_THAT(e.message, Catch::Contains("checksum"));
  // Two characters swapped, the commonest slip of a hand copying a token.
  std::string swapped = token;
  std::swap(swapped[40], swapped[41]);
  if (swapped != token) CHECK_THAT(error_of(swapped).message, Catch::Contains("checksum"));
}

TEST_CASE("the credential's source: explicit flags first, then the kept token, else a new mesh", "[transport][token]") {
  CHECK(*choose_credential_source({}) == credential_source::create);
  CHECK(*choose_credential_source({.open = false, .secret_file = false, .join = false, .stored = true}) == credential_source::stored);
  CHECK(*choose_credential_source({.open = false, .secret_file = false, .join = true, .stored = true}) == credential_source::join);
  CHECK(*choose_credential_source({.open = false, .secret_file = true, .join = false, .stored = true}) == credential_source::secret_file);
  CHECK(*choose_credential_source({.open = true, .secret_file = false, .join = false, .stored = true}) == credential_source::open);
  auto both = choose_credential_source({.open = true, .secret_file = false, .join = true, .stored = false});
  REQUIRE_FALSE(both);
  CHECK_THAT(both.error().message, Catch::Contains("--open and --join"));
  CHECK_FALSE(choose_credential_source({.open = false, .secret_file = true, .join = true, .stored = false}));
}

TEST_CASE("a kept credential is private to the owner and read back", "[transport][token]") {
  temp_dir tmp;
  auto none = load_stored_credential(tmp.path);
  REQUIRE(none);
  CHECK_FALSE(none->has_value());
  const auto c = new_mesh_credential();
  REQUIRE(store_credential(tmp.path, c));
  CHECK(mode_of(tmp.path / credential_file_name) == 0600);
  auto back = load_stored_credential(tmp.path);
  REQUIRE(back);
  REQUIRE(back->has_value());
  CHECK(**back == c);
  ::chmod((tmp.path / credential_file_name).c_str(), 0644);
  auto exposed = load_stored_credential(tmp.path);
  REQUIRE_FALSE(exposed);
  CHECK_THAT(exposed.error().message, Catch::Contains("chmod 600"));
}

TEST_CASE("the state directory is made 0700 and a symlink is refused", "[transport][token]") {
  temp_dir tmp;
  const auto dir = tmp.path / "deep" / "state";
  REQUIRE(prepare_state_dir(dir));
  CHECK(mode_of(dir) == 0700);
  REQUIRE(prepare_state_dir(dir));  // an existing one is fine
  std::filesystem::create_directory_symlink(dir, tmp.path / "link");
  auto linked = prepare_state_dir(tmp.path / "link");
  REQUIRE_FALSE(linked);
  CHECK_THAT(linked.error().message, Catch::Contains("symbolic link"));
  ::chmod(dir.c_str(), 0777);
  auto shared = prepare_state_dir(dir);
  REQUIRE_FALSE(shared);
  CHECK_THAT(shared.error().message, Catch::Contains("chmod 700"));
  std::ofstream(tmp.path / "file") << "x";
  CHECK_FALSE(prepare_state_dir(tmp.path / "file"));
}

TEST_CASE("a secret file's mesh id is the same on every node and not the open mesh's", "[transport][token]") {
  const std::vector<uint8_t> s(32, 9);
  const auto a = credential_from_secret(s);
  CHECK(a.mesh_id == credential_from_secret(s).mesh_id);
  CHECK(a.mesh_id.size() == 32);
  CHECK(a.mesh_id != open_credential().mesh_id);
  CHECK(open_credential().open());
}
