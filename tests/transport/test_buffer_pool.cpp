#include <catch2/catch.hpp>

#include <numeric>
#include <thread>

#include "transport/buffer_pool.hpp"
#include "transport/frame.hpp"

using namespace mesh::transport;

namespace {
std::vector<uint8_t> with_capacity(size_t n) {
  std::vector<uint8_t> b;
  b.reserve(n);
  return b;
}
}  // namespace

TEST_CASE("buffer_pool lends back a buffer of fitting size", "[transport][buffer_pool]") {
  buffer_pool pool(4, 64u << 20, 1u << 20);
  auto b = with_capacity(8u << 20);
  b.resize(1000, 7);
  const uint8_t* memory = b.data();
  pool.give(std::move(b));
  CHECK(pool.buffers() == 1);
  CHECK(pool.bytes() >= (8u << 20));
  SECTION("too large a request gets nothing") { CHECK(pool.take(9u << 20).capacity() == 0); }
  SECTION("a request under half its size gets nothing: it would pin memory") { CHECK(pool.take(3u << 20).capacity() == 0); }
  SECTION("a fitting request gets the same memory, emptied") {
    auto got = pool.take(5u << 20);
    CHECK(got.data() == memory);
    CHECK(got.empty());
    CHECK(pool.buffers() == 0);
    CHECK(pool.bytes() == 0);
  }
}

TEST_CASE("buffer_pool keeps its bounds", "[transport][buffer_pool]") {
  buffer_pool pool(2, 20u << 20, 1u << 20);
  pool.give(with_capacity(1000));  // small: not kept
  CHECK(pool.buffers() == 0);
  pool.give(with_capacity(30u << 20));  // above the byte bound alone: not kept
  CHECK(pool.buffers() == 0);
  pool.give(with_capacity(4u << 20));
  pool.give(with_capacity(6u << 20));
  pool.give(with_capacity(2u << 20));  // full (2 buffers) and smaller than every kept one: dropped
  CHECK(pool.buffers() == 2);
  CHECK(pool.bytes() == (10u << 20));
  pool.give(with_capacity(12u << 20));  // evicts the smallest (4 MiB): 6 + 12 fit in 20 MiB
  CHECK(pool.buffers() == 2);
  CHECK(pool.take(4u << 20).capacity() >= (6u << 20));
  CHECK(pool.take(12u << 20).capacity() >= (12u << 20));
  CHECK(pool.bytes() == 0);
}

TEST_CASE("frame_decoder receives a large payload into a pooled buffer", "[transport][buffer_pool]") {
  frame_limits limits;
  buffer_pool pool;
  std::vector<uint8_t> payload(3u << 20);
  std::iota(payload.begin(), payload.end(), uint8_t{5});
  auto header = encode_frame_header(frame_kind::bulk, payload.size(), limits);
  REQUIRE(header);
  auto lent = with_capacity(4u << 20);
  const uint8_t* memory = lent.data();
  pool.give(std::move(lent));

  frame_decoder d(limits, payload.size(), &pool);
  std::vector<frame> out;
  REQUIRE(d.feed(header->view(), out));
  for (size_t i = 0; i < payload.size(); i += 100000)
    REQUIRE(d.feed({payload.data() + i, std::min<size_t>(100000, payload.size() - i)}, out));
  REQUIRE(out.size() == 1);
  CHECK(out[0].payload == payload);
  CHECK(out[0].payload.data() == memory);
  CHECK(pool.buffers() == 0);

  SECTION("a decoder that may not reserve the whole payload (an unadmitted peer) does not borrow") {
    pool.give(std::move(out[0].payload));
    frame_decoder cautious(limits, 1u << 20, &pool);
    std::vector<frame> out2;
    REQUIRE(cautious.feed(header->view(), out2));
    REQUIRE(cautious.feed(payload, out2));
    REQUIRE(out2.size() == 1);
    CHECK(out2[0].payload == payload);
    CHECK(pool.buffers() == 1);
  }
}

TEST_CASE("buffer_pool frees buffers not reused in time", "[transport][buffer_pool]") {
  buffer_pool pool(4, 64u << 20, 1u << 20);
  pool.give(with_capacity(2u << 20));
  const auto between = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  pool.give(with_capacity(3u << 20));
  pool.release_older_than(between);  // the first is older than the cutoff, the second is not
  CHECK(pool.buffers() == 1);
  CHECK(pool.bytes() == (3u << 20));
  CHECK(pool.take(2u << 20).capacity() == (3u << 20));
  pool.give(with_capacity(2u << 20));
  pool.release_older_than(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  CHECK(pool.buffers() == 0);
  CHECK(pool.bytes() == 0);
}
