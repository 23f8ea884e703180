// The codec itself: the layout it promises (little-endian, u32 counts, IEEE bits) and the bounds
// it keeps on hostile input (counts past the input, allocation budget, bad bools and enums).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "wire/codec.hpp"
#include "wire/states.hpp"

using namespace mesh;

namespace {
struct sample {
  uint32_t a = 0;
  std::string name;
  std::vector<int64_t> dims;
  peer_health health = peer_health::healthy;
  bool flag = false;
  double x = 0;
  bool operator==(const sample&) const = default;
};
template <class F>
void fields(F& f, sample& s) {
  f(s.a, s.name, s.dims, s.health, s.flag, s.x);
}

sample decode_sample(const std::vector<uint8_t>& bytes, size_t budget, wire::reader* out = nullptr) {
  wire::reader r(bytes.data(), bytes.size(), budget);
  sample s;
  r(s);
  if (out) *out = r;
  return s;
}
}  // namespace

TEST_CASE("the codec lays out integers little-endian and counts as u32", "[wire][codec]") {
  sample s{0x01020304, "hi", {5}, peer_health::dead, true, 0};
  const auto b = wire::encode_values(s);
  const std::vector<uint8_t> expected = {4, 3, 2, 1,                 // a
                                         2, 0, 0, 0, 'h', 'i',       // name
                                         1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0,  // dims
                                         2,                          // health
                                         1,                          // flag
                                         0, 0, 0, 0, 0, 0, 0, 0};    // x
  CHECK(b == expected);
  wire::reader r(b.data(), b.size(), 1 << 20);
  sample back;
  r(back);
  REQUIRE(r.ok());
  CHECK(r.remaining() == 0);
  CHECK(back == s);
}

TEST_CASE("doubles keep their bits: NaN, infinities, subnormals, negative zero", "[wire][codec]") {
  for (double v : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::denorm_min(), -0.0}) {
    sample s;
    s.x = v;
    auto back = decode_sample(wire::encode_values(s), 1 << 20);
    CHECK(std::memcmp(&back.x, &v, sizeof v) == 0);
  }
}

TEST_CASE("hostile input: counts past the input, bad bools and enums, truncation", "[wire][codec]") {
  sample s{1, "abc", {1, 2, 3}, peer_health::suspect, false, 1.5};
  const auto good = wire::encode_values(s);
  SECTION("a string count larger than the input") {
    auto b = good;
    b[4] = 0xff;
    b[7] = 0x7f;
    wire::reader r(b.data(), b.size(), 1 << 20);
    sample x;
    r(x);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == error_code::decode_error);
    CHECK(r.error().message.find("more than the input holds") != std::string::npos);
    CHECK(r.allocated() == 0);
  }
  SECTION("a bool other than 0 or 1") {
    auto b = good;
    b[b.size() - 9] = 2;
    wire::reader r(b.data(), b.size(), 1 << 20);
    sample x;
    r(x);
    CHECK(r.error().message.find("a bool of value 2") != std::string::npos);
  }
  SECTION("an enum out of range") {
    auto b = good;
    b[b.size() - 10] = 9;
    wire::reader r(b.data(), b.size(), 1 << 20);
    sample x;
    r(x);
    CHECK(r.error().message.find("enum value 9 out of range") != std::string::npos);
  }
  SECTION("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) {
      wire::reader r(good.data(), n, 1 << 20);
      sample x;
      r(x);
      CHECK_FALSE(r.ok());
    }
  }
}

TEST_CASE("the allocation budget: charged per element's size in memory, refused past it", "[wire][codec]") {
  std::vector<std::string> names(1000);  // 4 bytes each encoded, sizeof(std::string) in memory
  const auto b = wire::encode_values(names);
  {
    wire::reader r(b.data(), b.size(), 1000 * sizeof(std::string));
    std::vector<std::string> back;
    r(back);
    CHECK(r.ok());
    CHECK(r.allocated() == 1000 * sizeof(std::string));
  }
  {
    wire::reader r(b.data(), b.size(), 1000 * sizeof(std::string) - 1);
    std::vector<std::string> back;
    r(back);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == error_code::limit_exceeded);
  }
  // decode_budget: a fixed multiple of the size plus a little slack, never past the receiver's.
  CHECK(wire::decode_budget(1000, size_t{1} << 40) == 1000 * wire::max_amplification + wire::decode_slack);
  CHECK(wire::decode_budget(size_t{1} << 30, 4096) == 4096);
}
