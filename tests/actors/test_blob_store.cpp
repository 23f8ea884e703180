// The blob store: content-addressed, written durably, verified on every read, bounded with the
// least recently used blob evicted first and a blob in use never evicted.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <unistd.h>

#include "actors/blob_store.hpp"

using namespace mesh;
using namespace mesh::blobs;

namespace {

struct temp {
  std::filesystem::path path;
  temp() {
    char tmpl[] = "/tmp/meshnode-blobs-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~temp() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::vector<uint8_t> bytes_of(char c, size_t n) { return std::vector<uint8_t>(n, static_cast<uint8_t>(c)); }

}  // namespace

TEST_CASE("digests are BLAKE2b-256 in hex and parse back", "[blobs]") {
  // The BLAKE2b-256 of "abc" (RFC 7693's parameters with a 32-byte output).
  const std::string abc = "abc";
  const auto d = hash_bytes({reinterpret_cast<const uint8_t*>(abc.data()), abc.size()});
  CHECK(to_hex(d) == "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  CHECK(parse_digest(to_hex(d)).value() == d);
  CHECK_FALSE(parse_digest("xyz"));
  CHECK_FALSE(parse_digest(std::string(64, 'g')));
  hasher h;
  h.update({reinterpret_cast<const uint8_t*>("a"), 1});
  h.update({reinterpret_cast<const uint8_t*>("bc"), 2});
  CHECK(h.finish() == d);
  CHECK(is_zero(digest{}));
  CHECK_FALSE(is_zero(d));
}

TEST_CASE("a blob put is found by its digest, verified, and survives reopening the store", "[blobs]") {
  temp t;
  auto s = blob_store::open(t.path / "blobs", 1 << 20).value();
  const auto data = bytes_of('x', 1000);
  auto put = s->put(data);
  REQUIRE(put);
  const auto d = hash_bytes(data);
  CHECK(put->path == t.path / "blobs" / to_hex(d));
  CHECK(s->bytes() == 1000);
  put->in_use.reset();
  auto got = s->get(d);
  REQUIRE(got);
  std::ifstream f(got->path, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(f), {}) == std::string(1000, 'x'));
  CHECK(s->get(hash_bytes(bytes_of('y', 3))).error().code == error_code::not_found);

  got->in_use.reset();
  s.reset();
  // A leftover of an interrupted fetch is removed at open; the blob stays.
  std::ofstream(t.path / "blobs" / (to_hex(d) + ".part")) << "half";
  auto again = blob_store::open(t.path / "blobs", 1 << 20).value();
  CHECK(again->contains(d));
  CHECK(again->bytes() == 1000);
  CHECK_FALSE(std::filesystem::exists(t.path / "blobs" / (to_hex(d) + ".part")));
}

TEST_CASE("a blob with a flipped byte is detected on read and dropped", "[blobs]") {
  temp t;
  auto s = blob_store::open(t.path / "blobs", 1 << 20).value();
  const auto data = bytes_of('q', 4096);
  const auto path = s->put(data).value().path;
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1234);
    f.put('r');
  }
  auto got = s->get(hash_bytes(data));
  REQUIRE_FALSE(got);
  CHECK(got.error().code == error_code::decode_error);
  CHECK(got.error().message.find("is corrupt") != std::string::npos);
  CHECK(got.error().message.find(to_hex(hash_bytes(data))) != std::string::npos);
  CHECK_FALSE(s->contains(hash_bytes(data)));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(s->bytes() == 0);
}

