// The bearer key check, key files and HOST:PORT.
#include <catch2/catch.hpp>

#include <fstream>

#include "checkpoint_writer.hpp"
#include "serving/access.hpp"

using namespace mesh::serving;

TEST_CASE("bearer keys: only the exact key in the Bearer scheme passes", "[serving][access]") {
  CHECK(bearer_matches("Bearer sk-123", "sk-123"));
  CHECK_FALSE(bearer_matches("Bearer sk-124", "sk-123"));
  CHECK_FALSE(bearer_matches("Bearer sk-12", "sk-123"));
  CHECK_FALSE(bearer_matches("Bearer sk-1234", "sk-123"));
  CHECK_FALSE(bearer_matches("bearer sk-123", "sk-123"));
  CHECK_FALSE(bearer_matches("sk-123", "sk-123"));
  CHECK_FALSE(bearer_matches("", "sk-123"));
  CHECK_FALSE(bearer_matches("Bearer ", ""));  // an empty key never matches
}

TEST_CASE("key files and bind addresses", "[serving][access]") {
  mesh::models::test::temp_dir dir;
  mesh::models::test::write_file(dir / "key", std::string("  sk-abc\n"));
  auto k = read_key_file(dir / "key");
  REQUIRE(k);
  CHECK(*k == "sk-abc");
  mesh::models::test::write_file(dir / "empty", std::string("\n"));
  CHECK_FALSE(read_key_file(dir / "empty"));
  mesh::models::test::write_file(dir / "two", std::string("a b"));
  CHECK_FALSE(read_key_file(dir / "two"));
  auto missing = read_key_file(dir / "none");
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().message, Catch::Contains("none"));

  auto a = parse_bind_address("0.0.0.0:8080");
  REQUIRE(a);
  CHECK(a->host == "0.0.0.0");
  CHECK(a->port == 8080);
  auto l = parse_bind_address(":0");
  REQUIRE(l);
  CHECK(l->host == "127.0.0.1");
  auto v6 = parse_bind_address("[::1]:9");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
  CHECK_FALSE(parse_bind_address("localhost"));
  CHECK_FALSE(parse_bind_address("h:65536"));
  CHECK_FALSE(parse_bind_address("h:"));
  CHECK_FALSE(parse_bind_address("h:8x"));
}
