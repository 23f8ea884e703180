// The chunk protocol of checkpoint files fetched between nodes: its pure parts (planning, the
// checks of blob_get and blob_chunk, assembly), and a whole fetch between a blob_offers and a
// blob_fetcher whose messages are encoded and decoded on every hop.
#include <catch2/catch.hpp>

#include <deque>
#include <fstream>
#include <thread>
#include <unistd.h>

#include "actors/blob_transfer.hpp"
#include "fetch_link.hpp"
#include "test_ids.hpp"

using namespace mesh;
using namespace mesh::blobs;
using mesh::test::fetch_link;
using mesh::test::over_the_wire;

namespace {

struct temp {
  std::filesystem::path path;
  temp() {
    char tmpl[] = "/tmp/meshnode-chunks-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~temp() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  return v;
}

}  // namespace

TEST_CASE("a blob is cut into consecutive chunks, the last one short", "[blobs][chunks]") {
  CHECK(plan_chunks(0).empty());
  CHECK(plan_chunks(10, 4) == std::vector<byte_range>{{0, 4}, {4, 4}, {8, 2}});
  CHECK(plan_chunks(8, 4) == std::vector<byte_range>{{0, 4}, {4, 4}});
  const auto big = plan_chunks((uint64_t{5} << 30) + 1);
  CHECK(big.size() == 5 * 1024 + 1);
  CHECK(big.back() == byte_range{uint64_t{5} << 30, 1});
}

TEST_CASE("a blob_get is checked against the offered file", "[blobs][chunks]") {
  msg::blob_get g{1, {7}, 0, 100};
  CHECK(check_get(g, 100));
  CHECK_FALSE(check_get(msg::blob_get{1, {}, 0, 100}, 100));  // no blob named
  CHECK_FALSE(check_get(msg::blob_get{1, {7}, 0, 0}, 100));
  CHECK_FALSE(check_get(msg::blob_get{1, {7}, 0, max_chunk_bytes + 1}, uint64_t{1} << 40));
  CHECK_FALSE(check_get(msg::blob_get{1, {7}, 50, 51}, 100));
  CHECK_FALSE(check_get(msg::blob_get{1, {7}, UINT64_MAX, 10}, 100));  // no overflow past the end
  CHECK(check_get(msg::blob_get{1, {7}, 99, 1}, 100));
  CHECK(check_get(g, 100).has_value());
  CHECK_FALSE(check_chunk(msg::blob_chunk{1, true, error_code::internal, "", 0, {}, {}}));
  CHECK(check_chunk(msg::blob_chunk{1, false, error_code::not_found, "no", 0, {}, {}}));
}

TEST_CASE("assembly takes chunks in order, each checked, and the whole against its digest", "[blobs][chunks]") {
  const auto data = pattern(10);
  const auto whole = hash_bytes(data);
  const auto chunk = [&](size_t at, size_t n) { return std::span<const uint8_t>(data.data() + at, n); };
  {
    assembly a(whole, 10);
    REQUIRE(a.accept(0, chunk(0, 4), hash_bytes(chunk(0, 4))));
    // Out of order, a wrong digest, past the end: refused, naming the offset.
    auto skip = a.accept(8, chunk(8, 2), hash_bytes(chunk(8, 2)));
    REQUIRE_FALSE(skip);
    CHECK(skip.error().message.find("offset 8") != std::string::npos);
    auto wrong = a.accept(4, chunk(4, 4), hash_bytes(chunk(0, 4)));
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error().code == error_code::decode_error);
    CHECK_FALSE(a.finish());  // incomplete
    REQUIRE(a.accept(4, chunk(4, 4), hash_bytes(chunk(4, 4))));
    CHECK_FALSE(a.accept(8, std::span<const uint8_t>(data.data() + 4, 6), hash_bytes(chunk(4, 6))));
    REQUIRE(a.accept(8, chunk(8, 2), hash_bytes(chunk(8, 2))));
    CHECK(a.complete());
    CHECK(a.finish());
  }
  {
    // Chunks each consistent with their own digest, but not the file announced: the sender
    // changed the file, or lied. Caught at the end.
    auto other = data;
    other[5] ^= 1;
    assembly a(whole, 10);
    REQUIRE(a.accept(0, std::span<const uint8_t>(other), hash_bytes(other)));
    auto f = a.finish();
    REQUIRE_FALSE(f);
    CHECK(f.error().message.find(to_hex(whole)) != std::string::npos);
  }
}