TEST_CASE("the least recently used blob is evicted first, never one in use", "[blobs]") {
  temp t;
  auto s = blob_store::open(t.path / "blobs", 3000).value();
  const auto a = bytes_of('a', 1000), b = bytes_of('b', 1000), c = bytes_of('c', 1000), d = bytes_of('d', 1000);
  REQUIRE(s->put(a));
  REQUIRE(s->put(b));
  REQUIRE(s->put(c));
  CHECK(s->by_last_use() == std::vector<digest>{hash_bytes(a), hash_bytes(b), hash_bytes(c)});
  // Reading a makes b the oldest; keeping a's pin makes it unevictable anyway.
  auto held_a = s->get(hash_bytes(a)).value();
  CHECK(s->by_last_use() == std::vector<digest>{hash_bytes(b), hash_bytes(c), hash_bytes(a)});
  REQUIRE(s->put(d));
  CHECK_FALSE(s->contains(hash_bytes(b)));
  CHECK(s->by_last_use() == std::vector<digest>{hash_bytes(c), hash_bytes(a), hash_bytes(d)});
  CHECK(s->bytes() == 3000);

  // With a, c and d all in use there is no room: an error naming the bound, nothing evicted.
  auto held_c = s->get(hash_bytes(c)).value();
  auto held_d = s->get(hash_bytes(d)).value();
  auto e = s->put(bytes_of('e', 1000));
  REQUIRE_FALSE(e);
  CHECK(e.error().code == error_code::limit_exceeded);
  CHECK(e.error().message.find("--blob-cache-bytes") != std::string::npos);
  CHECK(s->bytes() == 3000);
  // Released, the oldest of them goes.
  held_c.in_use.reset();
  REQUIRE(s->put(bytes_of('e', 1000)));
  CHECK_FALSE(s->contains(hash_bytes(c)));
  // A blob larger than the bound never fits.
  CHECK(s->put(bytes_of('f', 4000)).error().code == error_code::limit_exceeded);
}

TEST_CASE("a staged blob is committed whole or discarded", "[blobs]") {
  temp t;
  auto s = blob_store::open(t.path / "blobs", 2500).value();
  const auto data = bytes_of('s', 2000);
  const auto d = hash_bytes(data);
  auto part = s->stage(d, data.size()).value();
  // The reservation counts: another blob of 1000 bytes does not fit while this one is written.
  CHECK(s->put(bytes_of('o', 1000)).error().code == error_code::limit_exceeded);
  {
    std::ofstream f(part, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), 1999);
  }
  CHECK(s->commit(d).error().code == error_code::invalid_argument);  // a byte short
  CHECK_FALSE(std::filesystem::exists(part));
  part = s->stage(d, data.size()).value();
  {
    std::ofstream f(part, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), 2000);
  }
  REQUIRE(s->commit(d));
  CHECK(s->get(d));
  CHECK(s->bytes() == 2000);
}

namespace {

/// A file of `chunks` chunks (the last `tail` bytes long), each a different byte, and its chunk list.
struct chunked {
  std::vector<uint8_t> bytes;
  std::vector<digest> list;
  digest whole{};
  chunked(size_t chunks, size_t tail) {
    for (size_t i = 0; i < chunks; ++i) {
      const auto piece = bytes_of(static_cast<char>('a' + i), i + 1 == chunks ? tail : size_t{chunk_size});
      list.push_back(hash_bytes(piece));
      bytes.insert(bytes.end(), piece.begin(), piece.end());
    }
    whole = hash_bytes(bytes);
  }
  std::span<const uint8_t> chunk(size_t i) const {
    const size_t at = i * chunk_size;
    return std::span<const uint8_t>(bytes).subspan(at, std::min<size_t>(chunk_size, bytes.size() - at));
  }
  static constexpr size_t chunk_size = size_t{1} << 20;
};

}  // namespace

