#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "transport/identity.hpp"
#include "transport/mesh_id.hpp"

using namespace mesh::transport;
using mesh::node_id;
namespace fs = std::filesystem;

namespace {
struct temp_dir {
  fs::path path;
  temp_dir() {
    char tmpl[] = "/tmp/mesh-identity-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { fs::remove_all(path); }
};
}  // namespace

TEST_CASE("identity is created with mode 0600 and reloads to the same id", "[transport][identity]") {
  temp_dir d;
  auto state = d.path / "state";
  auto a = identity::load_or_create(state);
  REQUIRE(a);
  struct stat st {};
  REQUIRE(::stat((state / identity_file_name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto b = identity::load_or_create(state);
  REQUIRE(b);
  CHECK(a->id() == b->id());
  CHECK(a->seed() == b->seed());
  auto other = identity::generate();
  CHECK(other.id() != a->id());
}

TEST_CASE("identity refuses a key file others can read", "[transport][identity]") {
  temp_dir d;
  REQUIRE(identity::load_or_create(d.path));
  REQUIRE(::chmod((d.path / identity_file_name).c_str(), 0644) == 0);
  auto r = identity::load_or_create(d.path);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == mesh::error_code::invalid_argument);
  CHECK(r.error().message.find("chmod 600") != std::string::npos);
}

TEST_CASE("identity reports a corrupt key file", "[transport][identity]") {
  temp_dir d;
  auto first = identity::load_or_create(d.path);
  REQUIRE(first);
  auto key = d.path / identity_file_name;
  SECTION("truncated") {
    fs::resize_file(key, 20);
  }
  SECTION("bit flip in the seed") {
    // Invert a byte rather than write a constant: a random seed may already hold the constant.
    std::fstream f(key, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(12);
    const char c = static_cast<char>(f.get());
    f.seekp(12);
    f.put(static_cast<char>(~c));
  }
  auto r = identity::load_or_create(d.path);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == mesh::error_code::decode_error);
  CHECK(r.error().message.find("corrupt") != std::string::npos);
}

TEST_CASE("node id round-trips through its text form", "[transport][identity]") {
  auto id = identity::generate().id();
  auto text = id.to_string();
  CHECK(text.size() == 64);
  CHECK(id.short_string() == text.substr(0, 8));
  auto parsed = node_id::parse(text);
  REQUIRE(parsed);
  CHECK(*parsed == id);
  CHECK_FALSE(node_id::parse("abc"));
  CHECK_FALSE(node_id::parse(std::string(63, 'a') + "g"));
}

TEST_CASE("identity from a seed is deterministic", "[transport][identity]") {
  std::array<uint8_t, 32> seed{};
  seed[0] = 7;
  CHECK(identity::from_seed(seed).id() == identity::from_seed(seed).id());
  auto sk = identity::from_seed(seed).secret_key();
  CHECK(std::equal(sk.begin() + 32, sk.end(), identity::from_seed(seed).public_key().begin()));
}

TEST_CASE("mesh id hides the secret and separates meshes", "[transport][identity]") {
  std::vector<uint8_t> s1(32, 1), s2(32, 2);
  auto a = mesh_id_of(s1);
  CHECK(a.size() == 32);
  CHECK(a == mesh_id_of(s1));
  CHECK(a != mesh_id_of(s2));
  CHECK(mesh_id_of({}) != a);
  CHECK(a.find("0101010101") == std::string::npos);
}