TEST_CASE("a file is fetched in chunks into the store, verified, and not fetched again", "[blobs][chunks]") {
  temp t;
  const auto data = pattern(3 * chunk_bytes + 12345);  // several chunks, more than the window's worth of the tail
  const auto file = t.path / "model.gguf";
  {
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  fetch_link l;
  auto offer = l.offers.offer(file.string());
  REQUIRE(offer);
  CHECK(offer->id == hash_bytes(data));
  CHECK(offer->size == data.size());
  auto store = blob_store::open(t.path / "blobs", uint64_t{64} << 20).value();

  auto got = l.fetcher->fetch(l.srv, *offer, *store);
  REQUIRE(got);
  CHECK(*got == data.size());
  CHECK(l.fetcher->fetched_bytes() == data.size());
  CHECK(l.offers.served_bytes() == data.size());
  auto held = store->get(offer->id);
  REQUIRE(held);
  CHECK(std::filesystem::file_size(held->path) == data.size());

  // Only offered blobs are served: a digest nobody offered is not found, naming the node.
  auto none = l.offers.serve(msg::blob_get{9, {1, 2, 3}, 0, 10});
  CHECK_FALSE(none.ok);
  CHECK(none.code == error_code::not_found);
  CHECK(none.error.find("node srv") != std::string::npos);
}

TEST_CASE("a fetch with a corrupted chunk fails naming the blob and leaves nothing in the store", "[blobs][chunks]") {
  temp t;
  const auto data = pattern(2 * chunk_bytes + 7);
  const auto file = t.path / "model.gguf";
  {
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  fetch_link l;
  l.tamper = [](msg::blob_chunk& c) {
    if (c.offset == chunk_bytes && !c.bytes.empty()) c.bytes[17] ^= 0x40;  // flipped in transit
  };
  auto offer = l.offers.offer(file.string()).value();
  auto store = blob_store::open(t.path / "blobs", uint64_t{64} << 20).value();
  auto got = l.fetcher->fetch(l.srv, offer, *store);
  REQUIRE_FALSE(got);
  CHECK(got.error().code == error_code::decode_error);
  CHECK(got.error().message.find(to_hex(offer.id)) != std::string::npos);
  CHECK(got.error().message.find("offset " + std::to_string(chunk_bytes)) != std::string::npos);
  CHECK_FALSE(store->contains(offer.id));
  CHECK(store->bytes() == 0);
  CHECK(std::distance(std::filesystem::directory_iterator(t.path / "blobs"), {}) == 0);

  // A peer that is gone: the fetch fails at once, naming it.
  l.tamper = nullptr;
  l.connected = false;
  auto gone = l.fetcher->fetch(l.srv, offer, *store);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().code == error_code::unavailable);
  CHECK(gone.error().message.find("not connected") != std::string::npos);
}

TEST_CASE("only the chunks asked for are fetched, each checked against the chunk list the open named", "[blobs][chunks][partial]") {
  temp t;
  const auto data = pattern(5 * chunk_bytes + 999);
  const auto file = t.path / "model.gguf";
  {
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  // The chunk list: the digests of the 1 MiB chunks, in one read with the whole digest.
  auto digests = hash_file_chunks(file, chunk_bytes);
  REQUIRE(digests);
  CHECK(digests->whole == hash_bytes(data));
  REQUIRE(digests->chunks.size() == 6);
  CHECK(digests->chunks[5] == hash_bytes(std::span<const uint8_t>(data).subspan(5 * chunk_bytes)));

  fetch_link l;
  auto offer = l.offers.offer(file.string()).value();
  CHECK(offer.chunk_list == hash_chunk_list(digests->chunks));
  auto store = blob_store::open(t.path / "blobs", uint64_t{64} << 20).value();
  auto list = l.fetcher->fetch_chunk_list(l.srv, offer);
  REQUIRE(list);
  CHECK(*list == digests->chunks);
  REQUIRE(store->open_partial(offer.id, offer.size, *list));
  auto got = l.fetcher->fetch_chunks(l.srv, offer, {1, 5}, *store);
  REQUIRE(got);
  CHECK(*got == chunk_bytes + 999);
  CHECK(l.offers.served_bytes() == chunk_bytes + 999);  // the list came from memory, the file's other chunks stayed
  CHECK(store->missing(offer.id, {0, 1, 5}) == std::vector<uint64_t>{0});
  REQUIRE(store->get_chunks(offer.id, {1, 5}));

  // A chunk list that is not the one the open named (another file's) is refused.
  offered other = offer;
  other.chunk_list[0] ^= 1;
  auto refused = l.fetcher->fetch_chunk_list(l.srv, other);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("not the " + to_hex(other.chunk_list)) != std::string::npos);
  // A chunk changed in transit is refused by the store and not kept.
  l.tamper = [](msg::blob_chunk& c) {
    if (!c.bytes.empty()) c.bytes[3] ^= 1;
  };
  auto bad = l.fetcher->fetch_chunks(l.srv, offer, {2}, *store);
  REQUIRE_FALSE(bad);
  CHECK(store->missing(offer.id, {2}) == std::vector<uint64_t>{2});
}
