#include <catch2/catch.hpp>

#include <numeric>

#include "transport/frame.hpp"
#include "transport/varint.hpp"

using namespace mesh::transport;

TEST_CASE("varint encodes the RFC 9000 examples", "[transport][frame]") {
  uint8_t buf[8];
  CHECK(varint_encode(37, buf) == 1);
  CHECK(buf[0] == 0x25);
  CHECK(varint_encode(15293, buf) == 2);
  CHECK((buf[0] == 0x7b && buf[1] == 0xbd));
  CHECK(varint_encode(494878333, buf) == 4);
  CHECK((buf[0] == 0x9d && buf[1] == 0x7f && buf[2] == 0x3e && buf[3] == 0x7d));
  CHECK(varint_encode(151288809941952652ull, buf) == 8);
  size_t used = 0;
  CHECK(varint_decode({buf, 8}, &used) == 151288809941952652ull);
  CHECK(used == 8);
  CHECK_FALSE(varint_decode({buf, 7}, &used));
}

TEST_CASE("frames round-trip in any chunking", "[transport][frame]") {
  frame_limits limits;
  std::vector<uint8_t> stream;
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t n : {0u, 1u, 63u, 64u, 300u, 16384u, 70000u}) {
    std::vector<uint8_t> p(n);
    std::iota(p.begin(), p.end(), static_cast<uint8_t>(n));
    auto f = encode_frame(frame_kind::control, p, limits);
    REQUIRE(f);
    stream.insert(stream.end(), f->begin(), f->end());
    payloads.push_back(std::move(p));
  }
  for (size_t chunk : {1u, 2u, 7u, 1000u, 1u << 20}) {
    frame_decoder d(limits);
    std::vector<frame> out;
    for (size_t i = 0; i < stream.size(); i += chunk) {
      size_t n = std::min(chunk, stream.size() - i);
      REQUIRE(d.feed({stream.data() + i, n}, out));
    }
    CHECK(d.at_boundary());
    REQUIRE(out.size() == payloads.size());
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK(out[i].kind == frame_kind::control);
      CHECK(out[i].payload == payloads[i]);
    }
  }
}

TEST_CASE("per-channel limits are enforced on both ends", "[transport][frame]") {
  frame_limits limits;
  limits.control = 100;
  std::vector<uint8_t> big(101);
  auto e = encode_frame(frame_kind::control, big, limits);
  REQUIRE_FALSE(e);
  CHECK(e.error().code == mesh::error_code::limit_exceeded);
  CHECK(encode_frame(frame_kind::bulk, big, limits));

  // A peer that ignores the limit is caught from the header alone, before the payload arrives.
  frame_limits loose;
  auto f = encode_frame(frame_kind::control, big, loose);
  REQUIRE(f);
  frame_decoder d(limits);
  std::vector<frame> out;
  auto r = d.feed({f->data(), 3}, out);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == mesh::error_code::limit_exceeded);
  CHECK_FALSE(d.feed({f->data() + 3, 1}, out));  // stays failed
}

TEST_CASE("malformed frames are errors, not crashes", "[transport][frame]") {
  frame_limits limits;
  std::vector<frame> out;
  frame_decoder d(limits);
  const uint8_t unknown[] = {0x77, 0x01, 0x00};
  CHECK_FALSE(d.feed(unknown, out));
  CHECK(out.empty());

  // A 2^62-1 bulk length is refused by the limit, not allocated.
  const uint8_t huge[] = {3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  frame_decoder d2(limits);
  CHECK_FALSE(d2.feed(huge, out));

  // A truncated frame is not a boundary: the stream ended mid-frame.
  auto f = encode_frame(frame_kind::control, std::vector<uint8_t>(10, 1), limits);
  frame_decoder d3(limits);
  REQUIRE(d3.feed({f->data(), 5}, out));
  CHECK_FALSE(d3.at_boundary());
  CHECK(out.empty());

  CHECK_FALSE(decode_single_frame({f->data(), 5}, limits));
  auto two = *f;
  two.insert(two.end(), f->begin(), f->end());
  CHECK_FALSE(decode_single_frame(two, limits));
  auto one = decode_single_frame(*f, limits);
  REQUIRE(one);
  CHECK(one->payload.size() == 10);
}