TEST_CASE("a partial blob holds the chunks put into it, each checked, and survives reopening the store", "[blobs][partial]") {
  temp t;
  const chunked file(4, 1000);
  auto s = blob_store::open(t.path / "blobs", 64 << 20).value();
  CHECK_FALSE(s->open_partial(file.whole, file.bytes.size(), {file.list[0]}));  // a list of another length
  REQUIRE(s->open_partial(file.whole, file.bytes.size(), file.list));
  CHECK(s->chunk_list_of(file.whole) == file.list);
  CHECK_FALSE(s->contains(file.whole));  // only whole blobs are "contained"
  CHECK(s->missing(file.whole, {0, 2, 3}) == std::vector<uint64_t>{0, 2, 3});
  // A chunk that does not hash to its digest, or is of the wrong size, is refused.
  auto wrong = s->put_chunk(file.whole, 2, file.chunk(1));
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().message.find("chunk 2 hashes to") != std::string::npos);
  CHECK_FALSE(s->put_chunk(file.whole, 3, file.chunk(2)));
  REQUIRE(s->put_chunk(file.whole, 2, file.chunk(2)));
  REQUIRE(s->put_chunk(file.whole, 3, file.chunk(3)));
  REQUIRE(s->sync_partial(file.whole));
  CHECK(s->bytes() == chunked::chunk_size + 1000);  // what is here, not the file's size
  CHECK(s->missing(file.whole, {0, 2, 3}) == std::vector<uint64_t>{0});
  CHECK(s->get_chunks(file.whole, {0, 2}).error().code == error_code::not_found);
  {
    auto held = s->get_chunks(file.whole, {2, 3});
    REQUIRE(held);
    CHECK(std::filesystem::file_size(held->path) == file.bytes.size());  // sparse: the whole size
    std::ifstream f(held->path, std::ios::binary);
    std::vector<char> back(file.bytes.size());
    f.read(back.data(), static_cast<std::streamsize>(back.size()));
    CHECK(std::equal(file.chunk(2).begin(), file.chunk(2).end(), reinterpret_cast<const uint8_t*>(back.data()) + 2 * chunked::chunk_size));
  }
  s.reset();
  // Reopened: the same chunks, the same bytes counted.
  auto again = blob_store::open(t.path / "blobs", 64 << 20).value();
  CHECK(again->bytes() == chunked::chunk_size + 1000);
  CHECK(again->missing(file.whole, {0, 1, 2, 3}) == std::vector<uint64_t>{0, 1});
  REQUIRE(again->get_chunks(file.whole, {2, 3}));
  // A chunk changed on disk is found when read, and dropped from the blob.
  {
    std::fstream f(t.path / "blobs" / (to_hex(file.whole) + ".sparse"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(3 * chunked::chunk_size + 10));
    f.put('!');
  }
  auto bad = again->get_chunks(file.whole, {3});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == error_code::decode_error);
  CHECK(bad.error().message.find("corrupt chunk 3") != std::string::npos);
  CHECK(again->missing(file.whole, {2, 3}) == std::vector<uint64_t>{3});
  // The whole blob, once committed, replaces the part.
  const auto sparse = t.path / "blobs" / (to_hex(file.whole) + ".sparse"), record = t.path / "blobs" / (to_hex(file.whole) + ".chunks");
  std::filesystem::copy_file(sparse, t.path / "sparse.kept");
  std::filesystem::copy_file(record, t.path / "record.kept");
  auto part = again->stage(file.whole, file.bytes.size());
  REQUIRE(part);
  {
    std::ofstream f(*part, std::ios::binary);
    f.write(reinterpret_cast<const char*>(file.bytes.data()), static_cast<std::streamsize>(file.bytes.size()));
  }
  REQUIRE(again->commit(file.whole));
  CHECK(again->contains(file.whole));
  CHECK(again->chunk_list_of(file.whole).empty());
  CHECK_FALSE(std::filesystem::exists(sparse));
  CHECK(again->bytes() == file.bytes.size());
  // A crash between the commit and the removal of the part's files: at the next start the whole
  // blob stays and the part's files go.
  again.reset();
  std::filesystem::copy_file(t.path / "sparse.kept", sparse);
  std::filesystem::copy_file(t.path / "record.kept", record);
  auto restarted = blob_store::open(t.path / "blobs", 64 << 20).value();
  CHECK(restarted->contains(file.whole));
  CHECK(restarted->bytes() == file.bytes.size());
  CHECK_FALSE(std::filesystem::exists(sparse));
  CHECK_FALSE(std::filesystem::exists(record));
}

TEST_CASE("a partial blob is evicted whole when room is needed, never while in use", "[blobs][partial]") {
  temp t;
  const chunked a(3, 10), b(3, 20);
  auto s = blob_store::open(t.path / "blobs", 3 << 20).value();
  REQUIRE(s->open_partial(a.whole, a.bytes.size(), a.list));
  REQUIRE(s->put_chunk(a.whole, 0, a.chunk(0)));
  REQUIRE(s->put_chunk(a.whole, 1, a.chunk(1)));
  REQUIRE(s->sync_partial(a.whole));
  {
    auto in_use = s->get_chunks(a.whole, {0, 1});
    REQUIRE(in_use);
    CHECK_FALSE(s->reserve(2 << 20));  // a's 2 MiB are pinned: no room
  }
  REQUIRE(s->reserve(2 << 20));  // now a goes
  CHECK(s->chunk_list_of(a.whole).empty());
  CHECK_FALSE(std::filesystem::exists(t.path / "blobs" / (to_hex(a.whole) + ".sparse")));
  CHECK_FALSE(std::filesystem::exists(t.path / "blobs" / (to_hex(a.whole) + ".chunks")));
  s->unreserve(2 << 20);
  CHECK(s->bytes() == 0);
}
